// Explicit instantiations of the fused_tc kernel: five tile configurations x {bf16, fp16}.
#include "kernels/probe_score/probe_score_internal.h"
#include "kernels/probe_score/probe_score_kernel.cuh"

namespace probesidecar::kernels::probe_score_detail {
namespace {

// The configurations (see ChooseTcConfig in probe_score.cu for when each runs):
//   0 "64x16":      P <= 16 with few rows: 4 warps stacked along M, BK 64, 4 stages (40 KB).
//   1 "64x64":      mid P, or few rows with many probes (split-K over H), 4 stages (64 KB).
//   2 "128x128":    many rows and probes, 8 warps of 64 x 32, 3 stages (96 KB).
//   3 "32x16k256":  P <= 16 with many rows, memory-bound: BK 256 so each gathered row is read
//                   in 512-byte pieces, 2 warps, 3 stages (72 KB).
//   4 "64x16k128":  the same idea with BK 128, 4 warps, 4 stages (80 KB).
template <int kConfig>
struct TcCfg;
template <>
struct TcCfg<0> {
  static constexpr int kBM = 64, kBN = 16, kBK = 64, kWM = 4, kWN = 1, kStages = 4;
};
template <>
struct TcCfg<1> {
  static constexpr int kBM = 64, kBN = 64, kBK = 64, kWM = 2, kWN = 2, kStages = 4;
};
template <>
struct TcCfg<2> {
  static constexpr int kBM = 128, kBN = 128, kBK = 64, kWM = 2, kWN = 4, kStages = 3;
};
template <>
struct TcCfg<3> {
  static constexpr int kBM = 32, kBN = 16, kBK = 256, kWM = 2, kWN = 1, kStages = 3;
};
template <>
struct TcCfg<4> {
  static constexpr int kBM = 64, kBN = 16, kBK = 128, kWM = 4, kWN = 1, kStages = 4;
};

template <typename T, int kConfig>
constexpr auto KernelOf() {
  using C = TcCfg<kConfig>;
  return &FusedTcKernel<T, C::kBM, C::kBN, C::kBK, C::kWM, C::kWN, C::kStages>;
}

template <int kConfig>
TcConfigInfo InfoOf(const char* name) {
  using C = TcCfg<kConfig>;
  using S = TcShape<C::kBM, C::kBN, C::kBK, C::kWM, C::kWN, C::kStages>;
  return TcConfigInfo{C::kBM, C::kBN, C::kBK, S::kThreads, C::kStages, S::kSmemBytes, name};
}

template <typename T, int kConfig>
cudaError_t Launch(const TcParams& params, dim3 grid, cudaStream_t stream) {
  using C = TcCfg<kConfig>;
  using S = TcShape<C::kBM, C::kBN, C::kBK, C::kWM, C::kWN, C::kStages>;
  KernelOf<T, kConfig>()<<<grid, S::kThreads, S::kSmemBytes, stream>>>(params);
  return cudaGetLastError();
}

template <typename T>
cudaError_t LaunchFor(int config, const TcParams& params, dim3 grid, cudaStream_t stream) {
  switch (config) {
    case 0:
      return Launch<T, 0>(params, grid, stream);
    case 1:
      return Launch<T, 1>(params, grid, stream);
    case 2:
      return Launch<T, 2>(params, grid, stream);
    case 3:
      return Launch<T, 3>(params, grid, stream);
    case 4:
      return Launch<T, 4>(params, grid, stream);
  }
  return cudaErrorInvalidValue;
}

template <typename T>
const void* FnFor(int config) {
  switch (config) {
    case 0:
      return reinterpret_cast<const void*>(KernelOf<T, 0>());
    case 1:
      return reinterpret_cast<const void*>(KernelOf<T, 1>());
    case 2:
      return reinterpret_cast<const void*>(KernelOf<T, 2>());
    case 3:
      return reinterpret_cast<const void*>(KernelOf<T, 3>());
    case 4:
      return reinterpret_cast<const void*>(KernelOf<T, 4>());
  }
  return nullptr;
}

}  // namespace

TcConfigInfo GetTcConfig(int config) {
  switch (config) {
    case 0:
      return InfoOf<0>("64x16");
    case 1:
      return InfoOf<1>("64x64");
    case 2:
      return InfoOf<2>("128x128");
    case 3:
      return InfoOf<3>("32x16k256");
    case 4:
      return InfoOf<4>("64x16k128");
  }
  return TcConfigInfo{0, 0, 0, 0, 0, 0, "invalid"};
}

const void* FusedTcKernelFn(common::DType dtype, int config) {
  switch (dtype) {
    case common::DType::kFloat16:
      return FnFor<__half>(config);
    case common::DType::kBFloat16:
      return FnFor<__nv_bfloat16>(config);
    case common::DType::kFloat32:
      return nullptr;
  }
  return nullptr;
}

cudaError_t LaunchFusedTcKernel(common::DType dtype, int config, const TcParams& params, dim3 grid,
                                cudaStream_t stream) {
  switch (dtype) {
    case common::DType::kFloat16:
      return LaunchFor<__half>(config, params, grid, stream);
    case common::DType::kBFloat16:
      return LaunchFor<__nv_bfloat16>(config, params, grid, stream);
    case common::DType::kFloat32:
      return cudaErrorInvalidValue;
  }
  return cudaErrorInvalidValue;
}

}  // namespace probesidecar::kernels::probe_score_detail
