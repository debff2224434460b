// Score (probe scoring) on one stream slot's stream, with everything a request needs
// preallocated: the device block the staging kernel writes a request's arguments and rows into,
// pinned host memory mapped into the device for inline scores and staged inline activations, the
// scoring workspace, timing events and a cache of captured graphs.
//
// A graph is: [event] staging kernel (its parameters carry the request's argument block and up to
// kMaxInlineRows row indices, updated per request on the instantiated graph) -> [copy of staged
// inline activations] -> [event] scoring kernels -> [poison kernel for rows found invalid on the
// device] -> probe-outcome count (kernels/probe_outcomes: fired, non-finite and the score
// histogram into the set's device counters of the request's label slot; it also copies scores
// meant for the response from the slot's device output into mapped host memory, so a graph has no
// device-to-host copy either) -> [event].
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "kernels/probe_score/probe_score.h"
#include "kernels/request_staging/request_staging.h"
#include "server/config/config.h"
#include "server/executors/cuda/graph_cache.h"
#include "server/executors/cuda/staging_buffer.h"
#include "server/executors/cuda/stream_slot.h"
#include "server/observability/stage_timings.h"
#include "server/probes/probe_set.h"
#include "server/requests/score_job.h"

namespace probesidecar::server {

class ScoreRunner {
 public:
  // Runs on `slot`'s stream. `device_bytes` counts the device memory the runner holds (shared
  // with the executor).
  ScoreRunner(StreamSlot* slot, const Config& config, std::atomic<int64_t>* device_bytes);
  ~ScoreRunner();
  ScoreRunner(const ScoreRunner&) = delete;
  ScoreRunner& operator=(const ScoreRunner&) = delete;

  // Creates the events, staging and workspace (allocates; start-up only).
  absl::Status Init(const Config& config);

  // Scores one job on the slot's stream, capturing its graph on first use. Waits for the GPU
  // unless the job is enqueue-only (then `*enqueued` is set and the job's leases are kept until
  // the GPU has finished; the job itself may go away at once). The wait ends at the job's
  // deadline or when its caller goes (StreamSlot::FinishOnGpu). Runs on the slot's worker thread,
  // on an idle slot.
  absl::Status Run(const ScoreJob& job, ScoreTimings* timings, bool* enqueued);

  // Captures the graphs of `set` for `bucket` rows ahead of traffic (activations staged and from
  // IPC buffers, bf16, rows from the request).
  absl::Status Warmup(const std::shared_ptr<const ProbeSet>& set, int32_t bucket);

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

  StreamSlot* const slot_;
  const int device_;
  const cudaStream_t stream_;
  const int32_t max_bucket_;
  const uint32_t timing_every_;
  uint64_t requests_ = 0;
  std::atomic<int64_t>* const device_bytes_;
  cudaEvent_t events_[3] = {nullptr, nullptr, nullptr};  // start, staged, scored
  StagedArgs* d_args_ = nullptr;                         // the staged argument block
  int32_t* d_rows_ = nullptr;                            // [max_bucket] staged rows
  uint8_t* d_invalid_ = nullptr;                         // [max_bucket] rows found invalid
  int32_t* d_identity_rows_ = nullptr;                   // 0, 1, 2 ... for staged activations
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
};

}  // namespace probesidecar::server
