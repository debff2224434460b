// The sm_90a (wgmma) tile kernel's instantiations and launcher. Built with
// -gencode arch=compute_90a,code=sm_90a only (see CMakeLists.txt); the plan and combine kernels
// it shares with the portable path live in mla_verify.cu.
#include "kernels/mla_verify/mla_verify_internal.h"
#include "kernels/mla_verify/mla_verify_sm90a.cuh"

namespace probesidecar::kernels::mla {

bool Sm90aCompiled() { return true; }

cudaError_t SetSm90aAttributes() {
  cudaError_t err = cudaFuncSetAttribute(sm90a::MlaVerifyTileSm90aKernel<true>,
                                         cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         sm90a::kSmemBytes);
  if (err != cudaSuccess) return err;
  return cudaFuncSetAttribute(sm90a::MlaVerifyTileSm90aKernel<false>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, sm90a::kSmemBytes);
}

cudaError_t LaunchTileSm90a(const KernelArgs& args, int32_t grid_y, bool split,
                            cudaStream_t stream) {
  const int32_t rows = args.p.s_q * args.p.h_q;
  const dim3 grid((rows + sm90a::kM - 1) / sm90a::kM, grid_y);
  if (split) {
    sm90a::MlaVerifyTileSm90aKernel<true><<<grid, sm90a::kThreads, sm90a::kSmemBytes, stream>>>(args);
  } else {
    sm90a::MlaVerifyTileSm90aKernel<false><<<grid, sm90a::kThreads, sm90a::kSmemBytes, stream>>>(args);
  }
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels::mla
