// The CPU backend's probe-outcome counters of one probe set (CpuPlacement::outcomes): per
// label slot, SlotWords() relaxed atomics that the tasks of every request add into
// (kernels/probe_outcomes CountProbeOutcomesCpu), allocated on the slot's first request and read
// without a lock.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

class CpuOutcomeCounters {
 public:
  // `slots`: the label slots there can be (OutcomeLabels::max_slots()).
  CpuOutcomeCounters(const ProbeSet& set, int slots);

  // Counts rows [row_begin, row_end) of `scores` ([R, P], contiguous) in `slot`.
  void Count(const float* scores, int32_t row_begin, int32_t row_end, int slot);
  // Every slot's counts so far.
  kernels::ProbeOutcomeCounts Read() const;

 private:
  std::atomic<uint64_t>* Slot(int slot);

  const kernels::ProbeOutcomeLayout layout_;
  const std::vector<float> thresholds_;  // [P], NaN: none
  const std::vector<float> bounds_;
  // [slots]: each slot's words once allocated; only ever set (under mu_), freed with this.
  std::vector<std::atomic<std::atomic<uint64_t>*>> slots_;
  absl::Mutex mu_;
  std::vector<std::unique_ptr<std::atomic<uint64_t>[]>> owned_ ABSL_GUARDED_BY(mu_);
};

}  // namespace probesidecar::server
