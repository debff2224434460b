// gather_wgmma's entry points in a build without the sm_90a kernels (PROBESIDECAR_SM90A off:
// CMAKE_CUDA_ARCHITECTURES holds no sm_90 machine code). The dispatcher never picks the path
// then (Sm90aKernelsBuilt() is false); a forced launch is refused.
#include "kernels/probe_score/probe_score_wgmma.h"

namespace probesidecar::kernels::probe_score_detail {

cudaError_t SetGatherWgmmaAttributes() { return cudaErrorInvalidDeviceFunction; }

cudaError_t LaunchGatherWgmma(common::DType, int, int, const TcParams&, const CUtensorMap*, dim3,
                              cudaStream_t) {
  return cudaErrorInvalidDeviceFunction;
}

}  // namespace probesidecar::kernels::probe_score_detail
