// gather_gemm's kernels around the cuBLAS GEMM (defined in probe_score_gather_gemm.cu). Internal
// to kernels/probe_score; the GEMM itself is called from the run (probe_score_launch.cc).
#pragma once

#include <cuda_runtime_api.h>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_params.h"

namespace probesidecar::kernels::probe_score_detail {

// Gathers params.chunk_rows rows of `dtype` into the staging buffer: ceil(chunk_rows / 8) blocks
// of 256 threads (a warp per row).
cudaError_t LaunchGatherRows(common::DType dtype, const GatherParams& params, cudaStream_t stream);

// Bias and activation over [chunk_rows, P] of the GEMM result: ceil(chunk_rows * P / 256) blocks
// of 256 threads.
cudaError_t LaunchGemmEpilogue(const EpilogueParams& params, cudaStream_t stream);

}  // namespace probesidecar::kernels::probe_score_detail
