// What a CUDA executor attaches to a probe set it places (ProbeSet::placements[device]): the
// device copy of its weights and the counters of its probes' outcomes on that device. Both are
// freed through the executor's DeviceMemoryLedger once the set's last reference drops (which every
// request holds until the GPU is done with it).
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kernels/probe_score/probe_score.h"
#include "server/executors/cuda/device_memory_ledger.h"
#include "server/executors/cuda/device_outcome_counters.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

struct CudaPlacement final : ProbeSetPlacement {
  std::shared_ptr<const kernels::ProbeWeights> weights;
  std::shared_ptr<DeviceOutcomeCounters> outcomes;
};

// Uploads `set`'s weights and its outcome tables to `device` (synchronously: load time only) with
// `outcome_slots` label slots; the bytes are counted in, and freed through, `ledger`.
absl::StatusOr<std::shared_ptr<const CudaPlacement>> PlaceOnDevice(
    const ProbeSet& set, int device, int outcome_slots, std::shared_ptr<DeviceMemoryLedger> ledger);

}  // namespace probesidecar::server
