// gather_wgmma: the sm_90a instantiations (kWgmmaConfigs x {bf16, fp16} x {fast, exact} where the
// stages fit) and their launcher. Built with -gencode arch=compute_90a,code=sm_90a only (see
// CMakeLists.txt).
#include <cuda.h>

#include <type_traits>
#include <utility>

#include "kernels/probe_score/probe_score_config.h"
#include "kernels/probe_score/probe_score_wgmma.h"
#include "kernels/probe_score/probe_score_wgmma_sm90a.cuh"
#include "kernels/probe_score/probe_score_wgmma_ws_sm90a.cuh"

namespace probesidecar::kernels::probe_score_detail {
namespace {

template <int kConfig, int kTerms>
constexpr int kStagesOf = WgmmaStages(kWgmmaConfigs[kConfig], kTerms);

template <int kConfig, int kTerms>
using ShapeOf = sm90a::WgmmaShape<kWgmmaConfigs[kConfig].wgs, kWgmmaConfigs[kConfig].bn,
                                  kStagesOf<kConfig, kTerms>, kTerms>;

template <typename T, int kConfig, int kTerms>
constexpr auto Kernel() {
  return &sm90a::GatherWgmmaKernel<T, kWgmmaConfigs[kConfig].wgs, kWgmmaConfigs[kConfig].bn,
                                   kStagesOf<kConfig, kTerms>, kTerms>;
}

constexpr int kWsConfig = 3;
static_assert(kWgmmaConfigs[kWsConfig].ws && kWgmmaConfigs[kWsConfig].bn == sm90a::kWsBN &&
              64 * kWgmmaConfigs[kWsConfig].wgs == sm90a::kWsBM &&
              WgmmaStages(kWgmmaConfigs[kWsConfig], 1) == sm90a::kWsStages &&
              WgmmaSmemBytes(kWgmmaConfigs[kWsConfig], 1) == sm90a::kWsSmemBytes &&
              WgmmaThreads(kWgmmaConfigs[kWsConfig]) == sm90a::kWsThreads);
static_assert(kWsWeightBoxCols == sm90a::kBK && kWsWeightBoxRows == sm90a::kWsBN,
              "the weight tensor map's box is the warp-specialised kernel's B tile");

template <typename T>
cudaError_t LaunchWs(const TcParams& params, const CUtensorMap& weight_map, dim3 grid,
                     cudaStream_t stream) {
  sm90a::WsArgs args;
  args.w_map = weight_map;
  args.p = params;
  sm90a::GatherWgmmaWsKernel<T><<<grid, sm90a::kWsThreads, sm90a::kWsSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

// Calls f(T, config, terms) as compile-time types for the instantiated combinations.
template <typename R, typename F>
R Visit(common::DType dtype, int config, int terms, R none, F&& f) {
  return VisitElementType(dtype, none, [&](auto elem) {
    using T = typename decltype(elem)::type;
    if constexpr (std::is_same_v<T, float>) {
      return none;
    } else {
      return VisitIndex<kNumWgmmaConfigs>(config, none, [&](auto index) {
        constexpr int kConfig = decltype(index)::value;
        if constexpr (kWgmmaConfigs[kConfig].ws) {
          return none;  // launched by LaunchWs
        }
        if (terms == 1) return f(elem, index, std::integral_constant<int, 1>{});
        if constexpr (kStagesOf<kConfig, 3> >= 2) {
          if (terms == 3) return f(elem, index, std::integral_constant<int, 3>{});
        }
        return none;
      });
    }
  });
}

template <int... kConfig>
constexpr bool PlannerAgreesWithKernels(std::integer_sequence<int, kConfig...>) {
  return ((kWgmmaConfigs[kConfig].ws ||
           (ShapeOf<kConfig, 1>::kSmemBytes == WgmmaSmemBytes(kWgmmaConfigs[kConfig], 1) &&
            ShapeOf<kConfig, 1>::kThreads == WgmmaThreads(kWgmmaConfigs[kConfig]))) &&
          ...);
}
static_assert(PlannerAgreesWithKernels(std::make_integer_sequence<int, kNumWgmmaConfigs>{}));

}  // namespace

cudaError_t SetGatherWgmmaAttributes() {
  cudaError_t first = cudaSuccess;
  for (common::DType dtype : {common::DType::kBFloat16, common::DType::kFloat16}) {
    for (int config = 0; config < kNumWgmmaConfigs; ++config) {
      for (int terms : {1, 3}) {
        const cudaError_t err =
            Visit(dtype, config, terms, cudaSuccess, [](auto elem, auto index, auto t) {
              using T = typename decltype(elem)::type;
              constexpr int kConfig = decltype(index)::value, kTerms = decltype(t)::value;
              return cudaFuncSetAttribute(Kernel<T, kConfig, kTerms>(),
                                          cudaFuncAttributeMaxDynamicSharedMemorySize,
                                          ShapeOf<kConfig, kTerms>::kSmemBytes);
            });
        if (first == cudaSuccess) first = err;
      }
    }
  }
  for (const void* fn : {reinterpret_cast<const void*>(&sm90a::GatherWgmmaWsKernel<__nv_bfloat16>),
                         reinterpret_cast<const void*>(&sm90a::GatherWgmmaWsKernel<__half>)}) {
    const cudaError_t err =
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, sm90a::kWsSmemBytes);
    if (first == cudaSuccess) first = err;
  }
  return first;
}

cudaError_t LaunchGatherWgmma(common::DType dtype, int config, int terms, const TcParams& params,
                              const CUtensorMap* weight_map, dim3 grid, cudaStream_t stream) {
  if (config == kWsConfig) {
    if (terms != 1 || grid.z != 1) return cudaErrorInvalidValue;
    if (weight_map == nullptr) return cudaErrorNotSupported;
    if (dtype == common::DType::kBFloat16) {
      return LaunchWs<__nv_bfloat16>(params, *weight_map, grid, stream);
    }
    if (dtype == common::DType::kFloat16) {
      return LaunchWs<__half>(params, *weight_map, grid, stream);
    }
    return cudaErrorInvalidValue;
  }
  return Visit(dtype, config, terms, cudaErrorInvalidValue, [&](auto elem, auto index, auto t) {
    using T = typename decltype(elem)::type;
    constexpr int kConfig = decltype(index)::value, kTerms = decltype(t)::value;
    using S = ShapeOf<kConfig, kTerms>;
    Kernel<T, kConfig, kTerms>()<<<grid, S::kThreads, S::kSmemBytes, stream>>>(params);
    return cudaGetLastError();
  });
}

}  // namespace probesidecar::kernels::probe_score_detail
