// The CPU backend: probe scoring on the CPU's threads (inline tensors only). Large requests are
// split into tasks that run in parallel; the CPU scorer accumulates in float32 like the GPU.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "server/executors/drop_counter.h"
#include "server/executors/executor.h"
#include "server/executors/worker_pool.h"

namespace probesidecar::server {

class CpuExecutor final : public Executor {
 public:
  // threads == 0: one per core. At most `max_queued_requests` requests wait for a thread (a
  // request waits until its first task starts, however many tasks it is split into); more are
  // refused with RESOURCE_EXHAUSTED. `outcome_slots`: the label slots a request may count its
  // probe outcomes in (OutcomeLabels::max_slots()).
  CpuExecutor(uint32_t threads, size_t max_queued_requests, int outcome_slots = 2);
  ~CpuExecutor() override;

  // backend "cpu", kernel path "cpu", no devices.
  const ExecutorInfo& info() const override { return info_; }
  // A fast set gets a place for its rounded weights (cpu_probe_weights.h); a counted set gets its
  // outcome counters (cpu_outcome_counters.h): a CpuPlacement.
  absl::Status Place(ProbeSet& set) override;
  // Nothing to capture: `done` at once.
  void Warmup(std::shared_ptr<const ProbeSet> set, WarmupDone done) override;
  // Score: before each task the job's lifetime is checked: a request whose deadline passed or
  // whose caller went away runs no further task and answers DEADLINE_EXCEEDED or CANCELLED.
  // Verify: FAILED_PRECONDITION (it needs the CUDA backend).
  void Submit(ExecutorTask task) override;
  // Its queue: the requests waiting, the capacity, those dropped (no outcome copy to make).
  ExecutorStats ReadStats(const StatsRead& read) override;
  // Counted on the host by the tasks that score (each its rows, after scoring them).
  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override;
  // Queued tasks finish first; the deadline is not needed (no device).
  bool ShutdownBy(absl::Time deadline) override;

 private:
  // Takes a place in the queue; false when all `capacity_` are taken.
  bool TryEnqueue();
  void RunScore(std::unique_ptr<ScoreJob> job, ScoreDone done);

  const ExecutorInfo info_;
  const size_t capacity_;
  const int outcome_slots_;
  std::atomic<uint64_t> waiting_{0};  // requests none of whose tasks has started
  DropCounter drops_;
  WorkerPool pool_;  // tasks: unbounded here, the requests they come from are bounded above
};

}  // namespace probesidecar::server
