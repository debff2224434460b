// A stream slot: one CUDA stream of the CUDA executor, and what every request that runs on it
// shares, whatever it is (Score: score_runner.h, Verify: verify_runner.h): the host-side wait for
// the client's ready event, the wait for the GPU to finish, the leases kept until the GPU is done
// with work answered before it ran, and the slot's parking. One worker thread of the executor owns
// each slot with its two runners; a slot is never shared.
//
// A slot takes a request only when its stream is idle (Idle): the work of a request answered
// before the GPU finished it (enqueue-only, or given up at its deadline while the stream still
// waited for the client's ready event) keeps the slot out of service until the GPU is past it, so
// a client whose stream never gets there cannot hold up the requests of others (CudaExecutor
// parks the slot's worker meanwhile).
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/ipc/buffer_lease.h"
#include "server/executors/cuda/score_fault_hook.h"
#include "server/requests/request_lifetime.h"

namespace probesidecar::server {

class StreamSlot {
 public:
  // What the GPU's work for a request keeps open until it is done: the leases on its buffers and
  // events, and its probe set (the weights the kernels read).
  using GpuLeases = std::vector<std::shared_ptr<const void>>;
  // Asks the slot's worker thread to call DrainCompleted() soon. Called from CUDA's host-callback
  // thread: it must not call CUDA (queueing work for the worker is fine).
  using Nudge = absl::AnyInvocable<void()>;

  // Once `*stopping` is true, waits for the GPU give up (the server is stopping).
  StreamSlot(int device, Nudge nudge, const std::atomic<bool>* stopping);
  ~StreamSlot();
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;

  // Creates the stream and its completion event (start-up only).
  absl::Status Init();

  int device() const { return device_; }
  cudaStream_t stream() const { return stream_; }

  // Before anything of a request is queued: waits on the host until the client's `ready` event
  // (if any) has completed, then orders the stream's reads after it. OK then; DEADLINE_EXCEEDED or
  // CANCELLED when `lifetime` ends first, UNAVAILABLE when the server stops first, INTERNAL for a
  // CUDA error. No stream of the server ever waits on the GPU for a client: one that is stuck or
  // gone would hold that stream (its slot, and the request's buffers) for as long as that lasts,
  // and under MPS such a wait slowed the client's own work (docs/mps.md). An armed fault
  // (ArmFault) is enqueued right after.
  absl::Status AwaitClientEvent(const EventLease& ready, const RequestLifetime& lifetime);
  // TEST-ONLY (score_fault_hook.h): the next request's AwaitClientEvent enqueues `launch` on the
  // stream once the client's event has completed, before the request's own work.
  void ArmFault(FaultLaunch launch) { armed_fault_ = launch; }
  // Records the client's `done` event (if any) after the work queued so far.
  absl::Status SignalClientEvent(const EventLease& done) const;

  // Marks the end of the work queued so far and waits for the GPU to get there: OK then;
  // DEADLINE_EXCEEDED or CANCELLED when `lifetime` ends first, UNAVAILABLE when the server
  // stops first: the work stays queued (a stream cannot be interrupted), `leases` are kept until
  // the GPU is done with it, and the slot is not idle until then. INTERNAL: a CUDA error.
  absl::Status FinishOnGpu(const RequestLifetime& lifetime, GpuLeases leases);
  // Marks the end of the work queued so far without waiting: `leases` are kept until the GPU has
  // finished it (an enqueue-only request, answered at once), and the slot is not idle until then.
  absl::Status ReleaseWhenDone(GpuLeases leases);

  // No work of this slot is pending on the GPU (a CUDA error counts as idle: the next request
  // sees it).
  bool Idle() const;
  // The executor's bookkeeping of a slot whose worker takes no new requests until Idle: when it
  // was parked, and whether that was warned about.
  void SetParked(bool parked);
  bool parked() const { return parked_.load(std::memory_order_acquire); }
  double parked_seconds() const;
  bool TakeParkWarning();  // true once per parking, past the first call

  // Releases the leases of requests the GPU has finished (worker thread).
  void DrainCompleted();
  // Waits until the stream is idle, then releases what it held (shutdown); false when
  // `deadline` came first (the stream still waits on the GPU: its resources must not be freed).
  bool QuiesceBy(absl::Time deadline);

 private:
  // Polls `event` on the host until it completes (OK), a CUDA error (INTERNAL), or `lifetime`
  // ends or the server stops (that status); yields through `spin`, then sleeps.
  absl::Status PollEvent(cudaEvent_t event, const RequestLifetime& lifetime,
                         std::chrono::microseconds spin, const char* what) const;
  // Keeps `leases` until the work queued so far on the stream has finished.
  absl::Status HoldUntilDone(GpuLeases leases);
  static void CUDART_CB OnStreamDone(void* data);

  const int device_;
  const std::atomic<bool>* const stopping_;
  Nudge nudge_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t completion_ = nullptr;   // recorded after each request's work
  FaultLaunch armed_fault_ = nullptr;  // TEST-ONLY: ArmFault
  // Leases of requests whose work the GPU has finished (filled on CUDA's callback thread,
  // released on the worker thread).
  absl::Mutex done_mu_;
  std::vector<GpuLeases> done_ ABSL_GUARDED_BY(done_mu_);
  std::vector<GpuLeases> never_released_;  // leases whose host callback could not be queued
  std::atomic<bool> parked_{false};
  std::atomic<int64_t> parked_at_ns_{0};  // absl::GetCurrentTimeNanos() when parked
  std::atomic<bool> park_warned_{false};
};

}  // namespace probesidecar::server
