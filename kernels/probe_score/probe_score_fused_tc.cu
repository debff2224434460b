// fused_tc: explicit instantiations (the kTcConfigs tile configurations x {bf16, fp16}), the
// split-K reduction, and their launchers.
#include <utility>

#include "kernels/blocks/launch.cuh"
#include "kernels/probe_score/probe_score_config.h"
#include "kernels/probe_score/probe_score_fused_tc.cuh"
#include "kernels/probe_score/probe_score_fused_tc.h"

namespace probesidecar::kernels::probe_score_detail {
namespace {

template <int kConfig, int kTerms>
using TcShapeOf =
    TcShape<kTcConfigs[kConfig].bm, kTcConfigs[kConfig].bn, kTcConfigs[kConfig].bk,
            kTcConfigs[kConfig].wm, kTcConfigs[kConfig].wn, kTcConfigs[kConfig].stages, kTerms>;

template <typename T, int kConfig, int kTerms>
constexpr auto TcKernel() {
  constexpr TcTileConfig c = kTcConfigs[kConfig];
  return &FusedTcKernel<T, c.bm, c.bn, c.bk, c.wm, c.wn, c.stages, kTerms>;
}

// The planner sizes launches from the table (TcThreads, TcSmemBytes); the kernels from TcShape.
template <int... kConfig>
constexpr bool PlannerAgreesWithKernels(std::integer_sequence<int, kConfig...>) {
  return ((TcShapeOf<kConfig, 1>::kThreads == TcThreads(kTcConfigs[kConfig]) &&
           TcShapeOf<kConfig, 1>::kSmemBytes == TcSmemBytes(kTcConfigs[kConfig], 1) &&
           TcShapeOf<kConfig, 3>::kSmemBytes == TcSmemBytes(kTcConfigs[kConfig], 3)) &&
          ...);
}
static_assert(PlannerAgreesWithKernels(std::make_integer_sequence<int, kNumTcConfigs>{}));

// Calls f(T, config index, terms index) as compile-time types, or returns `none`.
template <typename R, typename F>
R VisitTc(common::DType dtype, int config, int terms, R none, F&& f) {
  return VisitElementType(dtype, none, [&](auto elem) {
    using T = typename decltype(elem)::type;
    if constexpr (std::is_same_v<T, float>) {
      return none;  // mma.sync has no fp32 inputs
    } else {
      return VisitIndex<kNumTcConfigs>(config, none, [&](auto index) {
        if (terms == 1) return f(elem, index, std::integral_constant<int, 1>{});
        if (terms == 3) return f(elem, index, std::integral_constant<int, 3>{});
        return none;
      });
    }
  });
}

}  // namespace

const void* FusedTcKernelFn(common::DType dtype, int config, int terms) {
  return VisitTc(dtype, config, terms, static_cast<const void*>(nullptr),
                 [](auto elem, auto index, auto t) {
                   using T = typename decltype(elem)::type;
                   return reinterpret_cast<const void*>(
                       TcKernel<T, decltype(index)::value, decltype(t)::value>());
                 });
}

cudaError_t LaunchFusedTc(common::DType dtype, int config, int terms, const TcParams& params,
                          dim3 grid, cudaStream_t stream) {
  return VisitTc(dtype, config, terms, cudaErrorInvalidValue, [&](auto elem, auto index, auto t) {
    using T = typename decltype(elem)::type;
    constexpr int kConfig = decltype(index)::value, kTerms = decltype(t)::value;
    using S = TcShapeOf<kConfig, kTerms>;
    TcKernel<T, kConfig, kTerms>()<<<grid, S::kThreads, S::kSmemBytes, stream>>>(params);
    return cudaGetLastError();
  });
}

// As a programmatic dependent of the GEMM kernel before it on the stream (that kernel triggers
// early; the reduction waits for its completion in-kernel), so that its launch overlaps the
// GEMM's tail instead of following it.
void PrepareSplitKReduceLaunch() {
  blocks::ProgrammaticLaunchUsable(
      reinterpret_cast<const void*>(SplitKReduceKernel<kSplitKReduceThreads>));
}

cudaError_t LaunchSplitKReduce(const SplitKReduceParams& params, dim3 grid, cudaStream_t stream) {
  return blocks::LaunchProgrammaticDependent(SplitKReduceKernel<kSplitKReduceThreads>, grid,
                                             dim3(kSplitKReduceThreads), 0, stream, params);
}

}  // namespace probesidecar::kernels::probe_score_detail
