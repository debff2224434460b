// What executors do with a request's lifetime and with their queue bound: the CPU executor bounds
// its queue by requests (not by the tasks they split into), does not run a request whose deadline
// has passed or whose caller has gone, stops a running one between tasks, and answers each
// exactly once; the test-only fault injector fails every Nth request with INTERNAL.
#include <atomic>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"
#include "server/executors/cpu/cpu_executor.h"
#include "server/executors/fault_injection.h"

namespace probesidecar::server {
namespace {

constexpr int32_t kHidden = 4096;
constexpr int32_t kProbes = 64;  // 2^18 multiply-adds a row: the CPU executor's tasks are 8 rows

// A job over its own activations and probe set; scores start as NaN, so rows that were never
// scored show.
struct OwnedJob {
  explicit OwnedJob(int32_t rows) {
    auto set = std::make_shared<ProbeSet>();
    set->name = "lifetime";
    set->hidden = kHidden;
    set->num_probes = kProbes;
    set->weight.assign(static_cast<size_t>(kHidden) * kProbes, 0.5f / kHidden);
    set->bias.assign(kProbes, 0.0f);
    activations.assign(static_cast<size_t>(rows) * kHidden, 1.0f);
    for (int32_t r = 0; r < rows; ++r) row_ids.push_back(r);
    scores.assign(static_cast<size_t>(rows) * kProbes, std::numeric_limits<float>::quiet_NaN());
    job.probe_set = set;
    job.activations.rows = rows;
    job.activations.cols = kHidden;
    job.activations.row_stride = kHidden;
    job.activations.host = activations.data();
    job.rows = row_ids.data();
    job.num_rows = rows;
    job.host_out = scores.data();
  }

  int scored_rows() const {
    int n = 0;
    for (size_t r = 0; r < row_ids.size(); ++r) n += !std::isnan(scores[r * kProbes]);
    return n;
  }

  ScoreDone Done() {
    return [this](absl::Status s, const ScoreTimings&) {
      status = s;
      calls.fetch_add(1);
      answered.Notify();
    };
  }

  std::vector<float> activations;
  std::vector<int32_t> row_ids;
  std::vector<float> scores;
  ScoreJob job;
  std::atomic<int> calls{0};
  absl::Status status;
  absl::Notification answered;
};

TEST(ExecutorLifetimeTest, TheCpuQueueIsBoundedByRequestsNotTasks) {
  CpuExecutor executor(1, 3);
  EXPECT_EQ(executor.queue_capacity(), 3u);
  // The first request holds the only thread (its first task's lifetime check waits) until its
  // caller goes away; three more (64 tasks each) fill the queue; the fifth is refused at once.
  absl::Notification gone;
  OwnedJob blocker(64);
  blocker.job.lifetime.cancelled = [&gone] {
    gone.WaitForNotification();
    return true;
  };
  executor.Score(&blocker.job, blocker.Done());
  while (executor.queued() != 0) absl::SleepFor(absl::Milliseconds(1));  // it started
  std::vector<std::unique_ptr<OwnedJob>> waiting;
  for (int i = 0; i < 4; ++i) {
    waiting.push_back(std::make_unique<OwnedJob>(512));
    executor.Score(&waiting.back()->job, waiting.back()->Done());
  }
  EXPECT_EQ(executor.queued(), 3u);
  ASSERT_TRUE(waiting[3]->answered.HasBeenNotified());
  EXPECT_EQ(waiting[3]->status.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(waiting[3]->status.message().find("--max-queued-requests"), absl::string_view::npos);
  gone.Notify();
  executor.Shutdown();
  EXPECT_EQ(blocker.status.code(), absl::StatusCode::kCancelled);
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(waiting[i]->calls.load(), 1);
    EXPECT_TRUE(waiting[i]->status.ok()) << waiting[i]->status;
    EXPECT_EQ(waiting[i]->scored_rows(), 512);
  }
  EXPECT_EQ(executor.queued(), 0u);
  EXPECT_EQ(executor.dropped().cancelled, 1u);
}

TEST(ExecutorLifetimeTest, ARequestPastItsDeadlineIsNotRun) {
  CpuExecutor executor(1, 8);
  OwnedJob expired(64);
  expired.job.lifetime.deadline = absl::Now() - absl::Milliseconds(1);
  executor.Score(&expired.job, expired.Done());
  expired.answered.WaitForNotification();
  EXPECT_EQ(expired.status.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(expired.scored_rows(), 0);
  EXPECT_EQ(executor.dropped().expired, 1u);
  // The same job with time to spare runs.
  OwnedJob timely(64);
  timely.job.lifetime.deadline = absl::Now() + absl::Seconds(60);
  executor.Score(&timely.job, timely.Done());
  timely.answered.WaitForNotification();
  EXPECT_TRUE(timely.status.ok()) << timely.status;
  EXPECT_EQ(timely.scored_rows(), 64);
  executor.Shutdown();
  EXPECT_EQ(expired.calls.load() + timely.calls.load(), 2);
}

TEST(ExecutorLifetimeTest, ACancelledRequestStopsBetweenTasks) {
  CpuExecutor executor(2, 8);
  // 2048 rows: 256 tasks. The caller goes away once a few tasks have run.
  OwnedJob job(2048);
  std::atomic<int> checks{0};
  job.job.lifetime.cancelled = [&checks] { return checks.fetch_add(1) >= 4; };
  executor.Score(&job.job, job.Done());
  job.answered.WaitForNotification();
  executor.Shutdown();
  EXPECT_EQ(job.calls.load(), 1);
  EXPECT_EQ(job.status.code(), absl::StatusCode::kCancelled);
  // Four tasks of 8 rows scored (a task checks once, before it starts); the rest never ran, and
  // the tasks after the failure did not even ask again.
  EXPECT_EQ(job.scored_rows(), 4 * 8);
  EXPECT_LE(checks.load(), 4 + 2);
  EXPECT_EQ(executor.dropped().cancelled, 1u);
}

TEST(ExecutorLifetimeTest, TheFaultInjectorFailsEveryNthRequestWithInternal) {
  std::unique_ptr<Executor> executor = InjectFaults(std::make_unique<CpuExecutor>(1, 16), 3);
  std::vector<std::unique_ptr<OwnedJob>> jobs;
  for (int i = 0; i < 7; ++i) {
    jobs.push_back(std::make_unique<OwnedJob>(8));
    executor->Score(&jobs.back()->job, jobs.back()->Done());
    jobs.back()->answered.WaitForNotification();
  }
  executor->Shutdown();
  for (int i = 0; i < 7; ++i) {
    EXPECT_EQ(jobs[i]->calls.load(), 1);
    if ((i + 1) % 3 == 0) {
      EXPECT_EQ(jobs[i]->status.code(), absl::StatusCode::kInternal) << i;
      EXPECT_NE(jobs[i]->status.message().find("test-only"), absl::string_view::npos);
    } else {
      EXPECT_TRUE(jobs[i]->status.ok()) << i << ": " << jobs[i]->status;
    }
  }
}

}  // namespace
}  // namespace probesidecar::server
