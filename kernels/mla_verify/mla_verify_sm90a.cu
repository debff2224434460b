// The sm_90a (wgmma) tile kernels' tensor maps and launcher, and the setter of their timestamp
// trace. Built with -gencode arch=compute_90a,code=sm_90a only (see CMakeLists.txt); the plan and
// combine kernels they share with the portable path live in mla_verify.cu.
#include <cuda.h>

#include "kernels/blocks/launch.cuh"
#include "kernels/blocks/tensor_map.h"
#include "kernels/mla_verify/mla_verify_internal.h"
#include "kernels/mla_verify/mla_verify_sm90a.cuh"
#include "kernels/mla_verify/mla_verify_sm90a_page.cuh"
#include "kernels/mla_verify/mla_verify_sm90a_swap.cuh"
#include "kernels/mla_verify/mla_verify_trace.h"

namespace probesidecar::kernels::mla {
namespace {

// The cache as a 3-D tensor [pages, 64, 576] with the caller's strides; boxes of 64 rows x 64
// columns (128 bytes), swizzled as the wgmma descriptors expect. Without a page count the bound
// is set high and the block table is trusted (as everywhere in the kernels).
cudaError_t EncodeKvMap(const MlaVerifyParams& p, CUtensorMap* map) {
  const cuuint64_t dims[3] = {
      static_cast<cuuint64_t>(kMlaHeadDimQk), kMlaPageSize,
      p.num_pages > 0 ? static_cast<cuuint64_t>(p.num_pages) : (cuuint64_t{1} << 31)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.kv_row_stride) * 2,
                                 static_cast<cuuint64_t>(p.kv_page_stride) * 2};
  const cuuint32_t box[3] = {64, kMlaPageSize, 1};
  return blocks::EncodeSwizzled128TensorMap(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, p.kv_cache,
                                            dims, strides, box);
}

// The same bytes as a 4-D tensor [pages, 9 slabs, 64 rows, 64 columns] (a slab's columns are 128
// bytes further than the previous slab's); a box is 4 slabs of one page, which land in shared
// memory slab after slab as four 64 x 64 boxes would.
cudaError_t EncodeKvSlabMap(const MlaVerifyParams& p, CUtensorMap* map) {
  const cuuint64_t dims[4] = {
      64, kMlaPageSize, static_cast<cuuint64_t>(kMlaHeadDimQk / 64),
      p.num_pages > 0 ? static_cast<cuuint64_t>(p.num_pages) : (cuuint64_t{1} << 31)};
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(p.kv_row_stride) * 2, 128,
                                 static_cast<cuuint64_t>(p.kv_page_stride) * 2};
  const cuuint32_t box[4] = {64, kMlaPageSize, 4, 1};
  return blocks::EncodeSwizzled128TensorMap(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, p.kv_cache,
                                            dims, strides, box);
}

// q as a 4-D tensor [b, s_q, h_q, 576]; a box is one `tile_rows`-row tile of a request: 64
// columns x min(h_q, tile_rows) heads x tile_rows / min(h_q, tile_rows) tokens, so its rows land
// token-major (row = j * h_q + h) and the rows past s_q * h_q (tokens past s_q) come in as zeros.
cudaError_t EncodeQMap(const MlaVerifyParams& p, int tile_rows, CUtensorMap* map) {
  const cuuint32_t heads = static_cast<cuuint32_t>(p.h_q < tile_rows ? p.h_q : tile_rows);
  const cuuint64_t dims[4] = {static_cast<cuuint64_t>(kMlaHeadDimQk),
                              static_cast<cuuint64_t>(p.h_q), static_cast<cuuint64_t>(p.s_q),
                              static_cast<cuuint64_t>(p.batch)};
  // The stride of a dimension of extent 1 is never used; a valid one stands in for it.
  const int64_t token_stride = p.s_q > 1 ? p.q_token_stride : p.h_q * p.q_head_stride;
  const int64_t batch_stride = p.batch > 1 ? p.q_batch_stride : p.s_q * token_stride;
  const cuuint64_t strides[3] = {static_cast<cuuint64_t>(p.q_head_stride) * 2,
                                 static_cast<cuuint64_t>(token_stride) * 2,
                                 static_cast<cuuint64_t>(batch_stride) * 2};
  const cuuint32_t box[4] = {64, heads, static_cast<cuuint32_t>(tile_rows) / heads, 1};
  return blocks::EncodeSwizzled128TensorMap(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 4, p.q, dims,
                                            strides, box);
}

// Where the launches record their trace (SetMlaVerifyTraceBuffer); stays empty unless the trace
// is compiled in.
TraceArgs g_trace;

// The shared-memory limit of one kernel, and whether it can be a programmatic dependent (read
// now, outside any capture).
template <typename Kernel>
cudaError_t PrepareKernel(Kernel kernel, int smem_bytes) {
  const cudaError_t err =
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
  if (err == cudaSuccess) blocks::ProgrammaticLaunchUsable(reinterpret_cast<const void*>(kernel));
  return err;
}

// Both instantiations of a kernel: reading the workspace's plan, and planning in block.
template <template <bool> class Of>
cudaError_t PrepareBoth(int smem_bytes) {
  const cudaError_t err = PrepareKernel(Of<false>::kKernel, smem_bytes);
  return err != cudaSuccess ? err : PrepareKernel(Of<true>::kKernel, smem_bytes);
}
template <bool kOwnPlan>
struct PagePairsKernel {
  static constexpr auto kKernel = sm90a::MlaVerifyTileSm90aKernel<kOwnPlan>;
};
template <bool kOwnPlan>
struct OnePageKernel {
  static constexpr auto kKernel = sm90a::MlaVerifyPageSm90aKernel<kOwnPlan>;
};
template <int kN>
struct SwapKernelOf {
  template <bool kOwnPlan>
  struct Of {
    static constexpr auto kKernel = sm90a::MlaVerifySwapSm90aKernel<kN, kOwnPlan>;
  };
};

// Launches Of<own_plan>::kKernel as a programmatic dependent of the kernel before it (the plan
// kernel, or what wrote the lengths): its set-up overlaps that kernel's tail, and it waits for it
// in-kernel before reading anything global.
template <template <bool> class Of, typename Args>
cudaError_t LaunchEither(bool own_plan, dim3 grid, int threads, int smem_bytes,
                         cudaStream_t stream, const Args& targs) {
  return own_plan ? blocks::LaunchProgrammaticDependent(Of<true>::kKernel, grid, dim3(threads),
                                                        smem_bytes, stream, targs)
                  : blocks::LaunchProgrammaticDependent(Of<false>::kKernel, grid, dim3(threads),
                                                        smem_bytes, stream, targs);
}

}  // namespace

cudaError_t SetSm90aAttributes(bool* available) {
  *available = false;
  if (!blocks::TensorMapEncoderAvailable()) {
    return cudaSuccess;  // no tensor maps: the portable path serves every shape
  }
  cudaError_t err = PrepareBoth<PagePairsKernel>(sm90a::kSmemBytes);
  if (err == cudaSuccess) err = PrepareBoth<OnePageKernel>(sm90a::kPageSmemBytes);
  if (err == cudaSuccess) err = PrepareBoth<SwapKernelOf<16>::Of>(sm90a::kSwapSmemBytes<16>);
  if (err == cudaSuccess) err = PrepareBoth<SwapKernelOf<32>::Of>(sm90a::kSwapSmemBytes<32>);
  if (err != cudaSuccess) return err;
  *available = true;
  return cudaSuccess;
}

namespace {

// The swap-AB kernel for kN = s_q * h_q rows (16 or 32): one row tile, 160 threads.
cudaError_t LaunchSwapSm90a(const KernelArgs& args, dim3 grid, cudaStream_t stream) {
  const int32_t rows = args.p.s_q * args.p.h_q;
  if (!SwapAbFits(rows) || grid.x != 1) return cudaErrorInvalidValue;
  sm90a::SwapArgs targs;
  targs.args = args;
  targs.trace = g_trace;
  cudaError_t err = EncodeKvMap(args.p, &targs.kv_map);
  if (err == cudaSuccess) err = EncodeQMap(args.p, rows, &targs.q_map);
  if (err == cudaErrorNotSupported) return cudaErrorInvalidDeviceFunction;  // no encoder
  if (err != cudaSuccess) return err;
  const bool own_plan = args.plan_store != nullptr;
  return rows == 16 ? LaunchEither<SwapKernelOf<16>::Of>(own_plan, grid, sm90a::kSwapThreads,
                                                         sm90a::kSwapSmemBytes<16>, stream, targs)
                    : LaunchEither<SwapKernelOf<32>::Of>(own_plan, grid, sm90a::kSwapThreads,
                                                         sm90a::kSwapSmemBytes<32>, stream, targs);
}

}  // namespace

cudaError_t LaunchTileSm90a(const KernelArgs& args, dim3 grid, MlaVerifySm90aSchedule schedule,
                            cudaStream_t stream) {
  if (schedule == MlaVerifySm90aSchedule::kSwapAb) return LaunchSwapSm90a(args, grid, stream);
  if (schedule != MlaVerifySm90aSchedule::kOnePage &&
      schedule != MlaVerifySm90aSchedule::kPagePairs) {
    return cudaErrorInvalidValue;
  }
  sm90a::Sm90aArgs targs;
  targs.args = args;
  targs.trace = g_trace;
  cudaError_t err = EncodeKvMap(args.p, &targs.kv_map);
  if (err == cudaSuccess) err = EncodeKvSlabMap(args.p, &targs.kv_slab_map);
  if (err == cudaSuccess) err = EncodeQMap(args.p, sm90a::kM, &targs.q_map);
  if (err == cudaErrorNotSupported) return cudaErrorInvalidDeviceFunction;  // no encoder
  if (err != cudaSuccess) return err;
  const bool own_plan = args.plan_store != nullptr;
  return schedule == MlaVerifySm90aSchedule::kOnePage
             ? LaunchEither<OnePageKernel>(own_plan, grid, sm90a::kThreads, sm90a::kPageSmemBytes,
                                           stream, targs)
             : LaunchEither<PagePairsKernel>(own_plan, grid, sm90a::kThreads, sm90a::kSmemBytes,
                                             stream, targs);
}

}  // namespace probesidecar::kernels::mla

namespace probesidecar::kernels {

bool MlaVerifyTraceCompiledIn() { return mla::kTraceOn; }

cudaError_t SetMlaVerifyTraceBuffer(uint32_t* buffer, int32_t max_blocks,
                                    int32_t events_per_warpgroup) {
  if (!mla::kTraceOn) return cudaErrorNotSupported;
  if (buffer != nullptr && (max_blocks < 1 || events_per_warpgroup < 2)) {
    return cudaErrorInvalidValue;
  }
  mla::g_trace = buffer == nullptr ? mla::TraceArgs{}
                                   : mla::TraceArgs{buffer, max_blocks, events_per_warpgroup};
  return cudaSuccess;
}

}  // namespace probesidecar::kernels
