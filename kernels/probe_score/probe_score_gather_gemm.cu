// gather_gemm: the gather kernel per dtype and the epilogue kernel, with their launchers (the
// GEMM between them is cuBLAS's, called from probe_score_launch.cc).
#include "kernels/probe_score/probe_score_gather_gemm.cuh"
#include "kernels/probe_score/probe_score_gather_gemm.h"

namespace probesidecar::kernels::probe_score_detail {
namespace {

constexpr unsigned CeilDiv(int64_t a, int64_t b) { return static_cast<unsigned>((a + b - 1) / b); }

}  // namespace

cudaError_t LaunchGatherRows(common::DType dtype, const GatherParams& params, cudaStream_t stream) {
  return VisitElementType(dtype, cudaErrorInvalidValue, [&](auto elem) {
    using T = typename decltype(elem)::type;
    GatherRowsKernel<T><<<CeilDiv(params.chunk_rows, 8), 256, 0, stream>>>(params);
    return cudaGetLastError();
  });
}

cudaError_t LaunchGemmEpilogue(const EpilogueParams& params, cudaStream_t stream) {
  const int64_t elements = static_cast<int64_t>(params.chunk_rows) * params.num_probes;
  GemmEpilogueKernel<256><<<CeilDiv(elements, 256), 256, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels::probe_score_detail
