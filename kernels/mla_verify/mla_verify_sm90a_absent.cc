// The sm_90a tile kernels' entry points in a build without the sm_90a kernels
// (PROBESIDECAR_SM90A off): the workspace reports has_sm90a = false, so the split_kv path serves
// every shape, and a forced split_kv_sm90a is refused; there is no trace to record.
#include "kernels/mla_verify/mla_verify_internal.h"
#include "kernels/mla_verify/mla_verify_trace.h"

namespace probesidecar::kernels::mla {

cudaError_t SetSm90aAttributes(bool* available) {
  *available = false;
  return cudaSuccess;
}

cudaError_t LaunchTileSm90a(const KernelArgs&, dim3, MlaVerifySm90aSchedule, cudaStream_t) {
  return cudaErrorInvalidDeviceFunction;
}

}  // namespace probesidecar::kernels::mla

namespace probesidecar::kernels {

bool MlaVerifyTraceCompiledIn() { return false; }

cudaError_t SetMlaVerifyTraceBuffer(uint32_t*, int32_t, int32_t) { return cudaErrorNotSupported; }

}  // namespace probesidecar::kernels
