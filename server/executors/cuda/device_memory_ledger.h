// The bytes of device memory a CUDA executor holds, and where the memory of a probe set's
// placement is freed. Shared with every placement, which can outlive the executor. cudaFree waits
// for the device, and the last reference to a probe set can drop anywhere (a gRPC thread that
// listed the sets, say), so the free is handed to a worker thread while the executor runs; once it
// has stopped, whoever drops the reference frees; once it has stopped with work still pending on
// the device (or its context lost), nothing is freed: freeing could wait for that work, and the
// memory is left to the process's exit.
#pragma once

#include <atomic>
#include <cstdint>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"
#include "server/executors/worker_pool.h"

namespace probesidecar::server {

class DeviceMemoryLedger {
 public:
  // Device bytes held (every part of the executor adds and subtracts its own).
  std::atomic<int64_t>& bytes() { return bytes_; }
  int64_t held() const { return bytes_.load(); }

  // Where Free runs `free` from now on: on worker 0 of `pool` (before its next request), or,
  // with nullptr, on the caller's thread.
  void FreeOn(WorkerPool* pool);
  // Frees nothing from now on (the executor stopped with work pending on the device).
  void Abandon();

  // Runs `free` as the ledger says: on the pool, here, or not at all.
  void Free(absl::AnyInvocable<void() &&> free);

 private:
  std::atomic<int64_t> bytes_{0};
  absl::Mutex mu_;
  WorkerPool* pool_ ABSL_GUARDED_BY(mu_) = nullptr;
  bool abandoned_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace probesidecar::server
