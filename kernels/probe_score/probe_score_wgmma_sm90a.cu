// gather_wgmma: the sm_90a instantiations (kWgmmaConfigs x {bf16, fp16} x {fast, exact} where the
// stages fit) and their launcher. Built with -gencode arch=compute_90a,code=sm_90a only (see
// CMakeLists.txt).
#include <type_traits>
#include <utility>

#include "kernels/probe_score/probe_score_config.h"
#include "kernels/probe_score/probe_score_wgmma.h"
#include "kernels/probe_score/probe_score_wgmma_sm90a.cuh"

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
  return ((ShapeOf<kConfig, 1>::kSmemBytes == WgmmaSmemBytes(kWgmmaConfigs[kConfig], 1)) && ...);
}
static_assert(PlannerAgreesWithKernels(std::make_integer_sequence<int, kNumWgmmaConfigs>{}));

}  // namespace

bool GatherWgmmaCompiled() { return true; }

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
  return first;
}

cudaError_t LaunchGatherWgmma(common::DType dtype, int config, int terms, const TcParams& params,
                              dim3 grid, cudaStream_t stream) {
  return Visit(dtype, config, terms, cudaErrorInvalidValue, [&](auto elem, auto index, auto t) {
    using T = typename decltype(elem)::type;
    constexpr int kConfig = decltype(index)::value, kTerms = decltype(t)::value;
    using S = ShapeOf<kConfig, kTerms>;
    Kernel<T, kConfig, kTerms>()<<<grid, S::kThreads, S::kSmemBytes, stream>>>(params);
    return cudaGetLastError();
  });
}

}  // namespace probesidecar::kernels::probe_score_detail
