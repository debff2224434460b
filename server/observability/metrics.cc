#include "server/observability/metrics.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "prometheus/client_metric.h"
#include "prometheus/metric_family.h"
#include "prometheus/text_serializer.h"
#include "server/observability/sharded_counters.h"

namespace probesidecar::server {
namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

constexpr int kNumCodes = 17;  // absl::StatusCode kOk (0) .. kUnauthenticated (16)
constexpr char kOtherProbeSet[] = "_other";

using LatencyHistogram = DurationHistogram<kLatencyBucketBounds>;

int CodeIndex(absl::StatusCode code) {
  const int index = static_cast<int>(code);
  return index >= 0 && index < kNumCodes ? index : static_cast<int>(absl::StatusCode::kUnknown);
}

// The histograms of one (probe_set, kernel_path) pair, each created when first recorded (so
// that, e.g., the GPU-only stages do not appear as empty series on the CPU backend).
class SeriesGroup {
 public:
  SeriesGroup(std::string probe_set, std::string kernel_path, size_t hash)
      : probe_set_(std::move(probe_set)), kernel_path_(std::move(kernel_path)), hash_(hash) {}
  ~SeriesGroup() {
    for (auto& h : rpc_) delete h.load();
    for (auto& h : stage_) delete h.load();
  }
  SeriesGroup(const SeriesGroup&) = delete;
  SeriesGroup& operator=(const SeriesGroup&) = delete;

  bool Is(absl::string_view probe_set, absl::string_view kernel_path, size_t hash) const {
    return hash_ == hash && probe_set_ == probe_set && kernel_path_ == kernel_path;
  }
  LatencyHistogram& ForRpc(Rpc rpc) { return GetOrCreate(rpc_[static_cast<int>(rpc)]); }
  LatencyHistogram& ForStage(Stage stage) { return GetOrCreate(stage_[static_cast<int>(stage)]); }
  // nullptr until recorded.
  const LatencyHistogram* FindRpc(int rpc) const {
    return rpc_[rpc].load(std::memory_order_acquire);
  }
  const LatencyHistogram* FindStage(int stage) const {
    return stage_[stage].load(std::memory_order_acquire);
  }
  const std::string& probe_set() const { return probe_set_; }
  const std::string& kernel_path() const { return kernel_path_; }

 private:
  static LatencyHistogram& GetOrCreate(std::atomic<LatencyHistogram*>& slot) {
    LatencyHistogram* h = slot.load(std::memory_order_acquire);
    if (h != nullptr) return *h;
    auto fresh = std::make_unique<LatencyHistogram>();
    if (slot.compare_exchange_strong(h, fresh.get(), std::memory_order_acq_rel,
                                     std::memory_order_acquire)) {
      return *fresh.release();
    }
    return *h;  // another thread created it first
  }

  const std::string probe_set_;
  const std::string kernel_path_;
  const size_t hash_;
  std::array<std::atomic<LatencyHistogram*>, kNumRpcs> rpc_{};
  std::array<std::atomic<LatencyHistogram*>, kNumStages> stage_{};
};

// (probe_set, kernel_path) -> its histograms.
using Series = SeriesTable<SeriesGroup>;
static_assert(kMaxLabelledSeries < static_cast<int>(Series::kMaxGroups));

// Per-thread shard of the unlabelled-by-name counters and gauges.
struct alignas(kShardAlign) CounterShard {
  std::array<std::array<std::atomic<uint64_t>, kNumCodes>, kNumRpcs> requests{};
  std::array<std::atomic<int64_t>, kNumRpcs> in_flight{};
  std::atomic<uint64_t> cuda_errors{0};
  std::atomic<uint64_t> non_finite_scores{0};
};

ClientMetric::Label L(std::string name, std::string value) {
  return ClientMetric::Label{std::move(name), std::move(value)};
}

MetricFamily Family(const char* name, const char* help, MetricType type) {
  MetricFamily family;
  family.name = name;
  family.help = help;
  family.type = type;
  return family;
}

void AddValue(MetricFamily& family, double value, std::vector<ClientMetric::Label> labels = {}) {
  ClientMetric metric;
  metric.label = std::move(labels);
  if (family.type == MetricType::Counter) {
    metric.counter.value = value;
  } else {
    metric.gauge.value = value;
  }
  family.metric.push_back(std::move(metric));
}

// The probe-outcome families (MetricsState.probe_outcomes).
void AddProbeOutcomes(const MetricsState& s, std::vector<MetricFamily>& out) {
  MetricFamily rows =
      Family("probesidecar_probe_set_rows_scored_total",
             "Rows a probe set scored (every probe scores each).", MetricType::Counter);
  MetricFamily scored = Family(
      "probesidecar_probe_scored_total",
      "Scores a probe computed, one per row scored (probe=\"_all\": every probe of a set with "
      "more probes than --max-probe-labels); fired / scored is its fire rate.",
      MetricType::Counter);
  MetricFamily fired =
      Family("probesidecar_probe_fired_total", "Finite scores at or above the probe's threshold.",
             MetricType::Counter);
  MetricFamily non_finite =
      Family("probesidecar_probe_non_finite_scores_total",
             "Scores of the probe that were NaN or infinite (they never fire and are not in the "
             "histogram).",
             MetricType::Counter);
  MetricFamily score = Family(
      "probesidecar_probe_score",
      "The probe's finite scores, over its set's bucket bounds (0.05 to 1 for sigmoid sets).",
      MetricType::Histogram);
  for (const ProbeSetOutcomeSeries& set : s.probe_outcomes) {
    std::vector<ClientMetric::Label> session;
    for (size_t k = 0; k < s.session_labels.size() && k < set.label_values.size(); ++k) {
      session.push_back(L(s.session_labels[k], set.label_values[k]));
    }
    auto labels = [&](const std::string* probe) {
      std::vector<ClientMetric::Label> all = {L("probe_set", set.probe_set)};
      if (probe != nullptr) all.push_back(L("probe", *probe));
      all.insert(all.end(), session.begin(), session.end());
      return all;
    };
    AddValue(rows, static_cast<double>(set.rows), labels(nullptr));
    for (const ProbeOutcomeSeries& probe : set.probes) {
      AddValue(scored, static_cast<double>(probe.scored), labels(&probe.probe));
      AddValue(fired, static_cast<double>(probe.fired), labels(&probe.probe));
      AddValue(non_finite, static_cast<double>(probe.non_finite), labels(&probe.probe));
      ClientMetric metric;
      metric.label = labels(&probe.probe);
      ClientMetric::Histogram& h = metric.histogram;
      uint64_t cumulative = 0;
      for (size_t b = 0; b < probe.buckets.size(); ++b) {
        cumulative += probe.buckets[b];
        h.bucket.push_back({cumulative, b < set.bounds.size()
                                            ? set.bounds[b]
                                            : std::numeric_limits<double>::infinity()});
      }
      h.sample_count = cumulative;
      h.sample_sum = probe.sum;
      score.metric.push_back(std::move(metric));
    }
  }
  for (MetricFamily* family : {&rows, &scored, &fired, &non_finite, &score}) {
    out.push_back(std::move(*family));
  }
}

void AddHistogram(MetricFamily& family, const LatencyHistogram& histogram,
                  std::vector<ClientMetric::Label> labels) {
  ClientMetric metric;
  metric.label = std::move(labels);
  metric.histogram = histogram.Snapshot();
  family.metric.push_back(std::move(metric));
}

// The families sampled from the executor's and the registries' state at scrape time: one row each.
struct SampledFamily {
  enum Series {
    kTotal,        // one unlabelled series
    kPerDevice,    // a series per served device (device="<ordinal>"), the total on the CPU backend
    kDevicesOnly,  // a series per served device, none on the CPU backend
  };
  const char* name;
  const char* help;
  MetricType type;
  Series series;
  uint64_t (*total)(const MetricsState&);            // kTotal, kPerDevice
  uint64_t (*device)(const DeviceMetricsState&);     // kPerDevice, kDevicesOnly
};

using S = MetricsState;
using D = DeviceMetricsState;
constexpr SampledFamily kSampledFamilies[] = {
    {"probesidecar_registered_buffers", "CUDA IPC buffer windows registered.", MetricType::Gauge,
     SampledFamily::kPerDevice, [](const S& s) { return s.registered_buffers; },
     [](const D& d) { return d.registered_buffers; }},
    {"probesidecar_registered_buffer_bytes", "Bytes of the registered buffer windows.",
     MetricType::Gauge, SampledFamily::kPerDevice,
     [](const S& s) { return s.registered_buffer_bytes; },
     [](const D& d) { return d.registered_buffer_bytes; }},
    {"probesidecar_ipc_handles_open", "CUDA IPC allocations the server has open.",
     MetricType::Gauge, SampledFamily::kPerDevice, [](const S& s) { return s.open_ipc_handles; },
     [](const D& d) { return d.open_ipc_handles; }},
    {"probesidecar_device_memory_bytes",
     "GPU memory allocated by the service (each probe set is placed on every served device).",
     MetricType::Gauge, SampledFamily::kPerDevice,
     [](const S& s) { return s.executor.device_memory_bytes; },
     [](const D& d) { return d.executor.memory_bytes; }},
    {"probesidecar_device_up",
     "1 while the served CUDA device works, 0 once its context is lost (the server then reports "
     "NOT_SERVING and exits).",
     MetricType::Gauge, SampledFamily::kDevicesOnly, nullptr,
     [](const D& d) { return d.executor.failure.empty() ? uint64_t{1} : uint64_t{0}; }},
    {"probesidecar_probe_sets_loaded", "Probe sets loaded.", MetricType::Gauge,
     SampledFamily::kTotal, [](const S& s) { return s.probe_sets; }, nullptr},
    {"probesidecar_mps_client",
     "1 when this server's CUDA context is a client of an MPS control daemon, else 0 (without "
     "MPS, its kernels and the inference server's are time-sliced: docs/mps.md).",
     MetricType::Gauge, SampledFamily::kTotal,
     [](const S& s) { return s.executor.mps ? uint64_t{1} : uint64_t{0}; }, nullptr},
    {"probesidecar_invalid_device_rows_total",
     "Row indices read from device buffers that were outside [0, T) (their scores are NaN).",
     MetricType::Counter, SampledFamily::kTotal,
     [](const S& s) { return s.executor.invalid_device_rows; }, nullptr},
    {"probesidecar_probe_set_load_errors_total",
     "Files in the probes directory that failed to load at start and were skipped (the log names "
     "each).",
     MetricType::Counter, SampledFamily::kTotal,
     [](const S& s) { return s.probe_set_load_errors; }, nullptr},
    {"probesidecar_invalid_verify_requests_total",
     "Verify requests whose device page table or lengths were out of range (checked on the GPU; "
     "they were refused and their outputs are NaN).",
     MetricType::Counter, SampledFamily::kTotal,
     [](const S& s) { return s.executor.invalid_verify_requests; }, nullptr},
    {"probesidecar_stream_slots_parked",
     "GPU stream slots taking no requests because their stream still waits on the GPU for work "
     "answered already (e.g. a client's ready event that has not fired).",
     MetricType::Gauge, SampledFamily::kPerDevice,
     [](const S& s) { return s.executor.parked_slots; },
     [](const D& d) { return d.executor.parked_slots; }},
    {"probesidecar_executor_queued_requests",
     "Requests waiting in the executor's queue for a worker (a stream slot on the GPU).",
     MetricType::Gauge, SampledFamily::kTotal, [](const S& s) { return s.executor.queued; },
     nullptr},
    {"probesidecar_executor_queue_capacity",
     "Requests that may wait in the executor's queue (--max-queued-requests); more are refused "
     "with RESOURCE_EXHAUSTED.",
     MetricType::Gauge, SampledFamily::kTotal,
     [](const S& s) { return s.executor.queue_capacity; }, nullptr},
    {"probesidecar_executor_expired_requests_total",
     "Requests the executor did not run, or stopped early, because their deadline had passed "
     "(answered DEADLINE_EXCEEDED).",
     MetricType::Counter, SampledFamily::kTotal,
     [](const S& s) { return s.executor.dropped.expired; }, nullptr},
    {"probesidecar_executor_cancelled_requests_total",
     "Requests the executor did not run, or stopped early, because their caller had cancelled or "
     "gone away (answered CANCELLED).",
     MetricType::Counter, SampledFamily::kTotal,
     [](const S& s) { return s.executor.dropped.cancelled; }, nullptr},
    {"probesidecar_graph_cache_entries", "Captured CUDA graphs held.", MetricType::Gauge,
     SampledFamily::kPerDevice, [](const S& s) { return s.executor.graph_cache.entries; },
     [](const D& d) { return d.executor.graph_cache.entries; }},
    {"probesidecar_graph_cache_capacity", "Captured CUDA graphs the cache may hold.",
     MetricType::Gauge, SampledFamily::kPerDevice,
     [](const S& s) { return s.executor.graph_cache.capacity; },
     [](const D& d) { return d.executor.graph_cache.capacity; }},
    {"probesidecar_graph_cache_hits_total", "Requests that replayed a cached CUDA graph.",
     MetricType::Counter, SampledFamily::kPerDevice,
     [](const S& s) { return s.executor.graph_cache.hits; },
     [](const D& d) { return d.executor.graph_cache.hits; }},
    {"probesidecar_graph_cache_misses_total", "Requests that found no cached CUDA graph.",
     MetricType::Counter, SampledFamily::kPerDevice,
     [](const S& s) { return s.executor.graph_cache.misses; },
     [](const D& d) { return d.executor.graph_cache.misses; }},
    {"probesidecar_graph_cache_captures_total", "CUDA graphs captured.", MetricType::Counter,
     SampledFamily::kPerDevice, [](const S& s) { return s.executor.graph_cache.captures; },
     [](const D& d) { return d.executor.graph_cache.captures; }},
    {"probesidecar_graph_cache_evictions_total", "CUDA graphs evicted from the cache.",
     MetricType::Counter, SampledFamily::kPerDevice,
     [](const S& s) { return s.executor.graph_cache.evictions; },
     [](const D& d) { return d.executor.graph_cache.evictions; }},
};

void AddSampledFamilies(const MetricsState& s, std::vector<MetricFamily>& out) {
  for (const SampledFamily& f : kSampledFamilies) {
    if (f.series == SampledFamily::kDevicesOnly && s.devices.empty()) continue;
    MetricFamily& family = out.emplace_back(Family(f.name, f.help, f.type));
    if (f.series == SampledFamily::kTotal ||
        (f.series == SampledFamily::kPerDevice && s.devices.empty())) {
      AddValue(family, static_cast<double>(f.total(s)));
      continue;
    }
    for (const DeviceMetricsState& d : s.devices) {
      AddValue(family, static_cast<double>(f.device(d)),
               {L("device", std::to_string(d.executor.device))});
    }
  }
}

}  // namespace

const char* RpcName(Rpc rpc) {
  static constexpr std::array<const char*, kNumRpcs> kNames = {
      "RegisterBuffer", "UnregisterBuffer", "ListBuffers",    "OpenSession", "LoadProbeSet",
      "UnloadProbeSet", "ListProbeSets",    "Score",          "ScoreStream", "Verify",
      "ServerInfo",     "RegisterEvent",    "UnregisterEvent"};
  return kNames[static_cast<int>(rpc)];
}

const char* StageName(Stage stage) {
  static constexpr std::array<const char*, kNumStages> kNames = {"queue", "staging", "kernel",
                                                                 "total"};
  return kNames[static_cast<int>(stage)];
}

class Metrics::Impl final : public prometheus::Collectable {
 public:
  Impl(BuildInfo build, std::function<MetricsState()> state)
      : build_(std::move(build)),
        state_(std::move(state)),
        start_time_seconds_(
            std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
                .count()) {}

  CounterShard& shard(int index) { return shards_[index]; }
  Series& series() { return series_; }

  void ShadowCompared(double rel_l2_error, bool mismatched) {
    absl::MutexLock lock(&shadow_mu_);
    size_t b = 0;
    // NaN and values past the last bound land in +Inf.
    while (b < kErrorBucketBounds.size() && !(rel_l2_error <= kErrorBucketBounds[b])) ++b;
    ++shadow_buckets_[b];
    if (std::isfinite(rel_l2_error)) shadow_sum_ += rel_l2_error;
    if (mismatched) ++shadow_mismatched_;
  }

  std::vector<MetricFamily> Collect() const override {
    std::vector<MetricFamily> out;
    out.reserve(40);
    const MetricsState s = state_ ? state_() : MetricsState{};  // sampled now
    AddRequestFamilies(out);
    AddLatencyFamilies(out);
    AddErrorFamilies(s, out);
    AddShadowFamilies(out);
    AddSampledFamilies(s, out);
    AddProbeOutcomes(s, out);
    AddValue(
        out.emplace_back(Family("probesidecar_build_info",
                                "Build and runtime of this server (value 1).", MetricType::Gauge)),
        1.0,
        {L("version", build_.version), L("git_commit", build_.git_commit),
         L("cuda_runtime", build_.cuda_runtime), L("device", build_.device),
         L("backend", build_.backend)});
    AddValue(out.emplace_back(Family("probesidecar_start_time_seconds",
                                     "When this server started, Unix time.", MetricType::Gauge)),
             start_time_seconds_);
    return out;
  }

 private:
  // Requests by RPC and code; in flight by RPC.
  void AddRequestFamilies(std::vector<MetricFamily>& out) const {
    std::array<std::array<uint64_t, kNumCodes>, kNumRpcs> requests{};
    std::array<int64_t, kNumRpcs> in_flight{};
    for (const CounterShard& shard : shards_) {
      for (int r = 0; r < kNumRpcs; ++r) {
        for (int c = 0; c < kNumCodes; ++c) {
          requests[r][c] += shard.requests[r][c].load(std::memory_order_relaxed);
        }
        in_flight[r] += shard.in_flight[r].load(std::memory_order_relaxed);
      }
    }
    MetricFamily& total = out.emplace_back(Family(
        "probesidecar_rpc_requests_total",
        "RPCs (and ScoreStream messages) answered, by gRPC status code.", MetricType::Counter));
    for (int r = 0; r < kNumRpcs; ++r) {
      for (int c = 0; c < kNumCodes; ++c) {
        // OK exists from the start for every RPC (so rate() sees the first requests); error
        // codes appear when they first happen.
        if (c != 0 && requests[r][c] == 0) continue;
        AddValue(total, static_cast<double>(requests[r][c]),
                 {L("rpc", RpcName(static_cast<Rpc>(r))),
                  L("code", absl::StatusCodeToString(static_cast<absl::StatusCode>(c)))});
      }
    }
    MetricFamily& flight =
        out.emplace_back(Family("probesidecar_rpc_in_flight",
                                "RPCs (and ScoreStream messages) in progress.", MetricType::Gauge));
    for (int r = 0; r < kNumRpcs; ++r) {
      AddValue(flight, static_cast<double>(std::max<int64_t>(0, in_flight[r])),
               {L("rpc", RpcName(static_cast<Rpc>(r)))});
    }
  }

  // The latency histograms of RPCs and of Score's stages, per (probe set, kernel path).
  void AddLatencyFamilies(std::vector<MetricFamily>& out) const {
    MetricFamily& duration = out.emplace_back(
        Family("probesidecar_rpc_duration_seconds",
               "Server-side latency of an RPC (or ScoreStream message), from receipt to the "
               "answer.",
               MetricType::Histogram));
    MetricFamily& stages = out.emplace_back(
        Family("probesidecar_score_stage_duration_seconds",
               "Time per stage of a successful Score: queue wait, staging (the staging kernel on "
               "the GPU), kernel (GPU time from CUDA events on the CUDA backend), total.",
               MetricType::Histogram));
    for (const SeriesGroup* group : series_.All()) {
      for (int r = 0; r < kNumRpcs; ++r) {
        if (const LatencyHistogram* h = group->FindRpc(r)) {
          AddHistogram(duration, *h,
                       {L("rpc", RpcName(static_cast<Rpc>(r))), L("probe_set", group->probe_set()),
                        L("kernel_path", group->kernel_path())});
        }
      }
      for (int s = 0; s < kNumStages; ++s) {
        if (const LatencyHistogram* h = group->FindStage(s)) {
          AddHistogram(
              stages, *h,
              {L("stage", StageName(static_cast<Stage>(s))), L("probe_set", group->probe_set()),
               L("kernel_path", group->kernel_path())});
        }
      }
    }
  }

  // Failed CUDA calls and non-finite scores (those of responses counted here, those of device
  // outputs on the GPU).
  void AddErrorFamilies(const MetricsState& s, std::vector<MetricFamily>& out) const {
    uint64_t cuda_errors = 0;
    uint64_t non_finite_scores = 0;
    for (const CounterShard& shard : shards_) {
      cuda_errors += shard.cuda_errors.load(std::memory_order_relaxed);
      non_finite_scores += shard.non_finite_scores.load(std::memory_order_relaxed);
    }
    AddValue(out.emplace_back(Family("probesidecar_cuda_errors_total",
                                     "CUDA calls that failed while serving a request.",
                                     MetricType::Counter)),
             static_cast<double>(cuda_errors));
    AddValue(out.emplace_back(Family(
                 "probesidecar_non_finite_scores_total",
                 "Scores that were NaN or infinite, returned in responses or written to device "
                 "output buffers (counted there on the GPU); their probes never fire; usually NaN "
                 "or Inf activations.",
                 MetricType::Counter)),
             static_cast<double>(non_finite_scores + s.executor.non_finite_device_scores));
  }

  // Shadow-mode Verify's error histogram and mismatches.
  void AddShadowFamilies(std::vector<MetricFamily>& out) const {
    absl::MutexLock lock(&shadow_mu_);
    ClientMetric metric;
    ClientMetric::Histogram& h = metric.histogram;
    uint64_t cumulative = 0;
    for (size_t b = 0; b < shadow_buckets_.size(); ++b) {
      cumulative += shadow_buckets_[b];
      h.bucket.push_back({cumulative, b < kErrorBucketBounds.size()
                                          ? kErrorBucketBounds[b]
                                          : std::numeric_limits<double>::infinity()});
    }
    h.sample_count = cumulative;
    h.sample_sum = shadow_sum_;
    out.emplace_back(Family("probesidecar_shadow_rel_l2_error",
                            "Shadow-mode Verify: relative L2 error of our output against the "
                            "caller's (non-finite errors count as +Inf).",
                            MetricType::Histogram))
        .metric.push_back(std::move(metric));
    AddValue(out.emplace_back(Family("probesidecar_shadow_mismatched_requests_total",
                                     "Shadow-mode Verify requests with at least one element "
                                     "beyond the tolerance.",
                                     MetricType::Counter)),
             static_cast<double>(shadow_mismatched_));
  }

  const BuildInfo build_;
  const std::function<MetricsState()> state_;
  const double start_time_seconds_;
  Series series_{kMaxLabelledSeries, kOtherProbeSet};
  std::array<CounterShard, kShards> shards_;
  mutable absl::Mutex shadow_mu_;
  std::array<uint64_t, kErrorBucketBounds.size() + 1> shadow_buckets_ ABSL_GUARDED_BY(shadow_mu_){};
  double shadow_sum_ ABSL_GUARDED_BY(shadow_mu_) = 0;
  uint64_t shadow_mismatched_ ABSL_GUARDED_BY(shadow_mu_) = 0;
};

Metrics::Metrics(BuildInfo build, std::function<MetricsState()> state)
    // Not make_shared: Impl is over-aligned (its shards are cache-line aligned).
    : impl_(new Impl(std::move(build), std::move(state))) {}

Metrics::~Metrics() = default;

std::shared_ptr<prometheus::Collectable> Metrics::collectable() const { return impl_; }

void Metrics::RpcStarted(Rpc rpc) {
  impl_->shard(ThreadShard())
      .in_flight[static_cast<int>(rpc)]
      .fetch_add(1, std::memory_order_relaxed);
}

void Metrics::RpcFinished(Rpc rpc, absl::StatusCode code, double seconds,
                          absl::string_view probe_set, absl::string_view kernel_path) {
  const int shard_index = ThreadShard();
  CounterShard& shard = impl_->shard(shard_index);
  const int r = static_cast<int>(rpc);
  shard.in_flight[r].fetch_sub(1, std::memory_order_relaxed);
  shard.requests[r][CodeIndex(code)].fetch_add(1, std::memory_order_relaxed);
  impl_->series().Get(probe_set, kernel_path).ForRpc(rpc).Observe(seconds, shard_index);
}

void Metrics::ScoreStages(absl::string_view probe_set, const ScoreTimings& timings,
                          double total_seconds) {
  const int shard = ThreadShard();
  SeriesGroup& group =
      impl_->series().Get(probe_set, timings.kernel_path != nullptr ? timings.kernel_path : "");
  if (timings.queue > 0) group.ForStage(Stage::kQueue).Observe(timings.queue, shard);
  if (timings.staging > 0) group.ForStage(Stage::kStaging).Observe(timings.staging, shard);
  if (timings.kernel > 0) group.ForStage(Stage::kKernel).Observe(timings.kernel, shard);
  group.ForStage(Stage::kTotal).Observe(total_seconds, shard);
}

void Metrics::ShadowCompared(double rel_l2_error, bool mismatched) {
  impl_->ShadowCompared(rel_l2_error, mismatched);
}

void Metrics::CudaError() {
  impl_->shard(ThreadShard()).cuda_errors.fetch_add(1, std::memory_order_relaxed);
}

void Metrics::NonFiniteScores(uint64_t count) {
  if (count == 0) return;
  impl_->shard(ThreadShard()).non_finite_scores.fetch_add(count, std::memory_order_relaxed);
}

std::string Metrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(impl_->Collect());
}

}  // namespace probesidecar::server
