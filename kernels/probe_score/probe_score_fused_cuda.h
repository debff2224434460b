// fused_cuda's entry points (defined in probe_score_fused_cuda.cu): the kernel of each
// instantiation, for its attributes, and its launch. Internal to kernels/probe_score.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_params.h"

namespace probesidecar::kernels::probe_score_detail {

// The kernel for `dtype` with kFusedPTValues[pt_index] probes per pass; nullptr if out of range.
const void* FusedCudaKernelFn(common::DType dtype, int pt_index);

// Grid `grid` = (row_groups, splits, probe_tiles), kFusedThreads threads, `smem_bytes` of dynamic
// shared memory. Returns the launch status.
cudaError_t LaunchFusedCuda(common::DType dtype, int pt_index, const FusedCudaParams& params,
                            dim3 grid, size_t smem_bytes, cudaStream_t stream);

}  // namespace probesidecar::kernels::probe_score_detail
