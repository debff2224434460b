// Worker threads fed from one bounded queue: what lets the executors take work from gRPC's
// callback threads without ever making them wait.
//
// Any worker takes the next task of the shared queue (first come, first served). Work that must
// run on one particular worker — because that worker owns a CUDA stream slot, say — goes to that
// worker's own queue and runs before its next shared task. Submitting never blocks: a task that
// cannot be queued (the queue is full, or the pool is shutting down) runs at once on the calling
// thread with worker == kRefused, so every task runs exactly once and its owner always hears
// whether it ran.
//
// A worker can be told to take no shared tasks for a while (SetTakesShared): the CUDA executor
// parks a worker whose stream slot still waits on the GPU, and its own queue still runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/synchronization/mutex.h"

namespace probesidecar::server {

class WorkerPool {
 public:
  // The worker index a task runs with, or kRefused.
  using Task = absl::AnyInvocable<void(int worker) &&>;
  static constexpr int kRefused = -1;

  // Starts `workers` threads; the shared queue holds at most `capacity` waiting tasks.
  WorkerPool(int workers, size_t capacity);
  // Shutdown().
  ~WorkerPool();
  WorkerPool(const WorkerPool&) = delete;
  WorkerPool& operator=(const WorkerPool&) = delete;

  // Queues `task` for the next free worker, or runs task(kRefused) now when the shared queue
  // holds `capacity` tasks already or the pool is shutting down.
  void Submit(Task task);

  // Queues `task` for worker `worker` (ahead of its shared work; not bounded: for the pool's
  // owner's own control work, e.g. capturing graphs on a stream slot), or runs task(kRefused)
  // now when the pool is shutting down or `worker` is out of range.
  void SubmitTo(int worker, Task task);

  // Puts `task` back at the head of the shared queue (a worker took it and cannot run it); runs
  // task(kRefused) now when the pool is shutting down.
  void SubmitFront(Task task);

  // Whether `worker` takes tasks from the shared queue (initially true). Its own queue runs
  // either way.
  void SetTakesShared(int worker, bool takes);

  // Refuses new tasks, lets the workers finish every queued one, and joins them; shared tasks
  // that no worker took (every one was parked) then run here with kRefused. Idempotent.
  void Shutdown();

  int workers() const { return static_cast<int>(threads_.size()); }
  size_t capacity() const { return capacity_; }
  // Tasks waiting in the shared queue (not counting those running).
  size_t queued() const;

 private:
  void Loop(int worker);
  bool CanRun(int worker) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const size_t capacity_;
  mutable absl::Mutex mu_;
  std::deque<Task> shared_ ABSL_GUARDED_BY(mu_);
  std::vector<std::deque<Task>> own_ ABSL_GUARDED_BY(mu_);
  std::vector<bool> takes_shared_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
  absl::Mutex join_mu_;  // one Shutdown joins
};

}  // namespace probesidecar::server
