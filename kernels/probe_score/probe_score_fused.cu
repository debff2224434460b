// Explicit instantiations of the fused_cuda kernel (one compile unit, built in parallel with the
// others).
#include "kernels/probe_score/probe_score_internal.h"
#include "kernels/probe_score/probe_score_kernel.cuh"

namespace probesidecar::kernels::probe_score_detail {
namespace {

template <typename T>
const void* FusedFnFor(int pt_index) {
  switch (pt_index) {
    case 0:
      return reinterpret_cast<const void*>(&FusedCudaKernel<T, 1>);
    case 1:
      return reinterpret_cast<const void*>(&FusedCudaKernel<T, 2>);
    case 2:
      return reinterpret_cast<const void*>(&FusedCudaKernel<T, 4>);
    case 3:
      return reinterpret_cast<const void*>(&FusedCudaKernel<T, 8>);
    case 4:
      return reinterpret_cast<const void*>(&FusedCudaKernel<T, 16>);
  }
  return nullptr;
}

template <typename T, int kPT>
cudaError_t Launch(const FusedCudaParams& params, dim3 grid, size_t smem, cudaStream_t stream) {
  FusedCudaKernel<T, kPT><<<grid, kFusedThreads, smem, stream>>>(params);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchFor(int pt_index, const FusedCudaParams& params, dim3 grid, size_t smem,
                      cudaStream_t stream) {
  switch (pt_index) {
    case 0:
      return Launch<T, 1>(params, grid, smem, stream);
    case 1:
      return Launch<T, 2>(params, grid, smem, stream);
    case 2:
      return Launch<T, 4>(params, grid, smem, stream);
    case 3:
      return Launch<T, 8>(params, grid, smem, stream);
    case 4:
      return Launch<T, 16>(params, grid, smem, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace

const void* FusedCudaKernelFn(common::DType dtype, int pt_index) {
  switch (dtype) {
    case common::DType::kFloat32:
      return FusedFnFor<float>(pt_index);
    case common::DType::kFloat16:
      return FusedFnFor<__half>(pt_index);
    case common::DType::kBFloat16:
      return FusedFnFor<__nv_bfloat16>(pt_index);
  }
  return nullptr;
}

cudaError_t LaunchFusedCudaKernel(common::DType dtype, int pt_index, const FusedCudaParams& params,
                                  dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  switch (dtype) {
    case common::DType::kFloat32:
      return LaunchFor<float>(pt_index, params, grid, smem_bytes, stream);
    case common::DType::kFloat16:
      return LaunchFor<__half>(pt_index, params, grid, smem_bytes, stream);
    case common::DType::kBFloat16:
      return LaunchFor<__nv_bfloat16>(pt_index, params, grid, smem_bytes, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace probesidecar::kernels::probe_score_detail
