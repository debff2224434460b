// MLA verify launchers and workspace: the plan / tile / combine launches of mla_verify_kernel.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels/blocks/device_support.h"
#include "kernels/blocks/launch.cuh"
#include "kernels/blocks/online_softmax.cuh"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_internal.h"
#include "kernels/mla_verify/mla_verify_kernel.cuh"
#include "kernels/mla_verify/mla_verify_plan.h"

namespace probesidecar::kernels {
namespace {

using mla::KernelArgs;
using mla::TileConfig;

template <int kIndex, bool kSplit>
constexpr auto TileKernel() {
  return &mla::MlaVerifyTileKernel<mla::kTiles[kIndex].rows / 16, mla::kTiles[kIndex].stages,
                                   kSplit>;
}
template <int kIndex>
using TileConfigOf = TileConfig<mla::kTiles[kIndex].rows / 16, mla::kTiles[kIndex].stages>;

// Calls f(tile index) as a compile-time constant, or returns cudaErrorInvalidValue.
template <typename F>
cudaError_t VisitTile(int32_t tile, F&& f) {
  static_assert(mla::kNumTiles == 5, "one case per kTiles entry");
  switch (tile) {
    case 0:
      return f(std::integral_constant<int, 0>{});
    case 1:
      return f(std::integral_constant<int, 1>{});
    case 2:
      return f(std::integral_constant<int, 2>{});
    case 3:
      return f(std::integral_constant<int, 3>{});
    case 4:
      return f(std::integral_constant<int, 4>{});
    default:
      return cudaErrorInvalidValue;
  }
}

// Raises the shared-memory limit of both modes of one tile (only tiles that fit the device).
cudaError_t SetTileAttributes(int32_t tile) {
  return VisitTile(tile, [](auto index) {
    constexpr int kIndex = decltype(index)::value;
    constexpr int bytes = TileConfigOf<kIndex>::kSmemBytes;
    cudaError_t err = cudaFuncSetAttribute(TileKernel<kIndex, true>(),
                                           cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    if (err == cudaSuccess) {
      err = cudaFuncSetAttribute(TileKernel<kIndex, false>(),
                                 cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
    }
    return err;
  });
}

// Grid (row tiles, grid_y), the tile's threads and shared memory.
template <bool kSplit>
cudaError_t LaunchTile(int32_t tile, const KernelArgs& args, int32_t grid_y, cudaStream_t stream) {
  return VisitTile(tile, [&](auto index) {
    constexpr int kIndex = decltype(index)::value;
    using Cfg = TileConfigOf<kIndex>;
    const int32_t rows = args.p.s_q * args.p.h_q;
    const dim3 grid((rows + Cfg::kM - 1) / Cfg::kM, grid_y);
    TileKernel<kIndex, kSplit>()<<<grid, Cfg::kThreads, Cfg::kSmemBytes, stream>>>(args);
    return cudaGetLastError();
  });
}

mla::TileDevice TileDeviceOf(const MlaVerifyWorkspace& ws) {
  return mla::TileDeviceFrom(ws.limits);
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
  DeviceLimits limits;
  if ((err = ReadDeviceLimits(device, &limits)) != cudaSuccess) return err;
  if (config.limit_to_family != nullptr) limits = ClampToFamily(limits, *config.limit_to_family);
  bool sm90a_available = false;
  if (Sm90aKernelsRunOn(limits.cc_major, limits.cc_minor, config.limit_to_family) &&
      (err = mla::SetSm90aAttributes(&sm90a_available)) != cudaSuccess) {
    return err;
  }
  // Shared-memory limits of the tiles that fit this device's blocks, once; the 16-row tile fits
  // every supported family, and without it no shape could run.
  const mla::TileDevice tile_device = mla::TileDeviceFrom(limits);
  if (mla::ChooseTile(16, tile_device).index < 0) return cudaErrorNotSupported;
  for (int32_t tile = 0; tile < mla::kNumTiles; ++tile) {
    if (!mla::TileFits(tile, tile_device)) continue;
    if ((err = SetTileAttributes(tile)) != cudaSuccess) return err;
  }
  // Whether the combine can be a programmatic dependent here, read once now rather than at a
  // launch inside a stream capture.
  blocks::ProgrammaticLaunchUsable(reinterpret_cast<const void*>(mla::MlaVerifyCombineKernel));
  blocks::ProgrammaticLaunchUsable(reinterpret_cast<const void*>(mla::MlaVerifyCombineRowsKernel));
  const int num_sms = limits.num_sms;
  auto* ws = new MlaVerifyWorkspace;
  ws->device = device;
  ws->num_sms = num_sms;
  ws->max_batch = config.max_batch;
  ws->has_sm90a = sm90a_available;
  ws->sm90a_schedule = config.sm90a_schedule;
  ws->limits = limits;
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

cudaError_t PlanMlaVerify(const MlaVerifyParams& params, MlaVerifyPath path, MlaVerifyWorkspace* ws,
                          cudaStream_t stream, MlaVerifyPlan* plan) {
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
    made.sm90a_schedule = ChooseMlaVerifySm90aSchedule(*ws, rows, params.batch);
  } else {
    const mla::TileChoice tile = mla::ChooseTile(rows, TileDeviceOf(*ws));
    if (tile.index < 0) return cudaErrorNotSupported;
    made.tile = tile.index;
    made.row_tiles = (rows + tile.rows - 1) / tile.rows;
    made.num_parts = mla::NumPartsFor(ws->num_sms, rows, tile.rows, tile.blocks_per_sm);
  }
  // A request splits into about num_parts / batch + 1 parts: with up to ~5, a warp per row
  // merges them in two rounds of loads.
  made.combine_rows = made.num_parts <= 4 * params.batch;
  made.plan_in_block = path == MlaVerifyPath::kSplitKvSm90a && mla::PlanInBlock(params.batch);
  made.workspace = ws;
  made.id = ++ws->plans_made;
  if (!made.plan_in_block) {
    mla::MlaVerifyPlanKernel<<<1, 1024, 0, stream>>>(params.cache_seqlens, params.batch,
                                                     made.num_parts, ws->plan);
    const cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess) return err;
  }
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
  KernelArgs args = MakeArgs(params, ws);
  if (plan.plan_in_block) args.plan_store = ws->plan;
  cudaError_t err = cudaSuccess;
  switch (plan.path) {
    case MlaVerifyPath::kSplitKvSm90a:
      err = mla::LaunchTileSm90a(args, dim3(plan.row_tiles, plan.num_parts), plan.sm90a_schedule,
                                 stream);
      break;
    case MlaVerifyPath::kSplitKv:
      if (!mla::TileFits(plan.tile, TileDeviceOf(*ws))) return cudaErrorInvalidValue;
      err = LaunchTile<true>(plan.tile, args, plan.num_parts, stream);
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
  return LaunchMlaVerifyPath(params, ChooseMlaVerifyPath(*ws, params.s_q * params.h_q), ws, stream);
}

cudaError_t LaunchMlaVerifyBaseline(const MlaVerifyParams& params, const MlaVerifyWorkspace* ws,
                                    cudaStream_t stream) {
  const cudaError_t check = CheckMlaVerifyParams(params, ws);
  if (check != cudaSuccess) return check;
  const int32_t tile = mla::ChooseTile(params.s_q * params.h_q, TileDeviceOf(*ws)).index;
  if (tile < 0) return cudaErrorNotSupported;
  return LaunchTile<false>(tile, MakeArgs(params, ws), params.batch, stream);
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
