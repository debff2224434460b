// The run: binds a plan's launches to the request's pointers and the workspace's buffers, and
// enqueues them. Pointer math and launches only (no planning, no device query, no allocation, no
// tensor-map encoding, no cuBLAS configuration: the weights and the workspace hold what those
// make), so that it can be captured into a graph. Plain C++ over the families' launchers and
// cuBLAS.
#include <algorithm>

#include "kernels/probe_score/probe_score.h"
#include "kernels/probe_score/probe_score_fused_cuda.h"
#include "kernels/probe_score/probe_score_fused_tc.h"
#include "kernels/probe_score/probe_score_gather_gemm.h"
#include "kernels/probe_score/probe_score_wgmma.h"
#include "kernels/probe_score/probe_score_workspace.h"

namespace probesidecar::kernels {
namespace {

using probe_score_detail::EpilogueParams;
using probe_score_detail::FusedCudaParams;
using probe_score_detail::GatherParams;
using probe_score_detail::kHiddenPad;
using probe_score_detail::SplitKReduceParams;
using probe_score_detail::TcParams;

int32_t PaddedHidden(int32_t hidden) { return (hidden + kHiddenPad - 1) / kHiddenPad * kHiddenPad; }
int32_t RoundUpProbes(int32_t probes) {
  return (probes + probe_score_detail::kProbePad - 1) / probe_score_detail::kProbePad *
         probe_score_detail::kProbePad;
}

dim3 Dim3(const ProbeScoreGrid& g) { return dim3(g.x, g.y, g.z); }

// Whether exactly the sub-plan of plan.path is filled, as PlanProbeScore leaves it: a plan whose
// path was changed afterwards (or that no planner made) would launch another path's grid.
bool PlannedForItsPath(const ProbeScorePlan& plan) {
  const bool planned[kNumProbeScorePaths] = {plan.fused_cuda.grid.x != 0, plan.fused_tc.grid.x != 0,
                                             plan.gather_gemm.num_chunks != 0,
                                             plan.gather_wgmma.grid.x != 0};
  const int path = static_cast<int>(plan.path);
  if (path < 0 || path >= kNumProbeScorePaths) return false;
  for (int p = 0; p < kNumProbeScorePaths; ++p) {
    if (planned[p] != (p == path)) return false;
  }
  return true;
}

// Whether the params and the workspace are the ones the plan was made for.
bool Matches(const ProbeScorePlan& plan, const ProbeScoreParams& params,
             const ProbeScoreWorkspace* ws) {
  if (params.args == nullptr || params.rows == nullptr || params.weights == nullptr ||
      params.weights->storage == nullptr) {
    return false;
  }
  const ProbeScoreShape& s = plan.shape;
  const ProbeScoreWorkspaceLimits& l = ws->resources.workspace;
  const ProbeScoreWorkspaceNeeds& n = plan.needs;
  const int dtype = static_cast<int>(s.dtype);
  return dtype >= 0 && dtype < common::kNumDTypes && params.weights->num_probes == s.num_probes &&
         params.weights->precision == s.precision && params.weights->hidden == s.hidden &&
         s.max_rows >= 0 && s.max_rows <= l.max_rows && n.partial_floats <= l.partial_floats &&
         n.counters <= l.counters && n.staging_x_bytes <= l.staging_x_bytes &&
         n.staging_c_bytes <= l.staging_c_bytes;
}

// The fields both fused kernels share: the request's pointers, the weights, the split-K
// partials and the shape.
template <typename KernelParams>
void BindFused(const ProbeScorePlan& plan, const ProbeScoreParams& in,
               const ProbeScoreWorkspace& ws, KernelParams* p) {
  const ProbeWeights& w = *in.weights;
  p->args = in.args;
  p->rows = in.rows;
  p->bias = w.bias;
  p->partial = ws.partial;
  p->max_rows = plan.shape.max_rows;
  p->hidden = w.hidden;
  p->num_probes = w.num_probes;
  p->w_row_stride = PaddedHidden(w.hidden);
  p->activation = static_cast<int32_t>(in.activation);
}

cudaError_t RunFusedCuda(const ProbeScorePlan& plan, const ProbeScoreParams& in,
                         const ProbeScoreWorkspace& ws, cudaStream_t stream) {
  const FusedCudaPlan& fp = plan.fused_cuda;
  FusedCudaParams p;
  BindFused(plan, in, ws, &p);
  // CUDA cores read W as fp32 whatever the activations' dtype.
  p.weight =
      static_cast<const float*>(in.weights->weight[static_cast<int>(common::DType::kFloat32)]);
  p.counters = ws.counters;
  p.splits = static_cast<int32_t>(fp.grid.y);
  p.k_per_split = fp.k_per_split;
  p.k_per_smem = fp.k_per_smem;
  p.row_groups = static_cast<int32_t>(fp.grid.x);
  p.probe_tiles = static_cast<int32_t>(fp.grid.z);
  return probe_score_detail::LaunchFusedCuda(plan.shape.dtype, fp.pt_index, p, Dim3(fp.grid),
                                             fp.smem_bytes, stream);
}

// fused_tc and gather_wgmma: one tensor-core kernel, then the split-K reduction when K is split.
cudaError_t RunTensorCore(const ProbeScorePlan& plan, const ProbeScoreParams& in,
                          const ProbeScoreWorkspace& ws, cudaStream_t stream) {
  const bool wgmma = plan.path == ProbeScorePath::kGatherWgmma;
  const FusedTcPlan& tp = wgmma ? plan.gather_wgmma : plan.fused_tc;
  TcParams p;
  BindFused(plan, in, ws, &p);
  const int dtype = static_cast<int>(plan.shape.dtype);
  const CUtensorMap* weight_map =
      in.weights->weight_map_ready[dtype] ? &in.weights->weight_map[dtype] : nullptr;
  p.weight = in.weights->weight[dtype];
  p.term_stride = in.weights->term_stride;
  p.acc_scale = 1.0f / in.weights->term_scale[dtype];
  p.partial_rows = tp.partial_rows;
  p.partial_ld = tp.partial_ld;
  p.k_tiles = tp.k_tiles;
  p.splits = static_cast<int32_t>(tp.grid.z);
  p.w_rows = RoundUpProbes(in.weights->num_probes);
  cudaError_t err =
      wgmma ? probe_score_detail::LaunchGatherWgmma(plan.shape.dtype, tp.config, tp.terms, p,
                                                    weight_map, Dim3(tp.grid), stream)
            : probe_score_detail::LaunchFusedTc(plan.shape.dtype, tp.config, tp.terms, p,
                                                Dim3(tp.grid), stream);
  if (err != cudaSuccess || p.splits == 1) return err;
  SplitKReduceParams r;
  r.args = in.args;
  r.partial = ws.partial;
  r.bias = in.weights->bias;
  r.splits = p.splits;
  r.partial_rows = p.partial_rows;
  r.partial_ld = p.partial_ld;
  r.max_rows = p.max_rows;
  r.num_probes = p.num_probes;
  r.activation = p.activation;
  return probe_score_detail::LaunchSplitKReduce(r, Dim3(tp.reduce_grid), stream);
}

cudaDataType_t CudaType(common::DType dtype) {
  switch (dtype) {
    case common::DType::kFloat32:
      return CUDA_R_32F;
    case common::DType::kFloat16:
      return CUDA_R_16F;
    case common::DType::kBFloat16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

// Per chunk of rows: gather -> cuBLAS -> epilogue. The cuBLAS handle runs on the workspace's
// stream with the workspace's scratch, both set once when the workspace was created.
cudaError_t RunGatherGemm(const ProbeScorePlan& plan, const ProbeScoreParams& in,
                          const ProbeScoreWorkspace& ws, cudaStream_t stream) {
  const GatherGemmPlan& gp = plan.gather_gemm;
  const ProbeWeights& w = *in.weights;
  const int32_t P = w.num_probes, H = w.hidden;
  const common::DType dtype = plan.shape.dtype;
  cublasStatus_t st = CUBLAS_STATUS_SUCCESS;
  // Exact precision: one GEMM per weight term, the later ones adding into the first's result;
  // alpha undoes the terms' power-of-two scale.
  const float alpha = 1.0f / w.term_scale[static_cast<int>(dtype)], zero = 0.0f, one = 1.0f;
  const char* w_base = static_cast<const char*>(w.weight[static_cast<int>(dtype)]);
  const int64_t term_bytes = w.term_stride * common::DTypeSize(dtype);
  const cudaDataType_t type = CudaType(dtype);
  cudaError_t err = cudaSuccess;
  for (int64_t c = 0; c < gp.num_chunks; ++c) {
    const int32_t row_begin = static_cast<int32_t>(c * gp.chunk_rows);
    const int32_t n =
        static_cast<int32_t>(std::min<int64_t>(gp.chunk_rows, plan.shape.max_rows - row_begin));
    GatherParams g;
    g.args = in.args;
    g.rows = in.rows;
    g.staging = ws.staging_x;
    g.hidden = H;
    g.row_begin = row_begin;
    g.chunk_rows = n;
    if ((err = probe_score_detail::LaunchGatherRows(dtype, g, stream)) != cudaSuccess) return err;
    // Column-major view: C^T [P, n] = W [P, H] (row-major = col-major H x P, transposed) times
    // staging^T [H, n] (row-major [n, H] = col-major H x n).
    for (int32_t term = 0; term < gp.terms; ++term) {
      st = cublasGemmEx(ws.cublas, CUBLAS_OP_T, CUBLAS_OP_N, P, n, H, &alpha,
                        w_base + term * term_bytes, type, PaddedHidden(H), ws.staging_x, type, H,
                        term == 0 ? &zero : &one, ws.staging_c, CUDA_R_32F, gp.ldc,
                        CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
      if (st != CUBLAS_STATUS_SUCCESS) return FromCublas(st);
    }
    EpilogueParams e;
    e.args = in.args;
    e.c = ws.staging_c;
    e.ldc = gp.ldc;
    e.bias = w.bias;
    e.num_probes = P;
    e.row_begin = row_begin;
    e.chunk_rows = n;
    e.activation = static_cast<int32_t>(in.activation);
    if ((err = probe_score_detail::LaunchGemmEpilogue(e, stream)) != cudaSuccess) return err;
  }
  return cudaSuccess;
}

}  // namespace

cudaError_t LaunchProbeScore(const ProbeScorePlan& plan, const ProbeScoreParams& params,
                             ProbeScoreWorkspace* workspace, cudaStream_t stream) {
  if (workspace == nullptr) return cudaErrorInvalidValue;
  if (stream != workspace->stream) return cudaErrorInvalidResourceHandle;
  if (!Matches(plan, params, workspace)) return cudaErrorInvalidValue;
  if (static_cast<uint32_t>(plan.path) >= static_cast<uint32_t>(kNumProbeScorePaths)) {
    return cudaErrorInvalidValue;
  }
  if (!ProbeScorePathSupports(plan.path, plan.shape, workspace->resources.device)) {
    return cudaErrorInvalidDeviceFunction;
  }
  if (plan.shape.max_rows == 0) return cudaSuccess;
  if (!PlannedForItsPath(plan)) return cudaErrorInvalidValue;
  // A fused_tc tile planned for a device with larger blocks than this workspace's (its kernel's
  // shared-memory limit was raised only for the tiles that fit here).
  if (plan.path == ProbeScorePath::kFusedTensorCore &&
      !TcConfigFits(plan.fused_tc.config, plan.fused_tc.terms, workspace->resources.device)) {
    return cudaErrorInvalidValue;
  }
  switch (plan.path) {
    case ProbeScorePath::kFusedCuda:
      return RunFusedCuda(plan, params, *workspace, stream);
    case ProbeScorePath::kFusedTensorCore:
    case ProbeScorePath::kGatherWgmma:
      return RunTensorCore(plan, params, *workspace, stream);
    case ProbeScorePath::kGatherGemm:
      return RunGatherGemm(plan, params, *workspace, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace probesidecar::kernels
