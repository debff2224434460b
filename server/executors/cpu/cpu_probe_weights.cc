#include "server/executors/cpu/cpu_probe_weights.h"

#include "kernels/probe_score/probe_score_cpu.h"

namespace probesidecar::server {

std::unique_ptr<const CpuProbeWeights> CpuProbeWeights::For(const ProbeSet& set) {
  if (set.precision != kernels::ProbePrecision::kFast) return nullptr;
  return std::make_unique<const CpuProbeWeights>();
}

const float* CpuProbeWeights::Rounded(const ProbeSet& set, common::DType dtype) const {
  const int i = static_cast<int>(dtype);
  std::call_once(once_[i], [&] {
    rounded_[i].resize(set.weight.size());
    kernels::RoundProbeWeights(set.weight.data(), static_cast<int64_t>(set.weight.size()), dtype,
                               rounded_[i].data());
  });
  return rounded_[i].data();
}

bool CpuRoundingIsIdentity(const ProbeSet& set, common::DType dtype) {
  return set.weight_dtype == dtype;
}

const float* CpuRoundedWeights(const ProbeSet& set, const CpuProbeWeights* weights,
                               common::DType dtype) {
  if (!kernels::UsesRoundedWeights(set.precision, dtype) || weights == nullptr) return nullptr;
  if (CpuRoundingIsIdentity(set, dtype)) return set.weight.data();  // their own rounding
  return weights->Rounded(set, dtype);
}

}  // namespace probesidecar::server
