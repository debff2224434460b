// Path names, support checks and the dispatcher. Plain C++ (no device code), so that the CPU-only
// tests can check the dispatcher without a GPU.
#include "kernels/probe_score/probe_score.h"

namespace probesidecar::kernels {

const char* ProbeScorePathName(ProbeScorePath path) {
  switch (path) {
    case ProbeScorePath::kFusedCuda:
      return "fused_cuda";
    case ProbeScorePath::kFusedTensorCore:
      return "fused_tc";
    case ProbeScorePath::kGatherGemm:
      return "gather_gemm";
  }
  return "unknown";
}

bool ProbeScorePathSupports(ProbeScorePath path, DType dtype, int32_t num_probes,
                            int32_t hidden) {
  if (num_probes < 1 || hidden < 1) return false;
  switch (path) {
    case ProbeScorePath::kFusedCuda:
    case ProbeScorePath::kGatherGemm:
      return true;
    case ProbeScorePath::kFusedTensorCore:
      // mma.sync takes bf16/fp16 only (fp32 would need TF32: above the 1e-5 budget), and the
      // gathered A tiles move in 16-byte chunks of 8 elements.
      return dtype != DType::kFloat32 && hidden % 8 == 0;
  }
  return false;
}

// Crossovers (PLACEHOLDER until measured; see bench/results/probe_score.md).
ProbeScorePath ChooseProbeScorePath(int32_t num_rows, int32_t num_probes, int32_t hidden,
                                    DType dtype) {
  if (dtype == DType::kFloat32) {
    if (num_probes <= 16) return ProbeScorePath::kFusedCuda;
    if (num_rows <= 64 && num_probes <= 128) return ProbeScorePath::kFusedCuda;
    return ProbeScorePath::kGatherGemm;
  }
  if (!ProbeScorePathSupports(ProbeScorePath::kFusedTensorCore, dtype, num_probes, hidden)) {
    return num_probes <= 16 ? ProbeScorePath::kFusedCuda : ProbeScorePath::kGatherGemm;
  }
  if (num_rows >= 2048 && num_probes >= 512) return ProbeScorePath::kGatherGemm;
  return ProbeScorePath::kFusedTensorCore;
}

}  // namespace probesidecar::kernels
