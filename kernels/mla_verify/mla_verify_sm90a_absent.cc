// The sm_90a tile kernel's entry points in a build without the sm_90a kernels
// (PROBESIDECAR_SM90A off): the workspace reports has_sm90a = false, so the split_kv path serves
// every shape, and a forced split_kv_sm90a is refused.
#include "kernels/mla_verify/mla_verify_internal.h"

namespace probesidecar::kernels::mla {

cudaError_t SetSm90aAttributes(bool* available) {
  *available = false;
  return cudaSuccess;
}

cudaError_t LaunchTileSm90a(const KernelArgs&, dim3, cudaStream_t) {
  return cudaErrorInvalidDeviceFunction;
}

}  // namespace probesidecar::kernels::mla
