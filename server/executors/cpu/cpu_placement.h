// What the CPU backend attaches to a probe set it places (ProbeSet::placements[kHostPlacement]):
// the rounded copies of a fast set's weights, and the counters of its probes' outcomes.
#pragma once

#include <memory>

#include "server/executors/cpu/cpu_outcome_counters.h"
#include "server/executors/cpu/cpu_probe_weights.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

struct CpuPlacement final : ProbeSetPlacement {
  std::unique_ptr<const CpuProbeWeights> weights;  // null for an exact set (CpuProbeWeights::For)
  std::unique_ptr<CpuOutcomeCounters> outcomes;    // null for a set whose outcomes are not counted
};

}  // namespace probesidecar::server
