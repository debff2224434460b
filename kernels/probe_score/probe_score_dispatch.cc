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

bool ProbeScorePathSupports(ProbeScorePath path, common::DType dtype, int32_t num_probes, int32_t hidden) {
  if (num_probes < 1 || hidden < 1) return false;
  switch (path) {
    case ProbeScorePath::kFusedCuda:
    case ProbeScorePath::kGatherGemm:
      return true;
    case ProbeScorePath::kFusedTensorCore:
      // mma.sync takes bf16/fp16 only (fp32 would need TF32: above the 1e-5 budget), and the
      // gathered A tiles move in 16-byte chunks of 8 elements.
      return dtype != common::DType::kFloat32 && hidden % 8 == 0;
  }
  return false;
}

// Crossovers measured on the H200, run 2 (bench/results/probe_score_cuda.json, tables in
// bench/results/probe_score.md "Crossovers"; graph replay p50 µs, bf16 H = 4096 unless noted):
//  - P <= 2: fused_cuda everywhere (R=8192 P=1: 22.9 vs fused_tc 23.4, gather_gemm 82.6; R=1:
//    6.6 vs 7.2 / 9.2).
//  - 16-bit, 3 <= P <= 8: fused_cuda up to 512 rows (R=256 P=4: 8.1 vs 7.8, R=64: 7.4 vs 7.6),
//    fused_tc beyond (R=1024 P=4: 64x16k128 10.3 vs 10.7; R=8192: 23.6 vs 27.5).
//  - 16-bit, 9 <= P <= 128: fused_tc (R=1 P=16: 7.4 vs fused_cuda 8.0; R=64 P=128: 9.8 vs
//    gather_gemm 12.6; R=8192 P=128: 47.0 vs 66.3), except P > 16 at R <= 8 where fused_cuda
//    wins (R=1 P=64: 8.0 vs 8.6; R=8 P=128: 8.7 vs 9.0).
//  - 16-bit, 128 < P <= 256: fused_tc up to 256 rows (R=64 P=256: 10.0 vs 13.0; R=256: 13.4
//    vs 13.7), gather_gemm beyond (R=1024: 18.8 vs 22.7).
//  - 16-bit, P > 256: fused_tc up to 64 rows (R=64 P=1024: 64x64 with 16 splits 11.7 vs
//    gather_gemm 13.3; R=1: 10.2 vs 11.2), gather_gemm beyond (R=256: 17.2 vs 22.7; R=8192:
//    162.7 vs 215.6: our mma.sync GEMM reaches ~320 TFLOP/s, cuBLAS ~800 with wgmma).
//  - fp32 (no tensor cores: TF32 would break the 1e-5 budget): fused_cuda for P <= 16, and up to
//    P = 128 for R <= 64 (R=64 P=128: 11.8 vs 18.8); gather_gemm (cuBLAS SGEMM) otherwise
//    (R=1024 P=64: 38.7 vs 46.8; R=8192 P=64: 177.6 vs 214.0; R=1 P=1024: 11.4 vs 20.5).
//  - H % 8 != 0 (no fused_tc): fused_cuda for P <= 16 and for R <= 64 up to P = 64,
//    gather_gemm otherwise (not measured separately: the fp32 rules, which are CUDA-core vs
//    cuBLAS too).
ProbeScorePath ChooseProbeScorePath(int32_t num_rows, int32_t num_probes, int32_t hidden,
                                    common::DType dtype) {
  const int32_t R = num_rows, P = num_probes;
  if (P <= 2) return ProbeScorePath::kFusedCuda;
  if (dtype == common::DType::kFloat32) {
    if (P <= 16) return ProbeScorePath::kFusedCuda;
    if (P <= 128 && R <= 64) return ProbeScorePath::kFusedCuda;
    return ProbeScorePath::kGatherGemm;
  }
  if (!ProbeScorePathSupports(ProbeScorePath::kFusedTensorCore, dtype, P, hidden)) {
    if (P <= 16 || (P <= 64 && R <= 64)) return ProbeScorePath::kFusedCuda;
    return ProbeScorePath::kGatherGemm;
  }
  if (P <= 8) return R <= 512 ? ProbeScorePath::kFusedCuda : ProbeScorePath::kFusedTensorCore;
  if (P <= 128) {
    return (P > 16 && R <= 8) ? ProbeScorePath::kFusedCuda : ProbeScorePath::kFusedTensorCore;
  }
  if (P <= 256) return R <= 256 ? ProbeScorePath::kFusedTensorCore : ProbeScorePath::kGatherGemm;
  return R <= 64 ? ProbeScorePath::kFusedTensorCore : ProbeScorePath::kGatherGemm;
}

}  // namespace probesidecar::kernels
