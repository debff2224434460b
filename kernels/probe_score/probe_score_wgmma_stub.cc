// gather_wgmma in a build without the CUTLASS/CuTe headers: not compiled, never dispatched.
#include "kernels/probe_score/probe_score_wgmma.h"

namespace probesidecar::kernels::probe_score_detail {

bool GatherWgmmaCompiled() { return false; }

cudaError_t SetGatherWgmmaAttributes() { return cudaSuccess; }

cudaError_t LaunchGatherWgmma(common::DType, int, int, const TcParams&, dim3, cudaStream_t) {
  return cudaErrorInvalidValue;
}

}  // namespace probesidecar::kernels::probe_score_detail
