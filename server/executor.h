// The backend interface: where Score requests run (CPU threads, or a GPU's workers).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "server/probe_set.h"
#include "server/score_job.h"

namespace probesidecar::server {

class BufferRegistry;

// Where a request's time went, in seconds (0 where a stage does not apply).
struct ScoreTimings {
  double queue = 0;   // submitted until a worker took it
  double h2d = 0;     // host-to-device staging
  double kernel = 0;  // scoring itself (GPU time from CUDA events on the CUDA backend)
  double d2h = 0;     // device-to-host copy of the scores
  const char* kernel_path = "";
};

struct GraphCacheCounters {
  uint64_t entries = 0;
  uint64_t capacity = 0;
  uint64_t hits = 0;
  uint64_t misses = 0;
  uint64_t captures = 0;
  uint64_t evictions = 0;
};

using ScoreDone = absl::AnyInvocable<void(absl::Status status, const ScoreTimings& timings) &&>;

class Executor {
 public:
  virtual ~Executor() = default;

  // "cpu" or "cuda".
  virtual const char* backend() const = 0;
  virtual std::string device_name() const = 0;

  // Called once per probe set before it is published (e.g. to upload device weights).
  virtual absl::Status PrepareProbeSet(ProbeSet& set) = 0;

  // The registered IPC buffers; nullptr when the backend has none.
  virtual BufferRegistry* buffers() = 0;

  // Called once a probe set is published: captures its graphs for the configured row buckets.
  virtual void Warmup(const std::shared_ptr<const ProbeSet>& set) {}

  // Runs `job` and calls `done` exactly once, from any thread. `job` stays valid until then.
  virtual void Score(const ScoreJob* job, ScoreDone done) = 0;

  virtual GraphCacheCounters graph_cache() const { return {}; }

  // Bytes of device memory the service holds (0 on the CPU backend).
  virtual uint64_t device_memory_bytes() const { return 0; }

  // Finishes queued work and stops the workers. No Score after this.
  virtual void Shutdown() = 0;
};

}  // namespace probesidecar::server
