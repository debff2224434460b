// A stream slot's captured probe-scoring graphs: a bounded LRU map from what a graph is specific
// to (GraphKey) to the instantiated graph and the kernel path the dispatcher chose when it was
// captured, so that a request that finds its graph runs neither capture nor dispatch. Counters
// readable from any thread; everything else on the slot's worker thread.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <tuple>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "common/dtype.h"
#include "kernels/probe_score/probe_score.h"
#include "server/executors/cuda/lru_cache.h"
#include "server/observability/stage_timings.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

// Where a graph's row indices come from.
enum class RowSource : int8_t {
  kParams,    // the staging kernel's parameters (host rows, R <= kMaxInlineRows)
  kStaged,    // host rows copied to the device before the graph (R > kMaxInlineRows)
  kDevice,    // the client's device buffer: checked on the GPU, invalid rows poisoned
  kIdentity,  // 0..R-1 over staged inline activations
};

// A graph is specific to a probe set instance, a dtype, a row bucket, where the activations and
// rows come from, whether it carries timing events, and whether it ends with the outcome count's
// pass over the scores. (The kernel path follows from those and the set's precision: it is
// chosen once, at capture.)
struct GraphKey {
  uint64_t probe_set_id;
  common::DType dtype;
  int32_t bucket;
  bool inline_x;  // activations staged from the request (else read from an IPC buffer)
  RowSource rows;
  bool timed;  // with CUDA event nodes around the stages
  // With the count kernel (kernels/probe_outcomes): it counts the set's outcomes, copies scores
  // bound for the response to the host and publishes a synchronous answer's non-finite count;
  // left out only where none of that is wanted (a set not counted, scores left on the device,
  // the answer not waiting for them).
  bool count = true;
  auto Tie() const { return std::tie(probe_set_id, dtype, bucket, inline_x, rows, timed, count); }
  bool operator<(const GraphKey& other) const { return Tie() < other.Tie(); }
};

struct GraphEntry {
  cudaGraph_t graph = nullptr;  // kept: node updates name its nodes
  cudaGraphExec_t exec = nullptr;
  cudaGraphNode_t stage_node = nullptr;
  kernels::ProbeScorePath path{};           // the dispatcher's choice, made at capture
  std::weak_ptr<const ProbeSet> probe_set;  // a graph is dropped once its set is gone
};

class GraphCache {
 public:
  explicit GraphCache(size_t capacity);
  GraphCache(const GraphCache&) = delete;
  GraphCache& operator=(const GraphCache&) = delete;

  // The stream whose queued launches may still use a graph: destroying one waits for it first.
  void SetStream(cudaStream_t stream) { stream_ = stream; }

  // The graph of `key`; on a miss, graphs of sets that are gone are dropped, then `capture` makes
  // one, kept for as long as `set` lives.
  using Capture = absl::FunctionRef<absl::StatusOr<GraphEntry>()>;
  absl::StatusOr<GraphEntry*> FindOrCapture(const GraphKey& key,
                                            const std::shared_ptr<const ProbeSet>& set,
                                            Capture capture);
  // Drops every graph (e.g. a staging buffer they copy through moved).
  void Clear();

  GraphCacheCounters counters() const;

 private:
  void Publish();

  cudaStream_t stream_ = nullptr;
  LruCache<GraphKey, GraphEntry> graphs_;
  std::atomic<uint64_t> captures_{0};
  std::atomic<uint64_t> entries_{0}, hits_{0}, misses_{0}, evictions_{0};
};

}  // namespace probesidecar::server
