// Builds without the CUTLASS/CuTe headers have no sm_90a kernels: the launchers fall back to
// the portable path.
#include "kernels/mla_verify/mla_verify_internal.h"

namespace probesidecar::kernels::mla {

bool Sm90aCompiled() { return false; }
cudaError_t SetSm90aAttributes(bool* available) {
  *available = false;
  return cudaSuccess;
}
cudaError_t LaunchTileSm90a(const KernelArgs&, dim3, cudaStream_t) {
  return cudaErrorInvalidDeviceFunction;
}

}  // namespace probesidecar::kernels::mla
