// Prometheus metrics of the service (names follow Prometheus conventions: base units, _total
// counters, probesidecar_ prefix). Exposed on --metrics-listen at /metrics.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <grpcpp/support/status.h>

#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "server/executor.h"

namespace probesidecar::server {

// The RPCs of the service (labels rpc="Score", ...), fixed so that their series exist from the
// first scrape.
enum class Rpc {
  kRegisterBuffer,
  kUnregisterBuffer,
  kListBuffers,
  kOpenSession,
  kLoadProbeSet,
  kUnloadProbeSet,
  kListProbeSets,
  kScore,
  kScoreStream,  // one observation per stream message
  kVerify,
  kServerInfo,
};
inline constexpr int kNumRpcs = 11;
const char* RpcName(Rpc rpc);

struct BuildInfo {
  std::string version;
  std::string git_commit;
  std::string cuda_runtime;
  std::string device;
  std::string backend;
};

// Sampled at scrape time.
struct MetricsState {
  uint64_t registered_buffers = 0;
  uint64_t registered_buffer_bytes = 0;
  uint64_t open_ipc_handles = 0;
  uint64_t probe_sets = 0;
  uint64_t device_memory_bytes = 0;
  GraphCacheCounters graph_cache;
};

class Metrics {
 public:
  Metrics(BuildInfo build, std::function<MetricsState()> state);
  ~Metrics();

  // What the exposer serves.
  std::shared_ptr<prometheus::Collectable> collectable() const;

  // One RPC (or stream message) entered / left the server. `probe_set` and `kernel_path` are ""
  // where they do not apply.
  void RpcStarted(Rpc rpc);
  void RpcFinished(Rpc rpc, grpc::StatusCode code, double seconds, absl::string_view probe_set,
                   absl::string_view kernel_path);
  // The stage breakdown of one successful Score (or ScoreStream message).
  void ScoreStages(absl::string_view probe_set, const ScoreTimings& timings, double total_seconds);
  // A CUDA call failed (the request got INTERNAL).
  void CudaError();

  // The text exposition of everything (what /metrics returns).
  std::string Serialize() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace probesidecar::server
