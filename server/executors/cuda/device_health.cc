#include "server/executors/cuda/device_health.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "server/executors/cuda/cuda_status.h"
#include "server/observability/log.h"

namespace probesidecar::server {

DeviceHealth::DeviceHealth(int device, absl::AnyInvocable<void(const absl::Status&)> on_lost)
    : device_(device), on_lost_(std::move(on_lost)) {}

DeviceHealth::~DeviceHealth() {
  // Left to the process's exit once the context is lost (destroying could wait on it).
  if (lost_.load()) return;
  if (probe_event_ != nullptr) cudaEventDestroy(probe_event_);
  if (probe_stream_ != nullptr) cudaStreamDestroy(probe_stream_);
}

absl::Status DeviceHealth::Init() {
  PS_RETURN_IF_CUDA(cudaSetDevice(device_));
  PS_RETURN_IF_CUDA(cudaEventCreateWithFlags(&probe_event_, cudaEventDisableTiming));
  PS_RETURN_IF_CUDA(cudaStreamCreateWithFlags(&probe_stream_, cudaStreamNonBlocking));
  return absl::OkStatus();
}

absl::Status DeviceHealth::LostStatus() const {
  absl::MutexLock lock(&lost_mu_);
  return lost_status_;
}

bool DeviceHealth::CheckContext(const absl::Status& seen) {
  cudaError_t e = cudaSuccess;
  {
    absl::MutexLock lock(&probe_mu_);
    cudaSetDevice(device_);
    cudaGetLastError();
    e = cudaEventRecord(probe_event_, probe_stream_);
    if (e == cudaSuccess) e = cudaStreamSynchronize(probe_stream_);  // nothing else runs there
    if (e == cudaSuccess) e = cudaEventQuery(probe_event_);
  }
  if (e == cudaSuccess) return false;
  MarkLost(seen.ok() ? CudaStatus(e, "checking the CUDA context") : seen, e);
  return true;
}

absl::Status DeviceHealth::Checked(absl::Status status, const char* what) {
  if (status.code() != absl::StatusCode::kInternal) return status;
  if (lost_.load() || CheckContext(status)) {
    return absl::InternalError(
        absl::StrCat(status.message(), " (the GPU's CUDA context is lost: the server stops)"));
  }
  LogError("CUDA %s failed: %s", what, status.message());
  return status;
}

void DeviceHealth::MarkLost(const absl::Status& seen, cudaError_t error) {
  {
    // The status is set before lost_ can be seen true: whoever reads lost() then LostStatus()
    // gets the reason, never an OK status.
    absl::MutexLock lock(&lost_mu_);
    if (lost_.load()) return;
    lost_status_ = absl::UnavailableError(
        absl::StrCat("the GPU's CUDA context is lost (", cudaGetErrorName(error), ": ",
                     cudaGetErrorString(error), ", first seen in: ", seen.message(),
                     "); this server stops: retry on its replacement"));
    lost_.store(true);
  }
  LogError(
      "the CUDA context of device %d is lost: %s: %s (first seen in: %s). Health reports "
      "NOT_SERVING, every request fails, and the server exits (status 3) for its supervisor to "
      "restart it",
      device_, cudaGetErrorName(error), cudaGetErrorString(error), seen.message());
  if (on_lost_) on_lost_(LostStatus());
}

}  // namespace probesidecar::server
