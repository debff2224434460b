#include "server/cpu_executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>

#include "absl/strings/str_cat.h"
#include "kernels/probe_score/probe_score_ref.h"

namespace probesidecar::server {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Work per task, in multiply-adds: big requests split across threads, small ones stay whole.
constexpr int64_t kTaskMacs = int64_t{1} << 21;

}  // namespace

CpuExecutor::CpuExecutor(uint32_t threads) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  workers_.reserve(threads);
  for (uint32_t i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

CpuExecutor::~CpuExecutor() { Shutdown(); }

std::string CpuExecutor::device_name() const {
  return absl::StrCat("cpu (", workers_.size(), " threads)");
}

void CpuExecutor::Score(const ScoreJob* job, ScoreDone done) {
  const ProbeSet& set = *job->probe_set;
  kernels::ProbeScoreRefParams params;
  params.x = job->activations.host;
  params.x_dtype = job->activations.dtype;
  params.x_row_stride = job->activations.row_stride;
  params.rows = job->rows;
  params.num_rows = job->num_rows;
  params.weight = set.weight.data();
  params.bias = set.bias.data();
  params.hidden = set.hidden;
  params.num_probes = set.num_probes;
  params.activation = set.activation;
  params.out = job->host_out;
  params.out_row_stride = set.num_probes;

  const int64_t macs_per_row = std::max<int64_t>(1, int64_t{set.hidden} * set.num_probes);
  const int32_t rows_per_task =
      static_cast<int32_t>(std::clamp<int64_t>(kTaskMacs / macs_per_row, 1, job->num_rows));
  const int32_t num_tasks = (job->num_rows + rows_per_task - 1) / rows_per_task;

  // Shared by the tasks; the last one to finish reports.
  struct Shared {
    ScoreDone done;
    std::atomic<int32_t> remaining;
    Clock::time_point submitted;
    std::atomic<int64_t> first_start_ns{INT64_MAX};
  };
  auto shared = std::make_shared<Shared>();
  shared->done = std::move(done);
  shared->remaining.store(num_tasks);
  shared->submitted = Clock::now();

  std::vector<Task> tasks;
  tasks.reserve(num_tasks);
  for (int32_t t = 0; t < num_tasks; ++t) {
    const int32_t begin = t * rows_per_task;
    const int32_t end = std::min(job->num_rows, begin + rows_per_task);
    tasks.emplace_back([params, begin, end, shared] {
      const Clock::time_point start = Clock::now();
      const int64_t start_ns =
          std::chrono::duration_cast<std::chrono::nanoseconds>(start - shared->submitted).count();
      int64_t seen = shared->first_start_ns.load();
      while (start_ns < seen && !shared->first_start_ns.compare_exchange_weak(seen, start_ns)) {
      }
      kernels::ProbeScoreRef(params, begin, end);
      if (shared->remaining.fetch_sub(1) == 1) {
        ScoreTimings timings;
        const double total = Seconds(shared->submitted, Clock::now());
        timings.queue = static_cast<double>(shared->first_start_ns.load()) * 1e-9;
        timings.kernel = std::max(0.0, total - timings.queue);
        timings.kernel_path = "cpu";
        std::move(shared->done)(absl::OkStatus(), timings);
      }
    });
  }
  Enqueue(std::move(tasks));
}

void CpuExecutor::Enqueue(std::vector<Task> tasks) {
  absl::MutexLock lock(&mu_);
  for (Task& task : tasks) queue_.push_back(std::move(task));
}

void CpuExecutor::WorkerLoop() {
  while (true) {
    Task task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &CpuExecutor::HasWorkOrStopping));
      if (queue_.empty()) return;  // stopping, and the queue is drained
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    std::move(task)();
  }
}

bool CpuExecutor::HasWorkOrStopping() const { return stopping_ || !queue_.empty(); }

void CpuExecutor::Shutdown() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (std::thread& worker : workers_) {
    if (worker.joinable()) worker.join();
  }
  workers_.clear();
}

}  // namespace probesidecar::server
