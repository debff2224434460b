// gather_wgmma's entry points (defined in probe_score_wgmma_sm90a.cu, compiled for sm_90a only).
// Internal to kernels/probe_score.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_params.h"

namespace probesidecar::kernels::probe_score_detail {

// Raises the dynamic shared memory limit of every instantiation (once per device).
cudaError_t SetGatherWgmmaAttributes();

// Grid `grid` = (n_tiles, m_tiles, splits), WgmmaThreads(kWgmmaConfigs[config]) threads,
// WgmmaSmemBytes(kWgmmaConfigs[config], terms) of dynamic shared memory. The warp-specialised
// configuration reads W through `weight_map` (ProbeWeights::weight_map of the dtype):
// cudaErrorNotSupported when it is null. cudaErrorInvalidValue for fp32, or a configuration or
// terms not instantiated.
cudaError_t LaunchGatherWgmma(common::DType dtype, int config, int terms, const TcParams& params,
                              const CUtensorMap* weight_map, dim3 grid, cudaStream_t stream);

}  // namespace probesidecar::kernels::probe_score_detail
