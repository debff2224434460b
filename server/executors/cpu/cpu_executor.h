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

  const char* backend() const override { return "cpu"; }
  std::string device_name() const override;
  std::vector<std::string> kernel_paths() const override { return {"cpu"}; }
  // A fast set gets a place for its rounded weights (cpu_probe_weights.h); every set gets its
  // outcome counters (cpu_outcome_counters.h).
  absl::Status PrepareProbeSet(ProbeSet& set) override;
  // Before each task the job's lifetime is checked: a request whose deadline passed or whose
  // caller went away runs no further task and answers DEADLINE_EXCEEDED or CANCELLED.
  void Score(std::unique_ptr<ScoreJob> job, ScoreDone done) override;
  // Its queue: the requests waiting, the capacity, those dropped.
  uint64_t queued() const override { return waiting_.load(std::memory_order_relaxed); }
  ExecutorStats stats() const override {
    ExecutorStats stats;
    stats.queued = queued();
    stats.queue_capacity = capacity_;
    stats.dropped = drops_.counts();
    return stats;
  }
  // Counted on the host by the tasks that score (each its rows, after scoring them).
  kernels::ProbeOutcomeCounts OutcomeCounts(const ProbeSet& set) const override;
  void Shutdown() override;

 private:
  // Takes a place in the queue; false when all `capacity_` are taken.
  bool TryEnqueue();

  const size_t capacity_;
  const int outcome_slots_;
  std::atomic<uint64_t> waiting_{0};  // requests none of whose tasks has started
  DropCounter drops_;
  WorkerPool pool_;  // tasks: unbounded here, the requests they come from are bounded above
};

}  // namespace probesidecar::server
