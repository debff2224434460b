// Internals of probe scoring shared by the launcher files, the tests and the benchmark: kernel
// entry points per (dtype, tile configuration), the launch plan, and tuning overrides. Not part
// of the server's API (the server includes probe_score.h only).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "kernels/probe_score/probe_score.h"

namespace probesidecar::kernels {

namespace probe_score_detail {
struct FusedCudaParams;
struct TcParams;

// fused_cuda instantiations: probes per block pass kPT in {1, 2, 4, 8, 16}, index 0..4.
inline constexpr int kNumFusedPT = 5;
inline constexpr int kFusedPTValues[kNumFusedPT] = {1, 2, 4, 8, 16};
const void* FusedCudaKernelFn(common::DType dtype, int pt_index);
cudaError_t LaunchFusedCudaKernel(common::DType dtype, int pt_index, const FusedCudaParams& params,
                                  dim3 grid, size_t smem_bytes, cudaStream_t stream);

// fused_tc tile configurations.
struct TcConfigInfo {
  int bm, bn, bk, threads, stages, smem_bytes;
  const char* name;
};
inline constexpr int kNumTcConfigs = 5;
TcConfigInfo GetTcConfig(int config);
const void* FusedTcKernelFn(common::DType dtype, int config);  // nullptr for fp32
cudaError_t LaunchFusedTcKernel(common::DType dtype, int config, const TcParams& params, dim3 grid,
                                cudaStream_t stream);
}  // namespace probe_score_detail

// Overrides for the benchmark and tests; the defaults (all 0 / -1) let the launcher decide.
struct ProbeScoreTuning {
  int32_t tc_config = -1;         // fused_tc tile configuration (GetTcConfig index)
  int32_t splits = 0;             // K splits for fused_cuda / fused_tc (0: automatic)
  int32_t gather_chunk_rows = 0;  // gather_gemm rows per chunk (0: automatic, L2-sized)
};
void SetProbeScoreTuning(ProbeScoreWorkspace* workspace, const ProbeScoreTuning& tuning);

// What LaunchProbeScore would launch (host arithmetic only).
struct ProbeScorePlan {
  ProbeScorePath path = ProbeScorePath::kFusedCuda;
  int32_t config = 0;  // fused_cuda: probes per pass; fused_tc: tile config index
  int32_t splits = 1;  // K splits
  int32_t grid_x = 0, grid_y = 0, grid_z = 0;
  int32_t smem_bytes = 0;
  int32_t chunk_rows = 0;  // gather_gemm
  int32_t num_chunks = 0;  // gather_gemm
};
cudaError_t PlanProbeScore(const ProbeScoreParams& params, ProbeScorePath path,
                           const ProbeScoreWorkspace* workspace, ProbeScorePlan* plan);

// The fused_tc tile configuration and split count for a device with num_sms SMs: host
// arithmetic only (no GPU needed), what LaunchProbeScore would pick with default tuning.
cudaError_t PlanFusedTcOnHost(int32_t max_rows, int32_t num_probes, int32_t hidden, int32_t num_sms,
                              int32_t* config, int32_t* splits);

// Device properties the workspace read at creation.
int32_t ProbeScoreWorkspaceNumSms(const ProbeScoreWorkspace* workspace);

}  // namespace probesidecar::kernels
