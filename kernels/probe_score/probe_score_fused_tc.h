// fused_tc's entry points (defined in probe_score_fused_tc.cu): the kernel of each tile
// configuration, for its attributes, its launch, and the split-K reduction's launch. Internal to
// kernels/probe_score.
#pragma once

#include <cuda_runtime_api.h>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_params.h"

namespace probesidecar::kernels::probe_score_detail {

// The kernel for `dtype` in tile configuration `config` (kTcConfigs index) with `terms` weight
// terms (1: fast, 3: exact); nullptr for fp32, a configuration out of range or other terms.
const void* FusedTcKernelFn(common::DType dtype, int config, int terms);

// Grid `grid` = (n_tiles, m_tiles, splits), TcThreads(kTcConfigs[config]) threads,
// TcSmemBytes(kTcConfigs[config], terms) of dynamic shared memory. Returns the launch status.
cudaError_t LaunchFusedTc(common::DType dtype, int config, int terms, const TcParams& params,
                          dim3 grid, cudaStream_t stream);

// The reduction over the splits' partial sums: grid `grid`, kSplitKReduceThreads threads.
inline constexpr int kSplitKReduceThreads = 256;
cudaError_t LaunchSplitKReduce(const SplitKReduceParams& params, dim3 grid, cudaStream_t stream);
// Reads, once, whether the reduction can be a programmatic dependent on the current device
// (blocks::ProgrammaticLaunchUsable), so that no launch inside a stream capture asks first.
void PrepareSplitKReduceLaunch();

}  // namespace probesidecar::kernels::probe_score_detail
