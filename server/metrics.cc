#include "server/metrics.h"

#include <array>
#include <vector>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "prometheus/text_serializer.h"
#include "server/grpc_status.h"

namespace probesidecar::server {
namespace {

// From 5 µs to 1 s: the stages of a Score are a few µs to a few ms.
const prometheus::Histogram::BucketBoundaries& LatencyBuckets() {
  static const auto* buckets = new prometheus::Histogram::BucketBoundaries{
      5e-6, 1e-5,   2e-5, 3e-5, 5e-5, 7.5e-5, 1e-4, 1.5e-4, 2e-4, 3e-4, 5e-4,
      7.5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1,   0.25, 0.5,  1.0};
  return *buckets;
}

// Scrape-time gauges: values come from the state callback.
class StateCollectable final : public prometheus::Collectable {
 public:
  explicit StateCollectable(std::function<MetricsState()> state) : state_(std::move(state)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    const MetricsState s = state_();
    std::vector<prometheus::MetricFamily> out;
    auto add = [&out](const char* name, const char* help, prometheus::MetricType type,
                      double value) {
      prometheus::MetricFamily family;
      family.name = name;
      family.help = help;
      family.type = type;
      prometheus::ClientMetric metric;
      if (type == prometheus::MetricType::Counter) {
        metric.counter.value = value;
      } else {
        metric.gauge.value = value;
      }
      family.metric.push_back(std::move(metric));
      out.push_back(std::move(family));
    };
    using prometheus::MetricType;
    add("probesidecar_registered_buffers", "Registered CUDA IPC buffer windows.",
        MetricType::Gauge, static_cast<double>(s.registered_buffers));
    add("probesidecar_registered_buffer_bytes", "Bytes of the registered buffer windows.",
        MetricType::Gauge, static_cast<double>(s.registered_buffer_bytes));
    add("probesidecar_ipc_handles_open", "CUDA IPC allocations the server has open.",
        MetricType::Gauge, static_cast<double>(s.open_ipc_handles));
    add("probesidecar_probe_sets_loaded", "Loaded probe sets.", MetricType::Gauge,
        static_cast<double>(s.probe_sets));
    add("probesidecar_device_memory_bytes", "GPU memory held by the service.", MetricType::Gauge,
        static_cast<double>(s.device_memory_bytes));
    add("probesidecar_graph_cache_entries", "Captured CUDA graphs held.", MetricType::Gauge,
        static_cast<double>(s.graph_cache.entries));
    add("probesidecar_graph_cache_capacity", "Captured CUDA graphs the cache may hold.",
        MetricType::Gauge, static_cast<double>(s.graph_cache.capacity));
    add("probesidecar_graph_cache_hits_total", "Requests that replayed a cached graph.",
        MetricType::Counter, static_cast<double>(s.graph_cache.hits));
    add("probesidecar_graph_cache_misses_total", "Requests that found no cached graph.",
        MetricType::Counter, static_cast<double>(s.graph_cache.misses));
    add("probesidecar_graph_cache_captures_total", "CUDA graphs captured.", MetricType::Counter,
        static_cast<double>(s.graph_cache.captures));
    add("probesidecar_graph_cache_evictions_total", "CUDA graphs evicted.", MetricType::Counter,
        static_cast<double>(s.graph_cache.evictions));
    return out;
  }

 private:
  std::function<MetricsState()> state_;
};

// Several collectables served as one.
class CombinedCollectable final : public prometheus::Collectable {
 public:
  CombinedCollectable(std::shared_ptr<prometheus::Registry> registry,
                      std::shared_ptr<StateCollectable> state)
      : registry_(std::move(registry)), state_(std::move(state)) {}
  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> out = registry_->Collect();
    for (prometheus::MetricFamily& f : state_->Collect()) out.push_back(std::move(f));
    return out;
  }

 private:
  std::shared_ptr<prometheus::Registry> registry_;
  std::shared_ptr<StateCollectable> state_;
};

}  // namespace

const char* RpcName(Rpc rpc) {
  static constexpr std::array<const char*, kNumRpcs> kNames = {
      "RegisterBuffer", "UnregisterBuffer", "ListBuffers", "OpenSession",
      "LoadProbeSet",   "UnloadProbeSet",   "ListProbeSets", "Score",
      "ScoreStream",    "Verify",           "ServerInfo"};
  return kNames[static_cast<int>(rpc)];
}

struct Metrics::Impl {
  std::shared_ptr<prometheus::Registry> registry = std::make_shared<prometheus::Registry>();
  std::shared_ptr<CombinedCollectable> combined;
  prometheus::Family<prometheus::Counter>* requests = nullptr;
  prometheus::Family<prometheus::Gauge>* in_flight = nullptr;
  prometheus::Family<prometheus::Histogram>* duration = nullptr;
  prometheus::Family<prometheus::Histogram>* stages = nullptr;
  prometheus::Counter* cuda_errors = nullptr;
  std::array<prometheus::Gauge*, kNumRpcs> in_flight_by_rpc{};
};

Metrics::Metrics(BuildInfo build, std::function<MetricsState()> state)
    : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.requests = &prometheus::BuildCounter()
                    .Name("probesidecar_rpc_requests_total")
                    .Help("RPCs (and ScoreStream messages) handled, by status code.")
                    .Register(*m.registry);
  m.in_flight = &prometheus::BuildGauge()
                     .Name("probesidecar_rpc_in_flight")
                     .Help("RPCs (and ScoreStream messages) in progress.")
                     .Register(*m.registry);
  m.duration = &prometheus::BuildHistogram()
                    .Name("probesidecar_rpc_duration_seconds")
                    .Help("Server-side latency of an RPC (or ScoreStream message), from receipt "
                          "to the answer.")
                    .Register(*m.registry);
  m.stages = &prometheus::BuildHistogram()
                  .Name("probesidecar_score_stage_duration_seconds")
                  .Help("Time per stage of a successful Score: queue, h2d, kernel (GPU time), "
                        "d2h, total.")
                  .Register(*m.registry);
  m.cuda_errors = &prometheus::BuildCounter()
                       .Name("probesidecar_cuda_errors_total")
                       .Help("CUDA calls that failed while serving a request.")
                       .Register(*m.registry)
                       .Add({});
  prometheus::BuildGauge()
      .Name("probesidecar_build_info")
      .Help("Build and runtime of this server (value 1).")
      .Register(*m.registry)
      .Add({{"version", build.version},
            {"git_commit", build.git_commit},
            {"cuda_runtime", build.cuda_runtime},
            {"device", build.device},
            {"backend", build.backend}})
      .Set(1);
  for (int i = 0; i < kNumRpcs; ++i) {
    m.in_flight_by_rpc[i] = &m.in_flight->Add({{"rpc", RpcName(static_cast<Rpc>(i))}});
  }
  m.combined = std::make_shared<CombinedCollectable>(
      m.registry, std::make_shared<StateCollectable>(std::move(state)));
}

Metrics::~Metrics() = default;

std::shared_ptr<prometheus::Collectable> Metrics::collectable() const { return impl_->combined; }

void Metrics::RpcStarted(Rpc rpc) { impl_->in_flight_by_rpc[static_cast<int>(rpc)]->Increment(); }

void Metrics::RpcFinished(Rpc rpc, grpc::StatusCode code, double seconds,
                          absl::string_view probe_set, absl::string_view kernel_path) {
  Impl& m = *impl_;
  m.in_flight_by_rpc[static_cast<int>(rpc)]->Decrement();
  m.requests->Add({{"rpc", RpcName(rpc)}, {"code", GrpcCodeName(code)}}).Increment();
  m.duration
      ->Add({{"rpc", RpcName(rpc)},
             {"probe_set", std::string(probe_set)},
             {"kernel_path", std::string(kernel_path)}},
            LatencyBuckets())
      .Observe(seconds);
}

void Metrics::ScoreStages(absl::string_view probe_set, const ScoreTimings& timings,
                          double total_seconds) {
  Impl& m = *impl_;
  auto observe = [&](const char* stage, double seconds) {
    m.stages
        ->Add({{"stage", stage},
               {"probe_set", std::string(probe_set)},
               {"kernel_path", timings.kernel_path}},
              LatencyBuckets())
        .Observe(seconds);
  };
  observe("queue", timings.queue);
  if (timings.h2d > 0) observe("h2d", timings.h2d);
  observe("kernel", timings.kernel);
  if (timings.d2h > 0) observe("d2h", timings.d2h);
  observe("total", total_seconds);
}

void Metrics::CudaError() { impl_->cuda_errors->Increment(); }

std::string Metrics::Serialize() const {
  return prometheus::TextSerializer().Serialize(impl_->combined->Collect());
}

}  // namespace probesidecar::server
