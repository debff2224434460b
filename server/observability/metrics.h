// Prometheus metrics of the service (names follow Prometheus conventions: base units, _total
// counters, probesidecar_ prefix). Exposed on --metrics-listen at /metrics.
//
// Recording is on every request's path, so it is built for it: counters, gauges and histograms
// are striped over per-thread shards of relaxed atomics (no lock, no shared cache line between
// threads that record at the same time) and summed at scrape time. Labelled series are found
// without a lock, through a table that only ever grows. Everything one Score records costs
// ~0.2 µs of CPU, also with 16 threads recording at once (bench/results/metrics_observe.md).
//
// The families (every one is present from the first scrape; labelled series appear when first
// recorded, except rpc_requests_total{code="OK"} and rpc_in_flight, which exist for every RPC):
//
//   probesidecar_rpc_requests_total{rpc,code}                      counter
//   probesidecar_rpc_in_flight{rpc}                                 gauge
//   probesidecar_rpc_duration_seconds{rpc,probe_set,kernel_path}    histogram
//   probesidecar_score_stage_duration_seconds{stage,probe_set,kernel_path}  histogram
//       stage: queue, staging (CUDA backend), kernel (GPU time from CUDA events on the CUDA
//       backend), total
//   probesidecar_cuda_errors_total                                  counter
//   probesidecar_non_finite_scores_total                            counter (responses, plus
//       MetricsState.executor.non_finite_device_scores: device outputs, counted on the GPU)
//   probesidecar_shadow_rel_l2_error                                histogram (kErrorBucketBounds)
//   probesidecar_shadow_mismatched_requests_total                   counter
//   probesidecar_registered_buffers{device}, probesidecar_registered_buffer_bytes{device},
//   probesidecar_ipc_handles_open{device}, probesidecar_probe_sets_loaded,
//   probesidecar_device_memory_bytes{device}, probesidecar_executor_queued_requests,
//   probesidecar_executor_queue_capacity, probesidecar_mps_client,
//   probesidecar_stream_slots_parked{device},
//   probesidecar_graph_cache_entries{device},
//   probesidecar_graph_cache_capacity{device},
//   probesidecar_device_up{device}                                  gauges (MetricsState)
//   probesidecar_graph_cache_{hits,misses,captures,evictions}_total{device},
//   probesidecar_invalid_device_rows_total,
//   probesidecar_invalid_verify_requests_total,
//   probesidecar_probe_set_load_errors_total,
//   probesidecar_executor_{expired,cancelled}_requests_total        counters (MetricsState)
//   probesidecar_build_info{version,git_commit,cuda_runtime,device,backend}  gauge, value 1
//   probesidecar_start_time_seconds                                 gauge (Unix time)
//
// What the probes found (MetricsState.probe_outcomes: counted on the GPU or by the CPU backend,
// sampled at scrape time), labelled probe_set, probe and the session labels (MetricsState.
// session_labels, e.g. model, replica):
//   probesidecar_probe_set_rows_scored_total{probe_set,<session labels>}  counter
//   probesidecar_probe_scored_total{probe_set,probe,<session labels>}     counter
//   probesidecar_probe_fired_total{probe_set,probe,<session labels>}      counter
//   probesidecar_probe_non_finite_scores_total{probe_set,probe,<...>}     counter
//   probesidecar_probe_score{probe_set,probe,<session labels>}            histogram of the finite
//       scores over the set's bounds (ProbeSet::score_bounds)
// probe is a probe's name, or "_all" for every probe of a set with more than --max-probe-labels
// probes; the session labels are those a session declared ("" for none, "_other" past
// --max-session-label-sets).
//
// {device}: one series per served CUDA device, device="<ordinal>" (MetricsState.devices); on the
// CPU backend one series without the label (and no probesidecar_device_up).
//
// Label cardinality is bounded: rpc, code and stage are fixed sets; probe_set must be "" or the
// name of a loaded set (callers pass "" for names a client made up), kernel_path one of the
// executor's constants; past kMaxLabelledSeries (probe_set, kernel_path) pairs, further pairs are
// recorded as probe_set="_other".
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "prometheus/collectable.h"
#include "server/observability/executor_stats.h"
#include "server/observability/stage_timings.h"

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
  kRegisterEvent,
  kUnregisterEvent,
};
inline constexpr int kNumRpcs = 13;
const char* RpcName(Rpc rpc);

// The stages of a Score (label stage="queue", ...).
enum class Stage {
  kQueue,    // submitted until a worker took it
  kStaging,  // the staging kernel on the GPU (CUDA backend): ScoreTimings::staging
  kKernel,   // scoring itself: GPU time between CUDA events on the CUDA backend
  kTotal,    // the whole request, server side
};
inline constexpr int kNumStages = 4;
const char* StageName(Stage stage);

// Upper bounds (seconds) of the latency histograms' buckets, +Inf not included: 1 µs to 1 s,
// dense where the stages of a Score fall (a few µs to a few ms). Each prints exactly in the
// exposition's le="..." (prometheus-cpp writes 16 significant digits: 7.5e-05 would not).
inline constexpr std::array<double, 33> kLatencyBucketBounds = {
    1e-6, 2.5e-6, 5e-6, 7.5e-6,                              // µs
    1e-5, 1.5e-5, 2e-5, 2.5e-5, 3e-5, 4e-5,   5e-5, 6e-5,    // tens of µs
    1e-4, 1.5e-4, 2e-4, 2.5e-4, 3e-4, 4e-4,   5e-4, 7.5e-4,  // hundreds of µs
    1e-3, 1.5e-3, 2e-3, 3e-3,   5e-3, 7.5e-3,                // ms
    1e-2, 2.5e-2, 5e-2, 0.1,    0.25, 0.5,    1.0};

// Upper bounds of the shadow-mode error histogram (relative L2 error of our Verify output against
// the caller's), +Inf not included: bf16 agreement is around 1e-3.
inline constexpr std::array<double, 12> kErrorBucketBounds = {1e-6, 1e-5, 1e-4, 3e-4, 1e-3, 3e-3,
                                                              1e-2, 3e-2, 0.1,  0.3,  1.0,  10.0};

// Distinct (probe_set, kernel_path) label pairs kept before new ones fold into "_other".
inline constexpr int kMaxLabelledSeries = 256;

struct BuildInfo {
  std::string version;
  std::string git_commit;
  std::string cuda_runtime;
  std::string device;
  std::string backend;
};

// One served CUDA device, sampled at scrape time (its series carry device="<ordinal>"): the
// executor's report of it and the IPC registry's counters there.
struct DeviceMetricsState {
  DeviceReport executor;  // up while executor.failure is empty
  uint64_t registered_buffers = 0;
  uint64_t registered_buffer_bytes = 0;
  uint64_t open_ipc_handles = 0;
};

// One probe's outcome series (or a whole set's, probe == kAllProbes), under one set of session
// label values.
struct ProbeOutcomeSeries {
  std::string probe;
  uint64_t scored = 0;  // scores computed (rows scored, times the probes folded in)
  uint64_t fired = 0;
  uint64_t non_finite = 0;
  std::vector<uint64_t> buckets;  // finite scores per bucket, not cumulative: [bounds + 1]
  double sum = 0;                 // of the finite scores
};

// A probe set's outcome series under one set of session label values.
struct ProbeSetOutcomeSeries {
  std::string probe_set;
  std::vector<std::string> label_values;  // one per MetricsState::session_labels
  std::vector<double> bounds;             // the histogram's upper bounds (+Inf not included)
  uint64_t rows = 0;
  std::vector<ProbeOutcomeSeries> probes;
};

// The probe label of a set's series when it has more probes than are labelled by name.
inline constexpr char kAllProbes[] = "_all";

// Sampled at scrape time (the callback runs on the exposer's thread, once per scrape).
struct MetricsState {
  // The executor's totals (Executor::stats; its devices' reports are in `devices` below).
  ExecutorStats executor;
  uint64_t registered_buffers = 0;       // buffer windows (RegisterBuffer) currently registered
  uint64_t registered_buffer_bytes = 0;  // their byte_size, summed
  uint64_t open_ipc_handles = 0;         // distinct allocations opened with cudaIpcOpenMemHandle
  uint64_t probe_sets = 0;
  uint64_t probe_set_load_errors = 0;  // files of the probes directory skipped at start
  // Per served device (CUDA backend): the device-labelled series of the buffer, memory, stream
  // slot and graph cache families, and probesidecar_device_up. Empty (the CPU backend): those
  // families are one unlabelled series each, from the totals above.
  std::vector<DeviceMetricsState> devices;
  // Probe outcomes: the session label names (the labels after probe_set and probe), and a group
  // of series per probe set and set of session label values that scored anything.
  std::vector<std::string> session_labels;
  std::vector<ProbeSetOutcomeSeries> probe_outcomes;
};

class Metrics {
 public:
  Metrics(BuildInfo build, std::function<MetricsState()> state);
  ~Metrics();
  Metrics(const Metrics&) = delete;
  Metrics& operator=(const Metrics&) = delete;

  // What the exposer serves (it shares the recorded values; the state callback must stay
  // callable while the exposer can scrape).
  std::shared_ptr<prometheus::Collectable> collectable() const;

  // One RPC (or stream message) entered / left the server. `probe_set` and `kernel_path` are ""
  // where they do not apply. Thread-safe, lock-free.
  void RpcStarted(Rpc rpc);
  void RpcFinished(Rpc rpc, absl::StatusCode code, double seconds, absl::string_view probe_set,
                   absl::string_view kernel_path);

  // The stage breakdown of one successful Score (or ScoreStream message): each stage of
  // `timings` that is > 0 (0 means "does not apply" or "not measured": staging on the CPU
  // backend, GPU times of a request that --gpu-timing-every did not time or that was answered
  // once queued), and `total_seconds` as stage "total".
  void ScoreStages(absl::string_view probe_set, const ScoreTimings& timings, double total_seconds);

  // A CUDA call failed (the request got INTERNAL).
  void CudaError();

  // Scores returned in a response that were NaN or infinite.
  void NonFiniteScores(uint64_t count);

  // One shadow-mode Verify: its relative L2 error and whether any element was beyond the
  // tolerance. Low rate: takes a lock.
  void ShadowCompared(double rel_l2_error, bool mismatched);

  // The text exposition of everything (what /metrics returns).
  std::string Serialize() const;

 private:
  class Impl;
  std::shared_ptr<Impl> impl_;
};

}  // namespace probesidecar::server
