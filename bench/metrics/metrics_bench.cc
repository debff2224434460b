// The cost of recording metrics on the request path, under 1..16 concurrent threads.
//
// "score_rpc" is everything one Score records (server/rpc/executor_rpc.h and ScoreWork):
// RpcStarted, ScoreStages with every stage measured (the CUDA backend's case: queue, staging,
// kernel, + total) and RpcFinished: 1 counter, 2 gauge updates, 5 histogram observations, with
// their label lookups. "observe" is one histogram observation through the public API (lookup
// included): ScoreStages of a request whose only measured stage is its total.
//
// Each is measured for the server's implementation (sharded per-thread atomics, lock-free lookup:
// impl "sharded") and, as the reference, for the first implementation with prometheus-cpp's
// Family::Add(labels) + Histogram::Observe per observation (impl "prometheus_cpp") and for
// prometheus-cpp with the handles looked up once (impl "prometheus_cpp_cached").
//
// With ->Threads(n) Google Benchmark reports CPU time summed over the threads divided by the
// operations of all threads (the CPU cost of one operation) and wall time divided by the same
// (the inverse of the throughput); both are per operation.
#include <benchmark/benchmark.h>

#include <array>
#include <memory>
#include <string>

#include "prometheus/counter.h"
#include "prometheus/family.h"
#include "prometheus/gauge.h"
#include "prometheus/histogram.h"
#include "prometheus/registry.h"
#include "server/observability/metrics.h"

namespace probesidecar::server {
namespace {

constexpr char kProbeSet[] = "demo";
constexpr char kKernelPath[] = "fused_cuda";

// Durations spread over the buckets, so that observations do not all hit one bucket.
double Duration(int64_t i) {
  static const std::array<double, 16> kSeconds = {3e-6,   8e-6,   1.2e-5, 2.2e-5, 3.5e-5, 4.5e-5,
                                                  5.5e-5, 8e-5,   1.2e-4, 1.7e-4, 2.2e-4, 3.5e-4,
                                                  6e-4,   1.1e-3, 4e-3,   2e-2};
  return kSeconds[static_cast<size_t>(i) & 15];
}

ScoreTimings CudaLikeTimings(int64_t i) {
  ScoreTimings t;
  t.queue = Duration(i) * 0.1;
  t.staging = 3e-6;
  t.kernel = Duration(i + 3) * 0.3;
  t.kernel_path = kKernelPath;
  return t;
}

Metrics& SharedMetrics() {
  static Metrics* metrics = new Metrics(BuildInfo{"bench", "bench", "13.0", "bench", "cuda"},
                                        [] { return MetricsState{}; });
  return *metrics;
}

// The first implementation of server/observability/metrics.cc (prometheus-cpp families,
// labels per call).
class PrometheusCppMetrics {
 public:
  PrometheusCppMetrics() {
    requests_ = &prometheus::BuildCounter().Name("requests_total").Register(registry_);
    in_flight_ = &prometheus::BuildGauge().Name("in_flight").Register(registry_);
    duration_ = &prometheus::BuildHistogram().Name("duration_seconds").Register(registry_);
    stages_ = &prometheus::BuildHistogram().Name("stage_seconds").Register(registry_);
    for (int i = 0; i < kNumRpcs; ++i) {
      in_flight_by_rpc_[i] = &in_flight_->Add({{"rpc", RpcName(static_cast<Rpc>(i))}});
    }
  }

  static const prometheus::Histogram::BucketBoundaries& Buckets() {
    static const auto* buckets = new prometheus::Histogram::BucketBoundaries(
        kLatencyBucketBounds.begin(), kLatencyBucketBounds.end());
    return *buckets;
  }

  void RpcStarted(Rpc rpc) { in_flight_by_rpc_[static_cast<int>(rpc)]->Increment(); }
  void RpcFinished(Rpc rpc, const char* code, double seconds, const std::string& probe_set,
                   const std::string& kernel_path) {
    in_flight_by_rpc_[static_cast<int>(rpc)]->Decrement();
    requests_->Add({{"rpc", RpcName(rpc)}, {"code", code}}).Increment();
    duration_
        ->Add({{"rpc", RpcName(rpc)}, {"probe_set", probe_set}, {"kernel_path", kernel_path}},
              Buckets())
        .Observe(seconds);
  }
  void Stage(const char* stage, const std::string& probe_set, const std::string& kernel_path,
             double seconds) {
    stages_
        ->Add({{"stage", stage}, {"probe_set", probe_set}, {"kernel_path", kernel_path}}, Buckets())
        .Observe(seconds);
  }
  void ScoreStages(const std::string& probe_set, const ScoreTimings& t, double total) {
    Stage("queue", probe_set, t.kernel_path, t.queue);
    Stage("staging", probe_set, t.kernel_path, t.staging);
    Stage("kernel", probe_set, t.kernel_path, t.kernel);
    Stage("total", probe_set, t.kernel_path, total);
  }
  prometheus::Histogram& StageHandle(const char* stage) {
    return stages_->Add({{"stage", stage}, {"probe_set", kProbeSet}, {"kernel_path", kKernelPath}},
                        Buckets());
  }

 private:
  prometheus::Registry registry_;
  prometheus::Family<prometheus::Counter>* requests_;
  prometheus::Family<prometheus::Gauge>* in_flight_;
  prometheus::Family<prometheus::Histogram>* duration_;
  prometheus::Family<prometheus::Histogram>* stages_;
  std::array<prometheus::Gauge*, kNumRpcs> in_flight_by_rpc_{};
};

PrometheusCppMetrics& SharedPrometheusCpp() {
  static PrometheusCppMetrics* metrics = new PrometheusCppMetrics();
  return *metrics;
}

void BM_ScoreRpc_Sharded(benchmark::State& state) {
  Metrics& m = SharedMetrics();
  int64_t i = state.thread_index();
  for (auto _ : state) {
    m.RpcStarted(Rpc::kScore);
    const ScoreTimings t = CudaLikeTimings(i);
    m.ScoreStages(kProbeSet, t, Duration(i + 1));
    m.RpcFinished(Rpc::kScore, absl::StatusCode::kOk, Duration(i + 1), kProbeSet, kKernelPath);
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_ScoreRpc_PrometheusCpp(benchmark::State& state) {
  PrometheusCppMetrics& m = SharedPrometheusCpp();
  const std::string probe_set = kProbeSet;
  const std::string kernel_path = kKernelPath;
  int64_t i = state.thread_index();
  for (auto _ : state) {
    m.RpcStarted(Rpc::kScore);
    const ScoreTimings t = CudaLikeTimings(i);
    m.ScoreStages(probe_set, t, Duration(i + 1));
    m.RpcFinished(Rpc::kScore, "OK", Duration(i + 1), probe_set, kernel_path);
    ++i;
  }
  state.SetItemsProcessed(state.iterations());
}

void BM_Observe_Sharded(benchmark::State& state) {
  Metrics& m = SharedMetrics();
  int64_t i = state.thread_index();
  ScoreTimings total_only;
  total_only.kernel_path = kKernelPath;
  for (auto _ : state) m.ScoreStages(kProbeSet, total_only, Duration(i++));
  state.SetItemsProcessed(state.iterations());
}

void BM_Observe_PrometheusCpp(benchmark::State& state) {
  PrometheusCppMetrics& m = SharedPrometheusCpp();
  const std::string probe_set = kProbeSet;
  const std::string kernel_path = kKernelPath;
  int64_t i = state.thread_index();
  for (auto _ : state) m.Stage("kernel", probe_set, kernel_path, Duration(i++));
  state.SetItemsProcessed(state.iterations());
}

void BM_Observe_PrometheusCppCached(benchmark::State& state) {
  prometheus::Histogram& h = SharedPrometheusCpp().StageHandle("kernel");
  int64_t i = state.thread_index();
  for (auto _ : state) h.Observe(Duration(i++));
  state.SetItemsProcessed(state.iterations());
}

// A scrape (Collect + text serialisation) with 8 probe sets x 2 kernel paths recorded: the cost
// lands on the exposer's thread once per scrape, not on requests.
void BM_Scrape(benchmark::State& state) {
  static Metrics* m = [] {
    auto* metrics = new Metrics(BuildInfo{"bench", "bench", "13.0", "bench", "cuda"},
                                [] { return MetricsState{}; });
    for (int s = 0; s < 8; ++s) {
      for (const char* path : {"fused_cuda", "gemm_tc"}) {
        const std::string set = "set" + std::to_string(s);
        metrics->RpcStarted(Rpc::kScore);
        metrics->ScoreStages(set, CudaLikeTimings(s), 1e-4);
        metrics->RpcFinished(Rpc::kScore, absl::StatusCode::kOk, 1e-4, set, path);
      }
    }
    return metrics;
  }();
  size_t bytes = 0;
  for (auto _ : state) {
    std::string text = m->Serialize();
    bytes = text.size();
    benchmark::DoNotOptimize(text);
  }
  state.counters["exposition_bytes"] = static_cast<double>(bytes);
}

BENCHMARK(BM_ScoreRpc_Sharded)->ThreadRange(1, 16);
BENCHMARK(BM_ScoreRpc_PrometheusCpp)->ThreadRange(1, 16);
BENCHMARK(BM_Observe_Sharded)->ThreadRange(1, 16);
BENCHMARK(BM_Observe_PrometheusCpp)->ThreadRange(1, 16);
BENCHMARK(BM_Observe_PrometheusCppCached)->ThreadRange(1, 16);
BENCHMARK(BM_Scrape)->Unit(benchmark::kMicrosecond);

}  // namespace
}  // namespace probesidecar::server

BENCHMARK_MAIN();
