// MLA verify launchers and workspace: the plan / tile / combine launches of mla_verify_kernel.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>

#include "kernels/common/launch.cuh"
#include "kernels/common/online_softmax.cuh"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_internal.h"
#include "kernels/mla_verify/mla_verify_kernel.cuh"
#include "kernels/mla_verify/mla_verify_plan.h"

namespace probesidecar::kernels {
namespace {

using mla::KernelArgs;
using mla::TileConfig;

template <int kRowGroups, bool kSplit>
cudaError_t SetTileAttributes() {
  return cudaFuncSetAttribute(mla::MlaVerifyTileKernel<kRowGroups, kSplit>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize,
                              TileConfig<kRowGroups>::kSmemBytes);
}

template <int kRowGroups, bool kSplit>
cudaError_t LaunchTile(const KernelArgs& args, int32_t grid_y, cudaStream_t stream) {
  using Cfg = TileConfig<kRowGroups>;
  const int32_t rows = args.p.s_q * args.p.h_q;
  const dim3 grid(mla::NumRowTiles(rows), grid_y);
  mla::MlaVerifyTileKernel<kRowGroups, kSplit>
      <<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
  return cudaGetLastError();
}

template <bool kSplit>
cudaError_t LaunchTileFor(const KernelArgs& args, int32_t grid_y, cudaStream_t stream) {
  switch (mla::TileRowsFor(args.p.s_q * args.p.h_q)) {
    case 16:
      return LaunchTile<1, kSplit>(args, grid_y, stream);
    case 32:
      return LaunchTile<2, kSplit>(args, grid_y, stream);
    default:
      return LaunchTile<4, kSplit>(args, grid_y, stream);
  }
}

KernelArgs MakeArgs(const MlaVerifyParams& params, const MlaVerifyWorkspace* ws) {
  KernelArgs args;
  args.p = params;
  args.plan = ws->plan;
  args.partial_out = ws->partial_out;
  args.partial_lse = ws->partial_lse;
  args.scale_log2 = params.softmax_scale * blocks::kLog2e;
  return args;
}

}  // namespace

cudaError_t CreateMlaVerifyWorkspace(const MlaVerifyWorkspaceConfig& config,
                                     MlaVerifyWorkspace** out) {
  if (out == nullptr || config.max_batch < 1) return cudaErrorInvalidValue;
  *out = nullptr;
  int device = config.device;
  cudaError_t err = cudaSuccess;
  if (device < 0 && (err = cudaGetDevice(&device)) != cudaSuccess) return err;
  if ((err = cudaSetDevice(device)) != cudaSuccess) return err;
  int num_sms = 0, major = 0;
  if ((err = cudaDeviceGetAttribute(&num_sms, cudaDevAttrMultiProcessorCount, device)) !=
          cudaSuccess ||
      (err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device)) !=
          cudaSuccess) {
    return err;
  }
  if (major < 9) return cudaErrorInvalidDevice;  // built for sm_90 only
  int minor = 0;
  if ((err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device)) !=
      cudaSuccess) {
    return err;
  }
  // sm_90a machine code runs on compute capability 9.0 exactly.
  bool sm90a_available = false;
  if (major == 9 && minor == 0 &&
      (err = mla::SetSm90aAttributes(&sm90a_available)) != cudaSuccess) {
    return err;
  }
  // Shared-memory limits of every instantiation, once.
  const cudaError_t attr[] = {SetTileAttributes<1, true>(), SetTileAttributes<2, true>(),
                              SetTileAttributes<4, true>(), SetTileAttributes<1, false>(),
                              SetTileAttributes<2, false>(), SetTileAttributes<4, false>()};
  for (cudaError_t e : attr) {
    if (e != cudaSuccess) return e;
  }
  auto* ws = new MlaVerifyWorkspace;
  ws->device = device;
  ws->num_sms = num_sms;
  ws->max_batch = config.max_batch;
  ws->has_sm90a = sm90a_available;
  ws->partial_rows = mla::PartialRowsFor(num_sms);
  const size_t plan_bytes = static_cast<size_t>(mla::PlanInts(config.max_batch)) * 4;
  const size_t out_bytes = static_cast<size_t>(ws->partial_rows) * kMlaHeadDimV * 4;
  const size_t lse_bytes = static_cast<size_t>(ws->partial_rows) * 4;
  void* mem = nullptr;
  // One allocation: plan, then the partial outputs (256-byte aligned), then their LSEs.
  const size_t out_offset = (plan_bytes + 255) & ~size_t{255};
  ws->bytes = out_offset + out_bytes + lse_bytes;
  if ((err = cudaMalloc(&mem, ws->bytes)) != cudaSuccess) {
    delete ws;
    return err;
  }
  ws->plan = static_cast<int32_t*>(mem);
  ws->partial_out = reinterpret_cast<float*>(static_cast<char*>(mem) + out_offset);
  ws->partial_lse = ws->partial_out + ws->partial_rows * kMlaHeadDimV;
  *out = ws;
  return cudaSuccess;
}

void DestroyMlaVerifyWorkspace(MlaVerifyWorkspace* ws) {
  if (ws == nullptr) return;
  cudaFree(ws->plan);  // the single allocation
  delete ws;
}

namespace {

// The combine, as a programmatic dependent of the tile kernel before it (which lets it be
// scheduled early; it waits for that grid in-kernel before reading the partials). A warp per
// query row of each split request when requests split into a few parts each; otherwise up to
// 16 blocks per (row, column quarter) loop over the split requests the plan lists, with the
// splits of a request spread over a block's warps.
cudaError_t LaunchCombine(const KernelArgs& args, const MlaVerifyPlan& plan, cudaStream_t stream) {
  const int32_t rows = args.p.s_q * args.p.h_q;
  const int32_t listed = mla::MaxSplitRequests(args.p.batch, plan.num_parts);
  return plan.combine_rows ? blocks::LaunchProgrammaticDependent(mla::MlaVerifyCombineRowsKernel,
                                                                 dim3((rows + 7) / 8, listed),
                                                                 dim3(256), 0, stream, args)
                           : blocks::LaunchProgrammaticDependent(
                                 mla::MlaVerifyCombineKernel, dim3(rows * 4, std::min(16, listed)),
                                 dim3(256), 0, stream, args);
}

}  // namespace

cudaError_t PlanMlaVerify(const MlaVerifyParams& params, MlaVerifyPath path,
                          MlaVerifyWorkspace* ws, cudaStream_t stream, MlaVerifyPlan* plan) {
  if (ws == nullptr || plan == nullptr) return cudaErrorInvalidValue;
  if (path != MlaVerifyPath::kSplitKv && path != MlaVerifyPath::kSplitKvSm90a) {
    return cudaErrorInvalidValue;  // the baseline has no plan
  }
  if (path == MlaVerifyPath::kSplitKvSm90a && !ws->has_sm90a) {
    return cudaErrorInvalidDeviceFunction;
  }
  const cudaError_t check = CheckMlaVerifyParams(params, ws);
  if (check != cudaSuccess) return check;
  const int32_t rows = params.s_q * params.h_q;
  MlaVerifyPlan made;
  made.path = path;
  made.batch = params.batch;
  made.s_q = params.s_q;
  made.h_q = params.h_q;
  if (path == MlaVerifyPath::kSplitKvSm90a) {
    made.row_tiles = (rows + 63) / 64;
    made.num_parts = mla::NumPartsSm90a(ws->num_sms, rows);
  } else {
    made.row_tiles = mla::NumRowTiles(rows);
    made.num_parts = mla::NumParts(ws->num_sms, rows);
  }
  // A request splits into about num_parts / batch + 1 parts: with up to ~5, a warp per row
  // merges them in two rounds of loads.
  made.combine_rows = made.num_parts <= 4 * params.batch;
  made.workspace = ws;
  made.id = ++ws->plans_made;
  mla::MlaVerifyPlanKernel<<<1, 1024, 0, stream>>>(params.cache_seqlens, params.batch,
                                                   made.num_parts, ws->plan);
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) return err;
  *plan = made;
  return cudaSuccess;
}

cudaError_t RunMlaVerify(const MlaVerifyPlan& plan, const MlaVerifyParams& params,
                         cudaStream_t stream) {
  const MlaVerifyWorkspace* ws = plan.workspace;
  if (ws == nullptr || plan.id == 0 || plan.id != ws->plans_made) return cudaErrorInvalidValue;
  if (params.batch != plan.batch || params.s_q != plan.s_q || params.h_q != plan.h_q) {
    return cudaErrorInvalidValue;
  }
  const cudaError_t check = CheckMlaVerifyParams(params, ws);
  if (check != cudaSuccess) return check;
  const KernelArgs args = MakeArgs(params, ws);
  cudaError_t err = cudaSuccess;
  switch (plan.path) {
    case MlaVerifyPath::kSplitKvSm90a:
      err = mla::LaunchTileSm90a(args, dim3(plan.row_tiles, plan.num_parts), stream);
      break;
    case MlaVerifyPath::kSplitKv:
      err = LaunchTileFor<true>(args, plan.num_parts, stream);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (err != cudaSuccess) return err;
  return LaunchCombine(args, plan, stream);
}

cudaError_t LaunchMlaVerify(const MlaVerifyParams& params, MlaVerifyWorkspace* ws,
                            cudaStream_t stream) {
  if (ws == nullptr) return cudaErrorInvalidValue;
  return LaunchMlaVerifyPath(params, ChooseMlaVerifyPath(*ws, params.s_q * params.h_q), ws,
                             stream);
}

cudaError_t LaunchMlaVerifyBaseline(const MlaVerifyParams& params, const MlaVerifyWorkspace* ws,
                                    cudaStream_t stream) {
  const cudaError_t check = CheckMlaVerifyParams(params, ws);
  if (check != cudaSuccess) return check;
  return LaunchTileFor<false>(MakeArgs(params, ws), params.batch, stream);
}

cudaError_t LaunchMlaVerifyPath(const MlaVerifyParams& params, MlaVerifyPath path,
                                MlaVerifyWorkspace* ws, cudaStream_t stream) {
  if (path == MlaVerifyPath::kBaseline) return LaunchMlaVerifyBaseline(params, ws, stream);
  MlaVerifyPlan plan;
  const cudaError_t err = PlanMlaVerify(params, path, ws, stream, &plan);
  if (err != cudaSuccess) return err;
  return RunMlaVerify(plan, params, stream);
}

}  // namespace probesidecar::kernels
