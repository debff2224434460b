#include "server/executors/cuda/device_memory_ledger.h"

#include <utility>

namespace probesidecar::server {

void DeviceMemoryLedger::FreeOn(WorkerPool* pool) {
  absl::MutexLock lock(&mu_);
  pool_ = pool;
}

void DeviceMemoryLedger::Abandon() {
  absl::MutexLock lock(&mu_);
  abandoned_ = true;
}

void DeviceMemoryLedger::Free(absl::AnyInvocable<void() &&> free) {
  absl::MutexLock lock(&mu_);
  if (abandoned_) return;
  if (pool_ == nullptr) {
    std::move(free)();
    return;
  }
  // Worker 0 runs it before its next request; refused (shutting down): runs here, now.
  pool_->SubmitTo(0, [free = std::move(free)](int) mutable { std::move(free)(); });
}

}  // namespace probesidecar::server
