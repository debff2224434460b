// fused_tc: explicit instantiations (the kTcConfigs tile configurations x {bf16, fp16}), the
// split-K reduction, and their launchers.
#include <utility>

#include "kernels/probe_score/probe_score_config.h"
#include "kernels/probe_score/probe_score_fused_tc.cuh"
#include "kernels/probe_score/probe_score_fused_tc.h"

namespace probesidecar::kernels::probe_score_detail {
namespace {

template <int kConfig>
using TcShapeOf =
    TcShape<kTcConfigs[kConfig].bm, kTcConfigs[kConfig].bn, kTcConfigs[kConfig].bk,
            kTcConfigs[kConfig].wm, kTcConfigs[kConfig].wn, kTcConfigs[kConfig].stages>;

template <typename T, int kConfig>
constexpr auto TcKernel() {
  constexpr TcTileConfig c = kTcConfigs[kConfig];
  return &FusedTcKernel<T, c.bm, c.bn, c.bk, c.wm, c.wn, c.stages>;
}

// The planner sizes launches from the table (TcThreads, TcSmemBytes); the kernels from TcShape.
template <int... kConfig>
constexpr bool PlannerAgreesWithKernels(std::integer_sequence<int, kConfig...>) {
  return ((TcShapeOf<kConfig>::kThreads == TcThreads(kTcConfigs[kConfig]) &&
           TcShapeOf<kConfig>::kSmemBytes == TcSmemBytes(kTcConfigs[kConfig])) &&
          ...);
}
static_assert(PlannerAgreesWithKernels(std::make_integer_sequence<int, kNumTcConfigs>{}));

}  // namespace

const void* FusedTcKernelFn(common::DType dtype, int config) {
  const void* none = nullptr;
  return VisitElementType(dtype, none, [&](auto elem) {
    using T = typename decltype(elem)::type;
    if constexpr (std::is_same_v<T, float>) {
      return none;  // mma.sync has no fp32 inputs
    } else {
      return VisitIndex<kNumTcConfigs>(config, none, [](auto index) {
        return reinterpret_cast<const void*>(TcKernel<T, decltype(index)::value>());
      });
    }
  });
}

cudaError_t LaunchFusedTc(common::DType dtype, int config, const TcParams& params, dim3 grid,
                          cudaStream_t stream) {
  return VisitElementType(dtype, cudaErrorInvalidValue, [&](auto elem) {
    using T = typename decltype(elem)::type;
    if constexpr (std::is_same_v<T, float>) {
      return cudaErrorInvalidValue;
    } else {
      return VisitIndex<kNumTcConfigs>(config, cudaErrorInvalidValue, [&](auto index) {
        using S = TcShapeOf<decltype(index)::value>;
        TcKernel<T, decltype(index)::value>()<<<grid, S::kThreads, S::kSmemBytes, stream>>>(params);
        return cudaGetLastError();
      });
    }
  });
}

cudaError_t LaunchSplitKReduce(const SplitKReduceParams& params, dim3 grid, cudaStream_t stream) {
  SplitKReduceKernel<kSplitKReduceThreads><<<grid, kSplitKReduceThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels::probe_score_detail
