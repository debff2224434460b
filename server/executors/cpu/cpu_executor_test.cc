// The CPU executor under concurrency (also run under ThreadSanitizer): many callers, jobs split
// into tasks across the workers, a full queue, and shutdown with work queued. Every job's
// callback runs exactly once, and accepted jobs score what the CPU scorer scores alone.
#include "server/executors/cpu/cpu_executor.h"

#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "kernels/probe_score/probe_score_cpu.h"

namespace probesidecar::server {
namespace {

// A job of `rows` rows over [T=rows, H] float32 activations and a set of P probes; big enough
// (H * P multiply-adds per row) that the executor splits it into several tasks.
struct OwnedJob {
  OwnedJob(int32_t rows, int32_t hidden, int32_t probes, float seed) {
    auto set = std::make_shared<ProbeSet>();
    set->hidden = hidden;
    set->num_probes = probes;
    set->weight.resize(static_cast<size_t>(hidden) * probes);
    set->bias.resize(probes);
    for (size_t i = 0; i < set->weight.size(); ++i) set->weight[i] = std::sin(seed + i) / hidden;
    for (int32_t p = 0; p < probes; ++p) set->bias[p] = seed * p;
    activations.resize(static_cast<size_t>(rows) * hidden);
    for (size_t i = 0; i < activations.size(); ++i) activations[i] = std::cos(seed * i);
    for (int32_t r = 0; r < rows; ++r) row_ids.push_back(rows - 1 - r);
    scores.resize(static_cast<size_t>(rows) * probes);
    job.probe_set = set;
    job.activations.dtype = common::DType::kFloat32;
    job.activations.rows = rows;
    job.activations.cols = hidden;
    job.activations.row_stride = hidden;
    job.activations.host = activations.data();
    job.rows = row_ids.data();
    job.num_rows = rows;
    job.host_out = scores.data();
  }

  std::vector<float> Expected() const {
    const ProbeSet& set = *job.probe_set;
    std::vector<float> out(scores.size());
    kernels::ProbeScoreCpuParams params;
    params.x = activations.data();
    params.x_row_stride = set.hidden;
    params.rows = row_ids.data();
    params.num_rows = job.num_rows;
    params.weight = set.weight.data();
    params.bias = set.bias.data();
    params.hidden = set.hidden;
    params.num_probes = set.num_probes;
    params.out = out.data();
    params.out_row_stride = set.num_probes;
    kernels::ScoreProbesCpu(params, 0, job.num_rows);
    return out;
  }

  std::vector<float> activations;
  std::vector<int32_t> row_ids;
  std::vector<float> scores;
  ScoreJob job;
  std::atomic<int> calls{0};
  absl::Status status;
};

TEST(CpuExecutorTest, ConcurrentCallersEachGetTheirScoresOnce) {
  CpuExecutor executor(4, 1024);
  constexpr int kCallers = 4;
  constexpr int kJobsPerCaller = 6;
  std::vector<std::unique_ptr<OwnedJob>> jobs;
  for (int i = 0; i < kCallers * kJobsPerCaller; ++i) {
    // 64 rows x 4096 x 32 probes: 8 tasks per job.
    jobs.push_back(std::make_unique<OwnedJob>(64, 4096, 32, 0.1f * (i + 1)));
  }
  std::atomic<int> finished{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < kCallers; ++c) {
    callers.emplace_back([&, c] {
      for (int j = 0; j < kJobsPerCaller; ++j) {
        OwnedJob* job = jobs[c * kJobsPerCaller + j].get();
        executor.Score(&job->job, [job, &finished](absl::Status status, const ScoreTimings&) {
          job->status = status;
          job->calls.fetch_add(1);
          finished.fetch_add(1);
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  executor.Shutdown();
  EXPECT_EQ(finished.load(), kCallers * kJobsPerCaller);
  for (const auto& job : jobs) {
    EXPECT_EQ(job->calls.load(), 1);
    ASSERT_TRUE(job->status.ok()) << job->status;
    EXPECT_EQ(job->scores, job->Expected());
  }
}

TEST(CpuExecutorTest, AFullQueueRefusesAndShutdownAnswersEveryJobOnce) {
  CpuExecutor executor(1, 4);
  std::vector<std::unique_ptr<OwnedJob>> jobs;
  for (int i = 0; i < 16; ++i) jobs.push_back(std::make_unique<OwnedJob>(64, 4096, 32, 1.0f + i));
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int j = 0; j < 4; ++j) {
        OwnedJob* job = jobs[c * 4 + j].get();
        executor.Score(&job->job, [job](absl::Status status, const ScoreTimings&) {
          job->status = status;
          job->calls.fetch_add(1);
        });
      }
    });
  }
  for (std::thread& t : callers) t.join();
  executor.Shutdown();  // with work still queued
  int refused = 0;
  for (const auto& job : jobs) {
    EXPECT_EQ(job->calls.load(), 1);
    if (job->status.ok()) {
      EXPECT_EQ(job->scores, job->Expected());
    } else {
      EXPECT_EQ(job->status.code(), absl::StatusCode::kResourceExhausted) << job->status;
      ++refused;
    }
  }
  EXPECT_GT(refused, 0);  // 16 jobs of 8 tasks each against a queue of 4 tasks
}

}  // namespace
}  // namespace probesidecar::server
