// Metrics: bucket placement at the bounds, counts under concurrent recording, bounded labels.
#include "server/observability/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/strings/strip.h"

namespace probesidecar::server {
namespace {

// {sample line without its value: value} of the text exposition.
std::map<std::string, double> Samples(const std::string& text) {
  std::map<std::string, double> out;
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    double value = 0;
    EXPECT_TRUE(absl::SimpleAtod(line.substr(space + 1), &value)) << line;
    out[std::string(line.substr(0, space))] = value;
  }
  return out;
}

Metrics NewMetrics() {
  return Metrics(BuildInfo{"v", "g", "13.0", "dev", "cpu"}, [] {
    MetricsState s;
    s.probe_sets = 3;
    s.executor.graph_cache.hits = 7;
    return s;
  });
}

std::string Le(double bound) {
  // As prometheus-cpp prints it: 16 significant digits.
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.16g", bound);
  return buf;
}

std::string StageBucket(const std::string& stage, const std::string& le) {
  return absl::StrCat("probesidecar_score_stage_duration_seconds_bucket{stage=\"", stage,
                      "\",probe_set=\"p\",kernel_path=\"k\",le=\"", le, "\"}");
}

TEST(MetricsTest, BucketBoundsPrintExactly) {
  for (double bound : kLatencyBucketBounds) {
    double parsed = 0;
    ASSERT_TRUE(absl::SimpleAtod(Le(bound), &parsed));
    EXPECT_EQ(parsed, bound);
    EXPECT_LE(Le(bound).size(), 7u) << Le(bound);
  }
}

TEST(MetricsTest, ObservationsLandInTheirBucketInclusiveOfTheBound) {
  Metrics metrics = NewMetrics();
  // One observation exactly at each bound (the request's total), one just above it (its queue
  // wait).
  ScoreTimings timings;
  timings.kernel_path = "k";
  for (double bound : kLatencyBucketBounds) {
    timings.queue = std::nextafter(bound, 2.0);
    metrics.ScoreStages("p", timings, bound);
  }
  timings.queue = 0;  // not observed: only the totals below are
  metrics.ScoreStages("p", timings, 0.0);
  metrics.ScoreStages("p", timings, -1.0);                                      // as 0
  metrics.ScoreStages("p", timings, std::numeric_limits<double>::quiet_NaN());  // as 0
  metrics.ScoreStages("p", timings, 5.0);                                       // +Inf only
  const std::map<std::string, double> s = Samples(metrics.Serialize());
  for (size_t i = 0; i < kLatencyBucketBounds.size(); ++i) {
    const std::string le = Le(kLatencyBucketBounds[i]);
    // total: 3 zeros + one per bound up to and including this one.
    EXPECT_EQ(s.at(StageBucket("total", le)), 3 + i + 1) << le;
    // queue: the value just above bound j lands in bucket j+1.
    EXPECT_EQ(s.at(StageBucket("queue", le)), static_cast<double>(i)) << le;
  }
  EXPECT_EQ(s.at(StageBucket("total", "+Inf")), kLatencyBucketBounds.size() + 4);
  EXPECT_EQ(s.at(StageBucket("queue", "+Inf")), kLatencyBucketBounds.size());
  double sum = 5.0;
  for (double bound : kLatencyBucketBounds) sum += bound;
  EXPECT_NEAR(s.at("probesidecar_score_stage_duration_seconds_sum{stage=\"total\",probe_set="
                   "\"p\",kernel_path=\"k\"}"),
              sum, 1e-6);
}

TEST(MetricsTest, ConcurrentRecordingLosesNothing) {
  Metrics metrics = NewMetrics();
  constexpr int kThreads = 24;  // more than the shards: shards are shared
  constexpr int kPerThread = 20000;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&metrics, t] {
      const std::string set = t % 2 == 0 ? "a" : "b";
      for (int i = 0; i < kPerThread; ++i) {
        metrics.RpcStarted(Rpc::kScore);
        ScoreTimings timings;
        timings.queue = 1e-6 * (i % 50);
        timings.kernel = 2e-5;
        timings.kernel_path = "cpu";
        metrics.ScoreStages(set, timings, 1e-4);
        metrics.RpcFinished(
            Rpc::kScore, i % 10 == 0 ? absl::StatusCode::kInvalidArgument : absl::StatusCode::kOk,
            1e-4, set, "cpu");
      }
    });
  }
  // Scrapes while recording: cumulative buckets, +Inf == count.
  for (int scrape = 0; scrape < 20; ++scrape) {
    const std::map<std::string, double> s = Samples(metrics.Serialize());
    for (const std::string set : {"a", "b"}) {
      const std::string labels =
          absl::StrCat("{rpc=\"Score\",probe_set=\"", set, "\",kernel_path=\"cpu\"");
      auto count = s.find("probesidecar_rpc_duration_seconds_count" + labels + "}");
      if (count == s.end()) continue;
      double previous = 0;
      for (double bound : kLatencyBucketBounds) {
        const double c = s.at(absl::StrCat("probesidecar_rpc_duration_seconds_bucket", labels,
                                           ",le=\"", Le(bound), "\"}"));
        EXPECT_GE(c, previous);
        previous = c;
      }
      EXPECT_EQ(
          s.at(absl::StrCat("probesidecar_rpc_duration_seconds_bucket", labels, ",le=\"+Inf\"}")),
          count->second);
    }
  }
  for (std::thread& t : threads) t.join();
  const std::map<std::string, double> s = Samples(metrics.Serialize());
  const double total = static_cast<double>(kThreads) * kPerThread;
  EXPECT_EQ(s.at("probesidecar_rpc_requests_total{rpc=\"Score\",code=\"OK\"}"), total * 0.9);
  EXPECT_EQ(s.at("probesidecar_rpc_requests_total{rpc=\"Score\",code=\"INVALID_ARGUMENT\"}"),
            total * 0.1);
  EXPECT_EQ(s.at("probesidecar_rpc_in_flight{rpc=\"Score\"}"), 0);
  for (const std::string set : {"a", "b"}) {
    const std::string labels =
        absl::StrCat("{rpc=\"Score\",probe_set=\"", set, "\",kernel_path=\"cpu\"}");
    EXPECT_EQ(s.at("probesidecar_rpc_duration_seconds_count" + labels), total / 2);
    EXPECT_NEAR(s.at("probesidecar_rpc_duration_seconds_sum" + labels), total / 2 * 1e-4, 1e-6);
    EXPECT_EQ(s.at(absl::StrCat("probesidecar_score_stage_duration_seconds_count{stage=\"kernel\","
                                "probe_set=\"",
                                set, "\",kernel_path=\"cpu\"}")),
              total / 2);
  }
  // queue = 0 (i % 50 == 0) is "does not apply": not observed.
  EXPECT_EQ(s.at("probesidecar_score_stage_duration_seconds_count{stage=\"queue\",probe_set=\"a\","
                 "kernel_path=\"cpu\"}"),
            total / 2 * 49 / 50);
}

TEST(MetricsTest, FamiliesExistBeforeTrafficAndStateIsSampled) {
  Metrics metrics = NewMetrics();
  const std::string text = metrics.Serialize();
  for (const char* family :
       {"probesidecar_rpc_requests_total counter", "probesidecar_rpc_in_flight gauge",
        "probesidecar_rpc_duration_seconds histogram",
        "probesidecar_score_stage_duration_seconds histogram",
        "probesidecar_cuda_errors_total counter", "probesidecar_build_info gauge",
        "probesidecar_graph_cache_hits_total counter"}) {
    EXPECT_NE(text.find(absl::StrCat("# TYPE ", family, "\n")), std::string::npos) << family;
  }
  const std::map<std::string, double> s = Samples(text);
  EXPECT_EQ(s.at("probesidecar_rpc_requests_total{rpc=\"Verify\",code=\"OK\"}"), 0);
  EXPECT_EQ(s.at("probesidecar_probe_sets_loaded"), 3);
  EXPECT_EQ(s.at("probesidecar_graph_cache_hits_total"), 7);
  EXPECT_EQ(s.at("probesidecar_build_info{version=\"v\",git_commit=\"g\",cuda_runtime=\"13.0\","
                 "device=\"dev\",backend=\"cpu\"}"),
            1);
  // The GPU-only stage does not appear until recorded.
  EXPECT_EQ(text.find("stage=\"staging\""), std::string::npos);
  metrics.CudaError();
  EXPECT_EQ(Samples(metrics.Serialize()).at("probesidecar_cuda_errors_total"), 1);
}

// With served devices, the GPU families have one series per device (label device) and
// probesidecar_device_up says which works; without (the CPU backend), one unlabelled series each
// and no probesidecar_device_up.
TEST(MetricsTest, GpuFamiliesHaveASeriesPerDevice) {
  Metrics metrics(BuildInfo{"v", "g", "13.0", "dev", "cuda"}, [] {
    MetricsState s;
    s.executor.device_memory_bytes = 30;
    for (int d : {0, 1}) {
      DeviceMetricsState& device = s.devices.emplace_back();
      device.executor.device = d;
      if (d != 0) device.executor.failure = "the GPU's CUDA context is lost";
      device.executor.memory_bytes = 10 + 10 * d;
      device.registered_buffers = 2 + d;
      device.executor.parked_slots = d;
      device.executor.graph_cache.hits = 100 + d;
    }
    return s;
  });
  const std::map<std::string, double> s = Samples(metrics.Serialize());
  EXPECT_EQ(s.at("probesidecar_device_memory_bytes{device=\"0\"}"), 10);
  EXPECT_EQ(s.at("probesidecar_device_memory_bytes{device=\"1\"}"), 20);
  EXPECT_EQ(s.count("probesidecar_device_memory_bytes"), 0u);  // no unlabelled total beside them
  EXPECT_EQ(s.at("probesidecar_registered_buffers{device=\"1\"}"), 3);
  EXPECT_EQ(s.at("probesidecar_stream_slots_parked{device=\"1\"}"), 1);
  EXPECT_EQ(s.at("probesidecar_graph_cache_hits_total{device=\"0\"}"), 100);
  EXPECT_EQ(s.at("probesidecar_device_up{device=\"0\"}"), 1);
  EXPECT_EQ(s.at("probesidecar_device_up{device=\"1\"}"), 0);

  const std::map<std::string, double> cpu = Samples(NewMetrics().Serialize());
  EXPECT_EQ(cpu.at("probesidecar_device_memory_bytes"), 0);
  EXPECT_EQ(cpu.at("probesidecar_graph_cache_hits_total"), 7);
  for (const auto& [sample, value] : cpu) {
    EXPECT_EQ(sample.find("probesidecar_device_up"), std::string::npos) << sample;
  }
}

TEST(MetricsTest, ProbeSetLabelsAreBounded) {
  Metrics metrics = NewMetrics();
  for (int i = 0; i < kMaxLabelledSeries + 100; ++i) {
    metrics.RpcStarted(Rpc::kScore);
    metrics.RpcFinished(Rpc::kScore, absl::StatusCode::kOk, 1e-4, absl::StrCat("set", i), "cpu");
  }
  const std::map<std::string, double> s = Samples(metrics.Serialize());
  int labelled = 0;
  for (const auto& [line, value] : s) {
    if (absl::StartsWith(line, "probesidecar_rpc_duration_seconds_count")) ++labelled;
  }
  EXPECT_EQ(labelled, kMaxLabelledSeries + 1);  // + probe_set="_other"
  EXPECT_EQ(s.at("probesidecar_rpc_duration_seconds_count{rpc=\"Score\",probe_set=\"_other\","
                 "kernel_path=\"cpu\"}"),
            100);
  EXPECT_EQ(s.at("probesidecar_rpc_duration_seconds_count{rpc=\"Score\",probe_set=\"set0\","
                 "kernel_path=\"cpu\"}"),
            1);
}

}  // namespace
}  // namespace probesidecar::server

namespace probesidecar::server {
namespace {

// The probe-outcome families: counters and a cumulative histogram per probe, labelled with the
// set, the probe and the session labels (an empty value is an absent label to Prometheus).
TEST(MetricsTest, ProbeOutcomeSeries) {
  Metrics metrics(BuildInfo{}, [] {
    MetricsState s;
    s.session_labels = {"model", "replica"};
    ProbeSetOutcomeSeries& set = s.probe_outcomes.emplace_back();
    set.probe_set = "s";
    set.label_values = {"m", ""};
    set.bounds = {0.5, 1.0};
    set.rows = 10;
    set.probes.push_back({"a", 10, 3, 1, {4, 5, 0}, 4.5});
    ProbeSetOutcomeSeries& big = s.probe_outcomes.emplace_back();
    big.probe_set = "big";
    big.label_values = {"_other", "_other"};
    big.bounds = {0.5};
    big.rows = 2;
    big.probes.push_back({kAllProbes, 200, 7, 0, {150, 50}, 0});
    return s;
  });
  const std::map<std::string, double> s = Samples(metrics.Serialize());
  const std::string a = "probe_set=\"s\",probe=\"a\",model=\"m\",replica=\"\"";
  EXPECT_EQ(s.at("probesidecar_probe_set_rows_scored_total{probe_set=\"s\",model=\"m\","
                 "replica=\"\"}"),
            10);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_scored_total{", a, "}")), 10);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_fired_total{", a, "}")), 3);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_non_finite_scores_total{", a, "}")), 1);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_score_bucket{", a, ",le=\"0.5\"}")), 4);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_score_bucket{", a, ",le=\"1\"}")), 9);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_score_bucket{", a, ",le=\"+Inf\"}")), 9);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_score_count{", a, "}")), 9);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_score_sum{", a, "}")), 4.5);
  const std::string all = "probe_set=\"big\",probe=\"_all\",model=\"_other\",replica=\"_other\"";
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_fired_total{", all, "}")), 7);
  EXPECT_EQ(s.at(absl::StrCat("probesidecar_probe_score_bucket{", all, ",le=\"+Inf\"}")), 200);
}

// No outcome yet: the families exist (with their help and type), without series.
TEST(MetricsTest, ProbeOutcomeFamiliesExistFromTheStart) {
  const std::string text = NewMetrics().Serialize();
  for (const char* family :
       {"probesidecar_probe_set_rows_scored_total", "probesidecar_probe_scored_total",
        "probesidecar_probe_fired_total", "probesidecar_probe_non_finite_scores_total",
        "probesidecar_probe_score"}) {
    EXPECT_TRUE(absl::StrContains(text, absl::StrCat("# TYPE ", family, " "))) << family;
  }
}

}  // namespace
}  // namespace probesidecar::server
