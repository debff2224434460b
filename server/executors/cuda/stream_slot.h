// A stream slot: one CUDA stream with everything a request needs preallocated — the device block
// the staging kernel writes a request's arguments and rows into, pinned host memory mapped into
// the device for inline scores and staged inline activations, the scoring workspace, timing
// events and a cache of captured graphs. One worker thread of the CUDA executor owns each slot; a
// slot is never shared.
//
// A graph is: [event] staging kernel (its parameters carry the request's argument block and up to
// kMaxInlineRows row indices, updated per request on the instantiated graph) -> [copy of staged
// inline activations] -> [event] scoring kernels -> [poison kernel for rows found invalid on the
// device] -> probe-outcome count (kernels/probe_outcomes: fired, non-finite and the score
// histogram into the set's device counters of the request's label slot; it also copies scores
// meant for the response from the slot's device output into mapped host memory, so a graph has no
// device-to-host copy either) -> [event].
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
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "kernels/probe_score/probe_score.h"
#include "kernels/request_staging/request_staging.h"
#include "server/config/config.h"
#include "server/executors/cuda/graph_cache.h"
#include "server/executors/cuda/score_fault_hook.h"
#include "server/executors/cuda/staging_buffer.h"
#include "server/observability/stage_timings.h"
#include "server/probes/probe_set.h"
#include "server/requests/request_lifetime.h"
#include "server/requests/score_job.h"

namespace probesidecar::server {

class StreamSlot {
 public:
  // What the GPU's work for a request keeps open until it is done: the leases on its buffers and
  // events, and its probe set (the weights the kernels read).
  using GpuLeases = std::vector<std::shared_ptr<const void>>;
  // Asks the slot's worker thread to call DrainCompleted() soon. Called from CUDA's host-callback
  // thread: it must not call CUDA (queueing work for the worker is fine).
  using Nudge = absl::AnyInvocable<void()>;

  // `device_bytes` counts the device memory the slot holds (shared with the executor); once
  // `*stopping` is true, waits for the GPU give up (the server is stopping).
  StreamSlot(int device, const Config& config, std::atomic<int64_t>* device_bytes, Nudge nudge,
             const std::atomic<bool>* stopping);
  ~StreamSlot();
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;

  // Creates the stream, events, staging and workspace (allocates; start-up only).
  absl::Status Init(const Config& config);

  // Scores one job on the slot's stream, capturing its graph on first use. Waits for the GPU
  // unless the job is enqueue-only (then `*enqueued` is set and the job's GpuLeases are kept until
  // the GPU has finished; the job itself may go away at once). The wait ends at the job's
  // deadline or when its caller goes (FinishOnGpu). Runs on the slot's worker thread, on an idle
  // slot. TEST-ONLY: `inject_fault` (score_fault_hook.h), when set, is enqueued first.
  absl::Status Run(const ScoreJob& job, ScoreTimings* timings, bool* enqueued,
                   FaultLaunch inject_fault = nullptr);

  // Marks the end of the work queued so far and waits for the GPU to get there: OK then;
  // DEADLINE_EXCEEDED or CANCELLED when `lifetime` ends first, UNAVAILABLE when the server
  // stops first: the work stays queued (a stream cannot be interrupted), `leases` are kept until
  // the GPU is done with it, and the slot is not idle until then. INTERNAL: a CUDA error.
  absl::Status FinishOnGpu(const RequestLifetime& lifetime, GpuLeases leases);

  // Waits on the host until the client's `ready` event has completed, before anything of its
  // request is queued: OK then; DEADLINE_EXCEEDED or CANCELLED when `lifetime` ends first,
  // UNAVAILABLE when the server stops first, INTERNAL for a CUDA error. No stream of the server
  // ever waits on the GPU for a client: one that is stuck or gone would hold that stream (its
  // slot, and the request's buffers) for as long as that lasts, and under MPS such a wait slowed
  // the client's own work (docs/mps.md).
  absl::Status AwaitClientEvent(cudaEvent_t ready, const RequestLifetime& lifetime) const;

 private:
  // Polls `event` on the host until it completes (OK), a CUDA error (INTERNAL), or `lifetime`
  // ends or the server stops (that status); yields through `spin`, then sleeps.
  absl::Status PollEvent(cudaEvent_t event, const RequestLifetime& lifetime,
                         std::chrono::microseconds spin, const char* what) const;

 public:
  // No work of this slot is pending on the GPU (a CUDA error counts as idle: the next request
  // sees it).
  bool Idle() const;
  // The executor's bookkeeping of a slot whose worker takes no new requests until Idle: when it
  // was parked, and whether that was warned about.
  void SetParked(bool parked);
  bool parked() const { return parked_.load(std::memory_order_acquire); }
  double parked_seconds() const;
  bool TakeParkWarning();  // true once per parking, past the first call

  // Captures the graphs of `set` for `bucket` rows ahead of traffic (activations staged and from
  // IPC buffers, bf16, rows from the request).
  absl::Status Warmup(const std::shared_ptr<const ProbeSet>& set, int32_t bucket);

  // Releases the leases of enqueue-only requests the GPU has finished (worker thread).
  void DrainCompleted();
  // Waits until the stream is idle, then releases what it held (shutdown); false when
  // `deadline` came first (the stream still waits on the GPU: its resources must not be freed).
  bool QuiesceBy(absl::Time deadline);

  // The slot's stream (other work of the same worker, e.g. Verify, runs on it too).
  cudaStream_t stream() const { return stream_; }

  // Readable from any thread (metrics scrapes, ServerInfo), also while the slot runs.
  GraphCacheCounters counters() const;
  // Row indices found outside [0, T) on the GPU so far (device rows).
  uint64_t invalid_rows() const;
  // NaN or infinite scores written to device outputs (counted on the GPU), as of the last copy
  // (CopyNonFiniteTotal, then PublishNonFiniteTotal: the device monitor's).
  uint64_t non_finite_scores() const;
  // Enqueues the copy of the device's running total into `host` (pinned) on `stream`.
  cudaError_t CopyNonFiniteTotal(uint64_t* host, cudaStream_t stream) const;
  void PublishNonFiniteTotal(uint64_t total) {
    non_finite_copied_.store(total, std::memory_order_relaxed);
  }

 private:
  // The device block the staging kernel writes: the scoring kernels' arguments, then what the
  // poison kernel and the outcome count read.
  struct StagedArgs {
    kernels::ProbeScoreDeviceArgs score;
    kernels::PoisonDescriptor poison;
    kernels::ProbeOutcomeDescriptor outcomes;
  };
  static_assert(sizeof(StagedArgs) <= kernels::kMaxStagedArgsBytes);

  static RowSource RowSourceOf(const ScoreJob& job);
  // Grows the activation staging that graphs of `key` copy through; growing drops the graphs
  // (they hold its address), so this comes before GraphFor.
  cudaError_t ReserveFor(const GraphKey& key, int32_t hidden);
  // The cached graph of `key`, captured on a miss (the dispatcher chooses its kernel path then).
  absl::StatusOr<GraphEntry*> GraphFor(const GraphKey& key,
                                       const std::shared_ptr<const ProbeSet>& set);
  absl::StatusOr<GraphEntry> Capture(const GraphKey& key, const ProbeSet& set);
  // The staging kernel's parameters for `job` (writes the argument block and rows); `counters`:
  // the outcome counters of its set and label slot on this device (nullptr: not counted);
  // `publish_non_finite`: the request's non-finite count is wanted in its answer.
  void FillStageParams(const ScoreJob& job, const GraphKey& key, unsigned long long* counters,
                       bool publish_non_finite);
  // Keeps `leases` until the work queued so far on the stream has finished.
  absl::Status HoldUntilDone(GpuLeases leases);
  static void CUDART_CB OnStreamDone(void* data);

  const int device_;
  const int32_t max_bucket_;
  const uint32_t timing_every_;
  const std::atomic<bool>* const stopping_;
  uint64_t requests_ = 0;
  std::atomic<int64_t>* const device_bytes_;
  Nudge nudge_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[3] = {nullptr, nullptr, nullptr};  // start, staged, scored
  cudaEvent_t completion_ = nullptr;     // recorded after each request's work (FinishOnGpu, async)
  StagedArgs* d_args_ = nullptr;         // the staged argument block
  int32_t* d_rows_ = nullptr;            // [max_bucket] staged rows
  uint8_t* d_invalid_ = nullptr;         // [max_bucket] rows found invalid
  int32_t* d_identity_rows_ = nullptr;   // 0, 1, 2 ... for staged activations
  uint32_t* h_invalid_ = nullptr;        // mapped [2]: invalid rows so far, and in the last request
  uint32_t* d_invalid_alias_ = nullptr;  // its device address
  uint32_t* h_non_finite_ = nullptr;     // mapped [1]: non-finite scores of the last synchronous
                                         // request with a device output (the count publishes it)
  uint32_t* d_non_finite_alias_ = nullptr;  // its device address
  // [1] device: non-finite scores written to device outputs so far (the count adds to it; the
  // device monitor copies it with the outcome counters: non_finite_scores).
  unsigned long long* d_non_finite_total_ = nullptr;
  std::atomic<uint64_t> non_finite_copied_{0};
  uint32_t* d_count_scratch_ = nullptr;   // [2] the outcome count's scratch
  StagingBuffer h_rows_, d_rows_staged_;  // host rows past kMaxInlineRows, and their device copy
  StagingBuffer h_x_, d_x_;               // staged activation rows [bucket, H]
  // Scores for the response [R, P]: written by the scoring kernels on the device, copied into the
  // mapped host buffer by the outcome count as it reads them.
  StagingBuffer d_out_, h_out_;
  std::unique_ptr<kernels::StageRequestParams> stage_;  // ~4 KB, reused per request
  kernels::OutcomeLaunch outcome_launch_ = kernels::OutcomeLaunch::kStreamOrder;
  kernels::ProbeScoreWorkspace* workspace_ = nullptr;
  GraphCache graphs_;
  // Leases of enqueue-only requests whose work the GPU has finished (filled on CUDA's callback
  // thread, released on the worker thread).
  absl::Mutex done_mu_;
  std::vector<GpuLeases> done_ ABSL_GUARDED_BY(done_mu_);
  std::vector<GpuLeases> never_released_;  // leases whose host callback could not be queued
  std::atomic<bool> parked_{false};
  std::atomic<int64_t> parked_at_ns_{0};  // absl::GetCurrentTimeNanos() when parked
  std::atomic<bool> park_warned_{false};
};

}  // namespace probesidecar::server
