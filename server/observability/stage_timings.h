// What executors report about their work and the metrics export: where one request's time went,
// and the counters of the CUDA executor's graph cache.
#pragma once

#include <cstdint>

namespace probesidecar::server {

// Where a request's time went, in seconds (0 where a stage does not apply or was not measured),
// and how it ended.
struct ScoreTimings {
  double queue = 0;  // from submission to the executor until a worker thread took it
  // The staging kernel on the GPU (the request's arguments and rows written where the scoring
  // kernels read them; inline activations copied in first): CUDA backend only.
  double staging = 0;
  double kernel = 0;  // scoring itself (GPU time from CUDA events on the CUDA backend)
  const char* kernel_path = "";
  // The request was answered as soon as its work was queued on the GPU (GPU stages not timed).
  bool enqueued = false;
  // Scores written to a device output found NaN or infinite on the GPU (-1: not counted there:
  // host outputs are counted by the service, enqueue-only requests only in the metric).
  int64_t device_non_finite = -1;
};

struct GraphCacheCounters {
  uint64_t entries = 0;
  uint64_t capacity = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t captures = 0;
  uint64_t evictions = 0;

  // Sums another cache's counters into these (a server's slots, or its devices).
  GraphCacheCounters& operator+=(const GraphCacheCounters& o) {
    entries += o.entries;
    capacity += o.capacity;
    hits += o.hits;
    misses += o.misses;
    captures += o.captures;
    evictions += o.evictions;
    return *this;
  }
};

}  // namespace probesidecar::server
