// The CPU backend's state for a fast probe set: its weights rounded to each 16-bit activation
// type, made once, on the first request of that type (so a set scored only on bf16 never holds
// an fp16 copy, and no request pays the rounding again).
#pragma once

#include <memory>
#include <mutex>
#include <vector>

#include "common/dtype.h"
#include "server/probes/probe_set.h"

namespace probesidecar::server {

class CpuProbeWeights {
 public:
  // What the CPU backend keeps for `set` (CpuPlacement::weights): for a fast set, a
  // CpuProbeWeights; an exact set scores its file weights and needs none (nullptr).
  static std::unique_ptr<const CpuProbeWeights> For(const ProbeSet& set);

  // `set`'s weights rounded to `dtype` ([P, H]), rounding them on the first call for that dtype;
  // thread-safe (other callers wait for that first one). `set` is the set this state belongs to.
  const float* Rounded(const ProbeSet& set, common::DType dtype) const;

 private:
  mutable std::once_flag once_[common::kNumDTypes];
  mutable std::vector<float> rounded_[common::kNumDTypes];
};

// Whether rounding `set`'s weights to `dtype` changes nothing: the file stored them in that type
// (e.g. bf16 weights scored on bf16 activations), so no rounded copy is needed.
bool CpuRoundingIsIdentity(const ProbeSet& set, common::DType dtype);

// The rounded weights to score `set` on `dtype` activations with: the file's own weights when
// rounding is the identity (no copy is made); null when the set's precision does not round them
// there (exact, or float32 activations) or it has no CPU state (`weights` null: then the scorer
// rounds per call).
const float* CpuRoundedWeights(const ProbeSet& set, const CpuProbeWeights* weights,
                               common::DType dtype);

}  // namespace probesidecar::server
