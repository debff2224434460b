#include "server/executors/worker_pool.h"

#include <utility>

namespace probesidecar::server {

WorkerPool::WorkerPool(int workers, size_t capacity) : capacity_(capacity) {
  {
    absl::MutexLock lock(&mu_);
    own_.resize(workers);
    takes_shared_.assign(workers, true);
  }
  threads_.reserve(workers);
  for (int i = 0; i < workers; ++i) threads_.emplace_back([this, i] { Loop(i); });
}

WorkerPool::~WorkerPool() { Shutdown(); }

void WorkerPool::Submit(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && shared_.size() < capacity_) {
      shared_.push_back(std::move(task));
      return;
    }
  }
  std::move(task)(kRefused);
}

void WorkerPool::SubmitTo(int worker, Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_ && worker >= 0 && worker < static_cast<int>(own_.size())) {
      own_[worker].push_back(std::move(task));
      return;
    }
  }
  std::move(task)(kRefused);
}

void WorkerPool::SubmitFront(Task task) {
  {
    absl::MutexLock lock(&mu_);
    if (!stopping_) {
      shared_.push_front(std::move(task));
      return;
    }
  }
  std::move(task)(kRefused);
}

void WorkerPool::SetTakesShared(int worker, bool takes) {
  absl::MutexLock lock(&mu_);
  if (worker >= 0 && worker < static_cast<int>(takes_shared_.size())) takes_shared_[worker] = takes;
}

size_t WorkerPool::queued() const {
  absl::MutexLock lock(&mu_);
  return shared_.size();
}

bool WorkerPool::CanRun(int worker) const {
  return stopping_ || (takes_shared_[worker] && !shared_.empty()) || !own_[worker].empty();
}

void WorkerPool::Loop(int worker) {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      auto can_run = [this, worker]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return CanRun(worker); };
      mu_.Await(absl::Condition(&can_run));
      if (!own_[worker].empty()) {
        task = std::move(own_[worker].front());
        own_[worker].pop_front();
      } else if (takes_shared_[worker] && !shared_.empty()) {
        task = std::move(shared_.front());
        shared_.pop_front();
      } else {
        return;  // stopping, and nothing is left for this worker
      }
    }
    std::move(task)(worker);
  }
}

void WorkerPool::Shutdown() {
  absl::MutexLock join(&join_mu_);
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& thread : threads_) {
    if (thread.joinable()) thread.join();
  }
  // Every worker was parked: what is left of the shared queue is refused, so that each task
  // still runs exactly once.
  std::deque<Task> left;
  {
    absl::MutexLock lock(&mu_);
    left.swap(shared_);
  }
  for (Task& task : left) std::move(task)(kRefused);
}

}  // namespace probesidecar::server
