#include <algorithm>

#include "kernels/tap_write/tap_write.h"
#include "kernels/tap_write/tap_write_kernel.cuh"

namespace probesidecar::kernels {
namespace {

template <typename Unit>
cudaError_t Launch(const TapWriteParams& p, int64_t unit_bytes, cudaStream_t stream) {
  const int64_t units = int64_t{p.hidden} * common::DTypeSize(p.dtype) / unit_bytes;
  const int64_t blocks_per_row =
      std::min<int64_t>((units + kTapWriteThreads - 1) / kTapWriteThreads, 65535);
  TapWriteKernel<Unit>
      <<<dim3(p.n, static_cast<unsigned>(blocks_per_row)), kTapWriteThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

cudaError_t LaunchTapWrite(const TapWriteParams& params, cudaStream_t stream) {
  if (!TapWriteParamsValid(params)) return cudaErrorInvalidValue;
  // The widest unit every address and extent of the copy is a multiple of.
  const auto element = static_cast<uint64_t>(common::DTypeSize(params.dtype));
  const uint64_t alignment = reinterpret_cast<uintptr_t>(params.src) |
                             reinterpret_cast<uintptr_t>(params.slots) |
                             static_cast<uint64_t>(params.src_row_stride) * element |
                             static_cast<uint64_t>(params.hidden) * element;
  if (alignment % 16 == 0) return Launch<uint4>(params, 16, stream);
  if (alignment % 8 == 0) return Launch<uint2>(params, 8, stream);
  if (alignment % 4 == 0) return Launch<uint32_t>(params, 4, stream);
  return Launch<uint16_t>(params, 2, stream);
}

cudaError_t PrepareTapKernels() {
  cudaFuncAttributes attributes;
  for (const void* kernel : {reinterpret_cast<const void*>(&TapWriteKernel<uint4>),
                             reinterpret_cast<const void*>(&TapWriteKernel<uint2>),
                             reinterpret_cast<const void*>(&TapWriteKernel<uint32_t>),
                             reinterpret_cast<const void*>(&TapWriteKernel<uint16_t>),
                             reinterpret_cast<const void*>(&TapCloseKernel)}) {
    if (cudaError_t e = cudaFuncGetAttributes(&attributes, kernel); e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchTapClose(const TapCloseParams& params, cudaStream_t stream) {
  if (!TapCloseParamsValid(params)) return cudaErrorInvalidValue;
  TapCloseKernel<<<1, 1, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels
