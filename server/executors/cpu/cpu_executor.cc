#include "server/executors/cpu/cpu_executor.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "kernels/probe_score/probe_score_cpu.h"
#include "server/executors/cpu/cpu_placement.h"

namespace probesidecar::server {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point from, Clock::time_point to) {
  return std::chrono::duration<double>(to - from).count();
}

// Work per task, in multiply-adds: big requests split across threads, small ones stay whole.
constexpr int64_t kTaskMacs = int64_t{1} << 21;

int ThreadCount(uint32_t threads) {
  return static_cast<int>(threads != 0 ? threads
                                       : std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace

ExecutorInfo CpuInfo(int threads) {
  ExecutorInfo info;
  info.backend = "cpu";
  info.device_name = absl::StrCat("cpu (", threads, " threads)");
  info.kernel_paths = {"cpu"};
  return info;
}

CpuExecutor::CpuExecutor(uint32_t threads, size_t max_queued_requests, int outcome_slots)
    : info_(CpuInfo(ThreadCount(threads))),
      capacity_(max_queued_requests),
      outcome_slots_(outcome_slots),
      pool_(ThreadCount(threads), std::numeric_limits<size_t>::max()) {}

CpuExecutor::~CpuExecutor() { Shutdown(); }

absl::Status CpuExecutor::Place(ProbeSet& set) {
  auto placed = std::make_shared<CpuPlacement>();
  placed->weights = CpuProbeWeights::For(set);
  // A set whose outcomes are not counted has no counters: nothing is counted, nothing reported.
  if (set.count_outcomes) {
    placed->outcomes = std::make_unique<CpuOutcomeCounters>(set, outcome_slots_);
  }
  set.placements[kHostPlacement] = std::move(placed);
  return absl::OkStatus();
}

void CpuExecutor::Warmup(std::shared_ptr<const ProbeSet> set, WarmupDone done) {
  std::move(done)(absl::OkStatus());
}

ExecutorStats CpuExecutor::ReadStats(const StatsRead& read) {
  ExecutorStats stats;
  stats.queued = waiting_.load(std::memory_order_relaxed);
  stats.queue_capacity = capacity_;
  stats.dropped = drops_.counts();
  return stats;
}

kernels::ProbeOutcomeCounts CpuExecutor::OutcomeCounts(const ProbeSet& set) const {
  const auto* placed = set.PlacementAs<CpuPlacement>(kHostPlacement);
  return placed != nullptr && placed->outcomes != nullptr ? placed->outcomes->Read()
                                                          : kernels::ProbeOutcomeCounts{};
}

void CpuExecutor::Submit(ExecutorTask task) {
  if (auto* score = std::get_if<ScoreTask>(&task)) {
    RunScore(std::move(score->job), std::move(score->done));
    return;
  }
  Refuse(std::move(task), absl::FailedPreconditionError("Verify needs the CUDA backend"));
}

bool CpuExecutor::TryEnqueue() {
  uint64_t waiting = waiting_.load();
  do {
    if (waiting >= capacity_) return false;
  } while (!waiting_.compare_exchange_weak(waiting, waiting + 1));
  return true;
}

void CpuExecutor::RunScore(std::unique_ptr<ScoreJob> owned, ScoreDone done) {
  if (!TryEnqueue()) {
    std::move(done)(std::move(owned),
                    absl::ResourceExhaustedError(absl::StrCat(
                        "the CPU executor's queue is full (", capacity_, " requests wait for ",
                        pool_.workers(), " threads; --max-queued-requests); retry later")),
                    ScoreTimings{});
    return;
  }
  // The tasks share the job (Shared owns it) and read it through `job` until the last reports.
  const ScoreJob* job = owned.get();
  const ProbeSet& set = *job->probe_set;
  const CpuPlacement* placed = set.PlacementAs<CpuPlacement>(kHostPlacement);
  kernels::ProbeScoreCpuParams params;
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
  params.precision = set.precision;
  params.out = job->host_out;
  params.out_row_stride = set.num_probes;

  const int64_t macs_per_row = std::max<int64_t>(1, int64_t{set.hidden} * set.num_probes);
  const int32_t rows_per_task =
      static_cast<int32_t>(std::clamp<int64_t>(kTaskMacs / macs_per_row, 1, job->num_rows));
  const int32_t num_tasks = (job->num_rows + rows_per_task - 1) / rows_per_task;

  // Shared by the tasks; the last one to finish reports. The first failure (refusal at shutdown,
  // lifetime ended) is the answer, and the tasks after it do nothing.
  struct Shared {
    std::unique_ptr<ScoreJob> job;
    ScoreDone done;
    const RequestLifetime* lifetime;
    std::atomic<int32_t> remaining;
    Clock::time_point submitted;
    std::atomic<int64_t> first_start_ns{INT64_MAX};
    std::atomic<bool> left_queue{false};
    std::atomic<bool> failed{false};
    absl::Mutex mu;
    absl::Status status ABSL_GUARDED_BY(mu);

    void Fail(absl::Status s) {
      absl::MutexLock lock(&mu);
      if (status.ok()) status = std::move(s);
      failed.store(true);
    }
  };
  auto shared = std::make_shared<Shared>();
  shared->job = std::move(owned);
  shared->done = std::move(done);
  shared->lifetime = &job->lifetime;
  shared->remaining.store(num_tasks);
  shared->submitted = Clock::now();
  // The request leaves the queue when its first task starts (or is refused).
  auto leave_queue = [this](Shared& s) {
    if (!s.left_queue.exchange(true)) waiting_.fetch_sub(1);
  };

  for (int32_t t = 0; t < num_tasks; ++t) {
    const int32_t begin = t * rows_per_task;
    const int32_t end = std::min(job->num_rows, begin + rows_per_task);
    pool_.Submit([this, job, placed, params, begin, end, shared, leave_queue](int worker) {
      leave_queue(*shared);
      if (worker == WorkerPool::kRefused) {
        shared->Fail(absl::UnavailableError("the CPU executor is shutting down"));
      } else if (!shared->failed.load()) {
        if (absl::Status alive = shared->lifetime->Check(); !alive.ok()) {
          shared->Fail(std::move(alive));
        } else {
          const Clock::time_point start = Clock::now();
          const int64_t start_ns =
              std::chrono::duration_cast<std::chrono::nanoseconds>(start - shared->submitted)
                  .count();
          int64_t seen = shared->first_start_ns.load();
          while (start_ns < seen && !shared->first_start_ns.compare_exchange_weak(seen, start_ns)) {
          }
          // On the worker, not the gRPC thread: the first fast request of a dtype rounds here.
          kernels::ProbeScoreCpuParams task = params;
          task.rounded_weight = CpuRoundedWeights(
              *job->probe_set, placed != nullptr ? placed->weights.get() : nullptr,
              params.x_dtype);
          kernels::ScoreProbesCpu(task, begin, end);
          // The task's rows are in cache: counted here, by the thread that scored them.
          if (placed != nullptr && placed->outcomes != nullptr) {
            placed->outcomes->Count(job->host_out, begin, end, job->outcome_slot);
          }
        }
      }
      if (shared->remaining.fetch_sub(1) == 1) {
        ScoreTimings timings;
        const double total = Seconds(shared->submitted, Clock::now());
        const int64_t first = shared->first_start_ns.load();
        timings.queue = first == INT64_MAX ? total : static_cast<double>(first) * 1e-9;
        timings.kernel = std::max(0.0, total - timings.queue);
        timings.kernel_path = "cpu";
        absl::Status status;
        {
          absl::MutexLock lock(&shared->mu);
          status = shared->status;
        }
        drops_.Count(status);
        std::move(shared->done)(std::move(shared->job), status, timings);
      }
    });
  }
}

bool CpuExecutor::ShutdownBy(absl::Time deadline) {
  pool_.Shutdown();
  return true;
}

}  // namespace probesidecar::server
