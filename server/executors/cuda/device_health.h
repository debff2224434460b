// Whether a CUDA executor's device context is still usable. After a sticky error (an illegal
// address, a kernel fault, an uncorrectable ECC error...) nothing completes on the context again:
// the executor is then lost for good, every request fails with the reason, and the owner is told
// once. Non-sticky errors (an out-of-memory, a bad argument) leave the context usable.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace probesidecar::server {

class DeviceHealth {
 public:
  // `on_lost` is called once, on the thread that finds the context lost, with LostStatus().
  DeviceHealth(int device, absl::AnyInvocable<void(const absl::Status&)> on_lost);
  ~DeviceHealth();
  DeviceHealth(const DeviceHealth&) = delete;
  DeviceHealth& operator=(const DeviceHealth&) = delete;

  // The probe stream and event the check records on (nothing else runs there but what
  // OnProbeStream runs).
  absl::Status Init();

  bool lost() const { return lost_.load(); }
  // UNAVAILABLE with the first error seen, once lost.
  absl::Status LostStatus() const;

  // Whether the context is unusable: after clearing this thread's last error, work enqueued on a
  // stream of its own still fails. Marks it lost (once) when it is, with `seen` as the first sign
  // (or the check's own error when `seen` is OK). (The executor's streams are not queried: one may
  // be capturing a graph, and a query would break the capture.)
  bool CheckContext(const absl::Status& seen);

  // A request's status, after a look at the context when it is a CUDA error (INTERNAL): where the
  // context is lost, the status says so; other errors are logged. `what` names the request kind.
  absl::Status Checked(absl::Status status, const char* what);

  // Runs f(stream) on the probe stream, serialised with the checks (e.g. the outcome copy).
  template <typename F>
  cudaError_t OnProbeStream(F&& f) {
    absl::MutexLock lock(&probe_mu_);
    return f(probe_stream_);
  }

 private:
  void MarkLost(const absl::Status& seen, cudaError_t error);

  const int device_;
  absl::AnyInvocable<void(const absl::Status&)> on_lost_;
  absl::Mutex probe_mu_;
  cudaStream_t probe_stream_ = nullptr;
  cudaEvent_t probe_event_ = nullptr;
  std::atomic<bool> lost_{false};
  mutable absl::Mutex lost_mu_;
  absl::Status lost_status_ ABSL_GUARDED_BY(lost_mu_);
};

}  // namespace probesidecar::server
