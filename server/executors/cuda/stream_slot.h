// A stream slot: one CUDA stream with everything a request needs preallocated — the upload block
// (device args + row indices) in pinned and device memory, identity rows for staged activations,
// the scoring workspace, four timing events and a cache of captured graphs. One worker thread of
// the CUDA executor owns each slot; a slot runs one request at a time and is never shared.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kernels/probe_score/probe_score.h"
#include "server/config/config.h"
#include "server/executors/cuda/lru_cache.h"
#include "server/observability/stage_timings.h"
#include "server/probes/probe_set.h"
#include "server/requests/score_job.h"

namespace probesidecar::server {

class StreamSlot {
 public:
  // `device_bytes` counts the device memory the slot holds (shared with the executor).
  StreamSlot(int device, const Config& config, std::atomic<int64_t>* device_bytes);
  ~StreamSlot();
  StreamSlot(const StreamSlot&) = delete;
  StreamSlot& operator=(const StreamSlot&) = delete;

  // Creates the stream, events, staging and workspace (allocates; start-up only).
  absl::Status Init(const Config& config);

  // Scores one job: stage, replay (capturing on first use), wait for the GPU, copy out. Runs on
  // the slot's worker thread.
  absl::Status Run(const ScoreJob& job, ScoreTimings* timings);

  // Captures the graphs of `set` for `bucket` rows ahead of traffic (activations staged and from
  // IPC buffers, scores to the host).
  absl::Status Warmup(const std::shared_ptr<const ProbeSet>& set, int32_t bucket);

  // Readable from any thread (metrics scrapes, ServerInfo), also while the slot runs.
  GraphCacheCounters counters() const;

 private:
  // A graph is specific to a probe set instance, a kernel path, a dtype, a row bucket and where
  // the activations come from / the scores go (those decide which copies the graph contains).
  struct GraphKey {
    uint64_t probe_set_id;
    kernels::ProbeScorePath path;
    common::DType dtype;
    int32_t bucket;
    bool inline_x;  // activations staged from the request (else read from an IPC buffer)
    bool host_out;  // scores copied back to the host (else written to an IPC buffer)
    bool timed;     // with CUDA event nodes around the stages
    auto Tie() const {
      return std::tie(probe_set_id, path, dtype, bucket, inline_x, host_out, timed);
    }
    bool operator<(const GraphKey& other) const { return Tie() < other.Tie(); }
  };
  struct GraphEntry {
    cudaGraphExec_t exec = nullptr;
    std::weak_ptr<const ProbeSet> probe_set;  // a graph is dropped once its set is gone
  };
  // A device (or pinned host) buffer that grows on demand; growing drops the graphs that baked
  // the old address in.
  struct Staging {
    void* ptr = nullptr;
    size_t bytes = 0;
  };

  GraphKey KeyFor(const ProbeSet& set, common::DType dtype, int32_t bucket, bool inline_x,
                  bool host_out, bool timed) const;
  // Grows the staging that a graph of `key` copies through. Growing drops the cached graphs, so
  // this comes before GraphFor.
  cudaError_t ReserveFor(const GraphKey& key, int32_t hidden, int32_t probes);
  // Grows a pinned + device staging pair to at least `bytes`.
  cudaError_t Reserve(Staging& host, Staging& device, size_t bytes);
  // The cached graph of `key`, captured on a miss.
  absl::StatusOr<GraphEntry*> GraphFor(const GraphKey& key,
                                       const std::shared_ptr<const ProbeSet>& set);
  absl::StatusOr<cudaGraphExec_t> Capture(const GraphKey& key, const kernels::ProbeWeights& weights,
                                          kernels::Activation activation);
  // Drops graphs whose probe set is gone (unloaded or replaced, and no request holds it).
  void DropStaleGraphs();
  // Publishes the cache's counters for counters() (after each operation).
  void PublishCounters();

  const int device_;
  const int32_t max_bucket_;
  const uint32_t timing_every_;
  uint64_t requests_ = 0;
  std::atomic<int64_t>* const device_bytes_;
  cudaStream_t stream_ = nullptr;
  cudaEvent_t events_[4] = {nullptr, nullptr, nullptr, nullptr};  // start, h2d, kernel, d2h
  size_t upload_bytes_ = 0;
  char* h_upload_ = nullptr;  // pinned: ProbeScoreDeviceArgs, then int32 rows [max_bucket]
  char* d_upload_ = nullptr;
  int32_t* d_identity_rows_ = nullptr;  // 0, 1, 2 ... for staged activations
  Staging h_x_, d_x_;                   // staged activation rows [bucket, H]
  Staging h_out_, d_out_;               // scores [bucket, P]
  kernels::ProbeScoreWorkspace* workspace_ = nullptr;
  LruCache<GraphKey, GraphEntry> graphs_;
  std::atomic<uint64_t> captures_{0};
  std::atomic<uint64_t> entries_{0}, hits_{0}, misses_{0}, evictions_{0};
};

}  // namespace probesidecar::server
