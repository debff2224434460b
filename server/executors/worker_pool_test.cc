#include "server/executors/worker_pool.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "gtest/gtest.h"

namespace probesidecar::server {
namespace {

// Keeps workers of a pool inside a task each until Release().
class Blocker {
 public:
  // True once `workers` workers are inside the blocking task; false if they are not within 30 s.
  [[nodiscard]] bool Occupy(WorkerPool& pool, int workers) {
    for (int i = 0; i < workers; ++i) {
      pool.Submit([this](int worker) {
        EXPECT_NE(worker, WorkerPool::kRefused);
        {
          absl::MutexLock lock(&mu_);
          ++entered_;
        }
        release_.WaitForNotification();
      });
    }
    absl::MutexLock lock(&mu_);
    auto entered = [this, workers] {
      mu_.AssertReaderHeld();
      return entered_ >= workers;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&entered), absl::Seconds(30));
  }
  void Release() {
    if (!release_.HasBeenNotified()) release_.Notify();
  }
  // A test that stops early still lets the workers go (the pool, declared first, joins them).
  ~Blocker() { Release(); }

 private:
  absl::Mutex mu_;
  int entered_ ABSL_GUARDED_BY(mu_) = 0;
  absl::Notification release_;
};

TEST(WorkerPoolTest, SubmitNeverWaitsWhileEveryWorkerIsBusy) {
  WorkerPool pool(2, 64);
  Blocker blocker;
  ASSERT_TRUE(blocker.Occupy(pool, 2));
  std::atomic<int> ran{0};
  // 64 submissions while both workers are held, from a thread of their own: each only queues, so
  // they all return while the workers are still held (a Submit that waited for a worker would
  // wait until Release).
  absl::Notification submitted;
  std::thread submitter([&] {
    for (int i = 0; i < 64; ++i) {
      pool.Submit([&ran](int worker) {
        EXPECT_NE(worker, WorkerPool::kRefused);
        ran.fetch_add(1);
      });
    }
    submitted.Notify();
  });
  const bool returned = submitted.WaitForNotificationWithTimeout(absl::Seconds(30));
  EXPECT_TRUE(returned) << "Submit waited for a worker";
  if (returned) {
    EXPECT_EQ(pool.queued(), 64u);
    EXPECT_EQ(ran.load(), 0);
  }
  blocker.Release();
  submitter.join();
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 64);
}

TEST(WorkerPoolTest, AFullQueueRefusesOnTheCallingThreadAndRunsEveryTaskOnce) {
  WorkerPool pool(1, 3);
  Blocker blocker;
  ASSERT_TRUE(blocker.Occupy(pool, 1));
  std::atomic<int> ran{0}, refused{0};
  const std::thread::id caller = std::this_thread::get_id();
  for (int i = 0; i < 5; ++i) {
    pool.Submit([&, caller](int worker) {
      if (worker == WorkerPool::kRefused) {
        EXPECT_EQ(std::this_thread::get_id(), caller);
        refused.fetch_add(1);
      } else {
        ran.fetch_add(1);
      }
    });
  }
  EXPECT_EQ(refused.load(), 2);  // capacity 3: the 4th and 5th
  blocker.Release();
  pool.Shutdown();
  EXPECT_EQ(ran.load(), 3);
}

TEST(WorkerPoolTest, SharedTasksRunInSubmissionOrderOnOneWorker) {
  WorkerPool pool(1, 100);
  Blocker blocker;
  ASSERT_TRUE(blocker.Occupy(pool, 1));
  std::vector<int> order;
  absl::Mutex mu;
  for (int i = 0; i < 20; ++i) {
    pool.Submit([&, i](int) {
      absl::MutexLock lock(&mu);
      order.push_back(i);
    });
  }
  blocker.Release();
  pool.Shutdown();
  ASSERT_EQ(order.size(), 20u);
  for (int i = 0; i < 20; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkerPoolTest, SubmitToRunsOnThatWorkerBeforeItsNextSharedTask) {
  WorkerPool pool(3, 100);
  Blocker blocker;
  ASSERT_TRUE(blocker.Occupy(pool, 3));
  std::vector<std::pair<int, int>> log;  // (task, worker)
  absl::Mutex mu;
  auto record = [&](int task) {
    return [&, task](int worker) {
      absl::MutexLock lock(&mu);
      log.emplace_back(task, worker);
    };
  };
  for (int i = 0; i < 6; ++i) pool.Submit(record(100 + i));
  pool.SubmitTo(1, record(1));
  pool.SubmitTo(2, record(2));
  blocker.Release();
  pool.Shutdown();
  ASSERT_EQ(log.size(), 8u);
  for (int target : {1, 2}) {
    int position = -1;
    for (int i = 0; i < static_cast<int>(log.size()); ++i) {
      if (log[i].first == target) position = i;
    }
    ASSERT_GE(position, 0);
    EXPECT_EQ(log[position].second, target) << "task for worker " << target;
    // No shared task ran on that worker before it.
    for (int i = 0; i < position; ++i) EXPECT_NE(log[i].second, target);
  }
}

// A parked worker (SetTakesShared false) runs its own tasks but no shared one; a task put back
// with SubmitFront runs before those queued behind it; shared tasks that no worker can take at
// shutdown still run once, refused.
TEST(WorkerPoolTest, AParkedWorkerTakesOnlyItsOwnTasks) {
  WorkerPool pool(2, 100);
  pool.SetTakesShared(0, false);
  std::vector<std::pair<int, int>> log;  // (task, worker)
  absl::Mutex mu;
  absl::Notification own_ran;
  auto record = [&](int task) {
    return [&, task](int worker) {
      absl::MutexLock lock(&mu);
      log.emplace_back(task, worker);
    };
  };
  Blocker blocker;
  ASSERT_TRUE(blocker.Occupy(pool, 1));  // worker 1 (the only one taking shared tasks) is busy
  pool.Submit(record(10));
  pool.Submit(record(11));
  pool.SubmitFront(record(9));
  pool.SubmitTo(0, [&](int worker) {
    record(1)(worker);
    own_ran.Notify();
  });
  ASSERT_TRUE(own_ran.WaitForNotificationWithTimeout(absl::Seconds(30)));
  {
    absl::MutexLock lock(&mu);
    EXPECT_EQ(log, (std::vector<std::pair<int, int>>{{1, 0}}));  // no shared task on worker 0
  }
  blocker.Release();
  pool.Shutdown();
  EXPECT_EQ(log, (std::vector<std::pair<int, int>>{{1, 0}, {9, 1}, {10, 1}, {11, 1}}));

  WorkerPool parked(2, 100);
  parked.SetTakesShared(0, false);
  parked.SetTakesShared(1, false);
  int refused = 0;
  for (int i = 0; i < 3; ++i) {
    parked.Submit([&](int worker) { refused += worker == WorkerPool::kRefused; });
  }
  parked.Shutdown();
  EXPECT_EQ(refused, 3);
}

TEST(WorkerPoolTest, AfterShutdownEveryTaskIsRefusedAndStillRuns) {
  WorkerPool pool(2, 10);
  pool.Shutdown();
  int refused = 0;
  pool.Submit([&](int worker) { refused += worker == WorkerPool::kRefused; });
  pool.SubmitTo(0, [&](int worker) { refused += worker == WorkerPool::kRefused; });
  pool.SubmitTo(7, [&](int worker) { refused += worker == WorkerPool::kRefused; });
  EXPECT_EQ(refused, 3);
  pool.Shutdown();  // idempotent
}

TEST(WorkerPoolTest, ShutdownFinishesQueuedWork) {
  std::atomic<int> ran{0};
  {
    WorkerPool pool(2, 1000);
    for (int i = 0; i < 500; ++i) {
      pool.Submit([&ran](int worker) { ran.fetch_add(worker != WorkerPool::kRefused); });
    }
  }  // destructor: Shutdown
  EXPECT_EQ(ran.load(), 500);
}

}  // namespace
}  // namespace probesidecar::server
