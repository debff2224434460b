// fused_cuda: explicit instantiations (fp32, fp16, bf16 x kFusedPTValues probes per pass) and
// their launcher. One compile unit per kernel family, so that the families build in parallel.
#include "kernels/probe_score/probe_score_fused_cuda.cuh"
#include "kernels/probe_score/probe_score_fused_cuda.h"

namespace probesidecar::kernels::probe_score_detail {
namespace {

template <typename T, int kIndex>
constexpr auto FusedKernel() {
  return &FusedCudaKernel<T, kFusedPTValues[kIndex]>;
}

}  // namespace

const void* FusedCudaKernelFn(common::DType dtype, int pt_index) {
  const void* none = nullptr;
  return VisitElementType(dtype, none, [&](auto elem) {
    using T = typename decltype(elem)::type;
    return VisitIndex<kNumFusedPT>(pt_index, none, [](auto index) {
      return reinterpret_cast<const void*>(FusedKernel<T, decltype(index)::value>());
    });
  });
}

cudaError_t LaunchFusedCuda(common::DType dtype, int pt_index, const FusedCudaParams& params,
                            dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  return VisitElementType(dtype, cudaErrorInvalidValue, [&](auto elem) {
    using T = typename decltype(elem)::type;
    return VisitIndex<kNumFusedPT>(pt_index, cudaErrorInvalidValue, [&](auto index) {
      FusedKernel<T, decltype(index)::value>()<<<grid, kFusedThreads, smem_bytes, stream>>>(params);
      return cudaGetLastError();
    });
  });
}

}  // namespace probesidecar::kernels::probe_score_detail
