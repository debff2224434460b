// The CPU executor under concurrency (also run under ThreadSanitizer): many callers, jobs split
// into tasks across the workers, a full queue, and shutdown with work queued. Every job's
// callback runs exactly once, and accepted jobs score what the CPU scorer scores alone. And a
// request's lifetime: its queue is bounded by requests (not by the tasks they split into), a
// request whose deadline has passed is not run, and one whose caller goes away stops between
// two tasks.
#include "server/executors/cpu/cpu_executor.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "kernels/probe_score/probe_score_cpu.h"
#include "server/executors/cpu/cpu_placement.h"
#include "server/executors/cpu/cpu_probe_weights.h"
#include "tests/cpp/wait_until.h"

namespace probesidecar::server {
namespace {

// The rounded weights the CPU backend scores `set` (placed) with on `dtype` activations.
const float* RoundedFor(const ProbeSet& set, common::DType dtype) {
  return CpuRoundedWeights(set, set.PlacementAs<CpuPlacement>(kHostPlacement)->weights.get(),
                           dtype);
}

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
        executor.Score(
            std::make_unique<ScoreJob>(job->job),
            [job, &finished](std::unique_ptr<ScoreJob>, absl::Status status, const ScoreTimings&) {
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

// Records the answer in `job`; the test thread reads it once `calls` is 1.
ScoreDone Record(OwnedJob* job) {
  return [job](std::unique_ptr<ScoreJob>, absl::Status status, const ScoreTimings&) {
    job->status = status;
    job->calls.fetch_add(1);
  };
}

TEST(CpuExecutorTest, AFullQueueRefusesAndShutdownAnswersEveryJobOnce) {
  CpuExecutor executor(1, 4);
  // A first request holds the only thread (its first task's lifetime check waits) while the
  // callers send theirs, so that the queue is full whatever the machine's speed: 16 requests
  // against 4 places. (Racing one thread had let a fast machine keep pace, refusing none.)
  absl::Notification sent;
  OwnedJob holder(8, 4096, 32, 0.5f);
  holder.job.lifetime.cancelled = [&sent] {
    sent.WaitForNotification();
    return false;
  };
  executor.Score(std::make_unique<ScoreJob>(holder.job), Record(&holder));
  const bool started = WaitUntil([&] { return executor.stats().queued == 0; });
  if (!started) sent.Notify();  // lets the executor stop
  ASSERT_TRUE(started) << "the first request did not start";
  std::vector<std::unique_ptr<OwnedJob>> jobs;
  for (int i = 0; i < 16; ++i) jobs.push_back(std::make_unique<OwnedJob>(64, 4096, 32, 1.0f + i));
  std::vector<std::thread> callers;
  for (int c = 0; c < 4; ++c) {
    callers.emplace_back([&, c] {
      for (int j = 0; j < 4; ++j) {
        OwnedJob* job = jobs[c * 4 + j].get();
        executor.Score(std::make_unique<ScoreJob>(job->job), Record(job));
      }
    });
  }
  for (std::thread& t : callers) t.join();
  sent.Notify();
  executor.Shutdown();  // with work still queued
  EXPECT_EQ(holder.calls.load(), 1);
  EXPECT_TRUE(holder.status.ok()) << holder.status;
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
  EXPECT_GT(refused, 0);  // 16 jobs against a queue of 4 requests
}

// True once `job` is answered; false if it is not within 30 s.
[[nodiscard]] bool AwaitAnswer(const OwnedJob& job) {
  return WaitUntil([&job] { return job.calls.load() != 0; });
}

// Rows whose scores are those of the CPU scorer alone (the others were never scored: 0).
int ScoredRows(const OwnedJob& job) {
  const std::vector<float> expected = job.Expected();
  const int32_t probes = job.job.probe_set->num_probes;
  int scored = 0;
  for (int32_t r = 0; r < job.job.num_rows; ++r) {
    scored += std::equal(expected.begin() + r * probes, expected.begin() + (r + 1) * probes,
                         job.scores.begin() + r * probes);
  }
  return scored;
}

// 4096 x 64 probes: 2^18 multiply-adds a row, so the executor's tasks are 8 rows each.
constexpr int32_t kHidden = 4096;
constexpr int32_t kProbes = 64;

TEST(CpuExecutorTest, TheQueueIsBoundedByRequestsNotTasks) {
  CpuExecutor executor(1, 3);
  EXPECT_EQ(executor.stats().queue_capacity, 3u);
  // The first request holds the only thread (its first task's lifetime check waits) until its
  // caller goes away; three more of 16 tasks each fill the queue; the fifth is refused at once.
  absl::Notification gone;
  OwnedJob holder(8, kHidden, kProbes, 1.0f);
  holder.job.lifetime.cancelled = [&gone] {
    gone.WaitForNotification();
    return true;
  };
  executor.Score(std::make_unique<ScoreJob>(holder.job), Record(&holder));
  const bool started = WaitUntil([&] { return executor.stats().queued == 0; });
  if (!started) gone.Notify();  // lets the executor stop
  ASSERT_TRUE(started) << "the first request did not start";
  std::vector<std::unique_ptr<OwnedJob>> waiting;
  for (int i = 0; i < 4; ++i) {
    waiting.push_back(std::make_unique<OwnedJob>(128, kHidden, kProbes, 2.0f + i));
    executor.Score(std::make_unique<ScoreJob>(waiting.back()->job), Record(waiting.back().get()));
  }
  EXPECT_EQ(executor.stats().queued, 3u);
  EXPECT_EQ(waiting[3]->calls.load(), 1);  // answered on this thread
  EXPECT_EQ(waiting[3]->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(waiting[3]->status.message().find("--max-queued-requests"), absl::string_view::npos);
  gone.Notify();
  executor.Shutdown();
  EXPECT_EQ(holder.status.code(), absl::StatusCode::kCancelled);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(waiting[i]->calls.load(), 1);
    ASSERT_TRUE(waiting[i]->status.ok()) << waiting[i]->status;
    EXPECT_EQ(waiting[i]->scores, waiting[i]->Expected());
  }
  EXPECT_EQ(executor.stats().queued, 0u);
  EXPECT_EQ(executor.stats().dropped.cancelled, 1u);
}

TEST(CpuExecutorTest, ARequestPastItsDeadlineIsNotRun) {
  CpuExecutor executor(1, 8);
  OwnedJob expired(64, kHidden, kProbes, 1.0f);
  expired.job.lifetime.deadline = absl::Now() - absl::Milliseconds(1);
  executor.Score(std::make_unique<ScoreJob>(expired.job), Record(&expired));
  ASSERT_TRUE(AwaitAnswer(expired));
  EXPECT_EQ(expired.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(ScoredRows(expired), 0);
  EXPECT_EQ(executor.stats().dropped.expired, 1u);
  // The same request with time to spare runs.
  OwnedJob timely(64, kHidden, kProbes, 1.0f);
  timely.job.lifetime.deadline = absl::Now() + absl::Seconds(60);
  executor.Score(std::make_unique<ScoreJob>(timely.job), Record(&timely));
  ASSERT_TRUE(AwaitAnswer(timely));
  EXPECT_TRUE(timely.status.ok()) << timely.status;
  EXPECT_EQ(ScoredRows(timely), 64);
  executor.Shutdown();
  EXPECT_EQ(expired.calls.load() + timely.calls.load(), 2);
}

TEST(CpuExecutorTest, ACancelledRequestStopsBetweenTasks) {
  CpuExecutor executor(2, 8);
  // 256 rows: 32 tasks. The caller goes away once four tasks have started.
  OwnedJob job(256, kHidden, kProbes, 1.0f);
  std::atomic<int> checks{0};
  job.job.lifetime.cancelled = [&checks] { return checks.fetch_add(1) >= 4; };
  executor.Score(std::make_unique<ScoreJob>(job.job), Record(&job));
  ASSERT_TRUE(AwaitAnswer(job));
  executor.Shutdown();
  EXPECT_EQ(job.calls.load(), 1);
  EXPECT_EQ(job.status.code(), absl::StatusCode::kCancelled);
  // Four tasks of 8 rows scored (a task checks once, before it starts); the rest never ran, and
  // once one task had found the caller gone, the others did not even ask again.
  EXPECT_EQ(ScoredRows(job), 4 * 8);
  EXPECT_LE(checks.load(), 4 + 2);
  EXPECT_EQ(executor.stats().dropped.cancelled, 1u);
}

// A fast set scores bf16 activations with its weights rounded to bf16 (rounded once, in the
// set's CPU state, from the worker threads of a job split into tasks); an exact set with the
// file's weights. The weights are not bf16 values, so the two differ.
TEST(CpuExecutorTest, EachSetScoresAtItsPrecision) {
  CpuExecutor executor(3, 16);
  OwnedJob exact_job(64, 4096, 32, 0.3f);
  // bf16 activations: the float32 ones' upper halves, in place (row stride in elements stays H).
  std::vector<uint16_t> bf16(exact_job.activations.size());
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = common::FloatToBf16(exact_job.activations[i]);
  auto fast_set = std::make_shared<ProbeSet>(*exact_job.job.probe_set);
  fast_set->precision = kernels::ProbePrecision::kFast;
  ASSERT_TRUE(executor.Place(*fast_set).ok());
  ASSERT_NE(fast_set->PlacementAs<CpuPlacement>(kHostPlacement)->weights, nullptr);
  auto exact_set = std::make_shared<ProbeSet>(*exact_job.job.probe_set);
  ASSERT_TRUE(executor.Place(*exact_set).ok());
  // exact needs no rounded copy
  EXPECT_EQ(exact_set->PlacementAs<CpuPlacement>(kHostPlacement)->weights, nullptr);

  auto run = [&](std::shared_ptr<const ProbeSet> set) {
    ScoreJob job;
    job.probe_set = set;
    job.activations = exact_job.job.activations;
    job.activations.dtype = common::DType::kBFloat16;
    job.activations.host = bf16.data();
    job.rows = exact_job.row_ids.data();
    job.num_rows = exact_job.job.num_rows;
    std::vector<float> out(exact_job.scores.size());
    job.host_out = out.data();
    absl::Notification done;
    executor.Score(std::make_unique<ScoreJob>(job),
                   [&](std::unique_ptr<ScoreJob>, absl::Status status, const ScoreTimings&) {
                     EXPECT_TRUE(status.ok()) << status;
                     done.Notify();
                   });
    done.WaitForNotification();
    return out;
  };
  auto alone = [&](const ProbeSet& set) {
    kernels::ProbeScoreCpuParams params;
    params.x = bf16.data();
    params.x_dtype = common::DType::kBFloat16;
    params.x_row_stride = set.hidden;
    params.rows = exact_job.row_ids.data();
    params.num_rows = exact_job.job.num_rows;
    params.weight = set.weight.data();
    params.bias = set.bias.data();
    params.hidden = set.hidden;
    params.num_probes = set.num_probes;
    params.precision = set.precision;  // no cache: rounded by the scorer itself
    std::vector<float> out(exact_job.scores.size());
    params.out = out.data();
    params.out_row_stride = set.num_probes;
    kernels::ScoreProbesCpu(params, 0, params.num_rows);
    return out;
  };
  const std::vector<float> fast = run(fast_set);
  const std::vector<float> exact = run(exact_set);
  EXPECT_EQ(fast, alone(*fast_set));
  EXPECT_EQ(run(fast_set), fast);  // the second request reads the rounded copy made by the first
  EXPECT_EQ(exact, alone(*exact_set));
  EXPECT_NE(fast, exact);
  executor.Shutdown();
}

// A fast set whose file stored its weights in the activations' type needs no rounded copy (its
// weights are their own rounding): the lookup hands back the file's weights and makes none.
TEST(CpuExecutorTest, FastWeightsStoredInTheActivationTypeAreNotCopied) {
  auto bf16_set = std::make_shared<ProbeSet>();
  bf16_set->hidden = 64;
  bf16_set->num_probes = 3;
  bf16_set->weight_dtype = common::DType::kBFloat16;
  bf16_set->precision = kernels::ProbePrecision::kFast;
  for (int i = 0; i < 64 * 3; ++i) {
    bf16_set->weight.push_back(common::Bf16ToFloat(common::FloatToBf16(std::sin(0.7f * i))));
  }
  bf16_set->bias = {0.5f, -0.25f, 1.0f};
  CpuExecutor executor(1, 4);
  ASSERT_TRUE(executor.Place(*bf16_set).ok());
  EXPECT_TRUE(CpuRoundingIsIdentity(*bf16_set, common::DType::kBFloat16));
  EXPECT_EQ(RoundedFor(*bf16_set, common::DType::kBFloat16), bf16_set->weight.data());
  // On fp16 activations bf16 weights are not fp16 values: that dtype still gets its copy.
  EXPECT_FALSE(CpuRoundingIsIdentity(*bf16_set, common::DType::kFloat16));
  EXPECT_NE(RoundedFor(*bf16_set, common::DType::kFloat16), nullptr);
  auto float_set = std::make_shared<ProbeSet>(*bf16_set);
  float_set->weight_dtype = common::DType::kFloat32;
  ASSERT_TRUE(executor.Place(*float_set).ok());
  EXPECT_NE(RoundedFor(*float_set, common::DType::kBFloat16), nullptr);
  executor.Shutdown();
}

}  // namespace
}  // namespace probesidecar::server
