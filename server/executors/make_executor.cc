#include "server/executors/make_executor.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/executors/cpu/cpu_executor.h"
#include "server/executors/cuda/cuda_executor.h"
#include "server/executors/multi_device_executor.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

// One executor per device of --devices (all: every device the process sees); the device's own
// executor alone when there is one, so that one device is served exactly as before.
absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutors(const Config& config) {
  std::vector<int> devices = config.devices;
  if (config.all_devices) {
    absl::StatusOr<int> count = CudaDeviceCount();
    if (!count.ok()) return count.status();
    devices.clear();
    for (int d = 0; d < *count; ++d) devices.push_back(d);
  }
  std::vector<std::unique_ptr<Executor>> executors;
  for (int device : devices) {
    Config one = config;
    one.all_devices = false;
    one.devices = {device};
    one.device = device;
    absl::StatusOr<std::unique_ptr<Executor>> executor = CreateCudaExecutor(one);
    if (!executor.ok()) return executor.status();
    executors.push_back(std::move(*executor));
  }
  if (executors.size() == 1) return std::move(executors.front());
  LogInfo("serving CUDA devices %s: one executor each (%d stream slots per device)",
          absl::StrJoin(devices, ", "), config.cuda_workers);
  return std::unique_ptr<Executor>(
      std::make_unique<MultiDeviceExecutor>(std::move(devices), std::move(executors)));
}

absl::StatusOr<std::unique_ptr<Executor>> MakeBackend(const Config& config) {
  if (config.backend != Backend::kCpu) {
    absl::StatusOr<std::unique_ptr<Executor>> cuda = CreateCudaExecutors(config);
    if (cuda.ok()) return cuda;
    // A GPU this build holds no code for (FAILED_PRECONDITION) stops `auto` too: serving it on
    // the CPU would fail its first GPU request instead of the start.
    if (config.backend == Backend::kCuda ||
        cuda.status().code() == absl::StatusCode::kFailedPrecondition) {
      return absl::FailedPreconditionError(
          absl::StrCat("--backend ", config.backend == Backend::kCuda ? "cuda" : "auto", ": ",
                       cuda.status().message()));
    }
    LogInfo("backend auto: using the CPU backend (%s)", cuda.status().message());
  }
  return std::unique_ptr<Executor>(
      std::make_unique<CpuExecutor>(config.cpu_threads, config.max_queued_requests));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config) {
  return MakeBackend(config);
}

}  // namespace probesidecar::server
