// The sm_90a (wgmma) tile kernel's instantiations, its tensor map and launcher. Built with
// -gencode arch=compute_90a,code=sm_90a only (see CMakeLists.txt); the plan and combine kernels
// it shares with the portable path live in mla_verify.cu.
#include <cuda.h>
#include <cudaTypedefs.h>

#include <cstring>

#include "kernels/mla_verify/mla_verify_internal.h"
#include "kernels/mla_verify/mla_verify_sm90a.cuh"

namespace probesidecar::kernels::mla {
namespace {

// cuTensorMapEncodeTiled, looked up once through the runtime (no libcuda link).
PFN_cuTensorMapEncodeTiled_v12000 g_encode_tiled = nullptr;

template <bool kSplit, bool kTma>
cudaError_t SetAttributes() {
  return cudaFuncSetAttribute(sm90a::MlaVerifyTileSm90aKernel<kSplit, kTma>,
                              cudaFuncAttributeMaxDynamicSharedMemorySize, sm90a::kSmemBytes);
}

// The cache as a 3-D tensor [pages, 64, 576] with the caller's strides; boxes of 32 rows x 64
// columns (128 bytes), swizzled as the wgmma descriptors expect. The page count is not known
// here: the bound is set high and the block table is trusted (as everywhere in the kernels).
cudaError_t EncodeKvMap(const MlaVerifyParams& p, CUtensorMap* map) {
  if (g_encode_tiled == nullptr) return cudaErrorNotSupported;
  const cuuint64_t dims[3] = {static_cast<cuuint64_t>(kMlaHeadDimQk), kMlaPageSize,
                              p.num_pages > 0 ? static_cast<cuuint64_t>(p.num_pages)
                                              : (cuuint64_t{1} << 31)};
  const cuuint64_t strides[2] = {static_cast<cuuint64_t>(p.kv_row_stride) * 2,
                                 static_cast<cuuint64_t>(p.kv_page_stride) * 2};
  const cuuint32_t box[3] = {64, sm90a::kN, 1};
  const cuuint32_t elem_strides[3] = {1, 1, 1};
  const CUresult r = g_encode_tiled(
      map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<__nv_bfloat16*>(p.kv_cache), dims,
      strides, box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
      CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace

bool Sm90aCompiled() { return true; }

cudaError_t SetSm90aAttributes(bool* tma_available) {
  *tma_available = false;
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult query;
  if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                       &query) == cudaSuccess &&
      query == cudaDriverEntryPointSuccess && fn != nullptr) {
    g_encode_tiled = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
    *tma_available = true;
  }
  const cudaError_t errs[] = {SetAttributes<true, true>(), SetAttributes<false, true>(),
                              SetAttributes<true, false>(), SetAttributes<false, false>()};
  for (cudaError_t e : errs) {
    if (e != cudaSuccess) return e;
  }
  return cudaSuccess;
}

cudaError_t LaunchTileSm90a(const KernelArgs& args, int32_t grid_y, bool split, bool tma,
                            cudaStream_t stream) {
  sm90a::Sm90aArgs targs;
  targs.args = args;
  if (tma) {
    const cudaError_t err = EncodeKvMap(args.p, &targs.kv_map);
    if (err != cudaSuccess) return err;
  } else {
    std::memset(&targs.kv_map, 0, sizeof(targs.kv_map));
  }
  const int32_t rows = args.p.s_q * args.p.h_q;
  const dim3 grid((rows + sm90a::kM - 1) / sm90a::kM, grid_y);
  constexpr int kT = sm90a::kThreads, kB = sm90a::kSmemBytes;
  if (split && tma) {
    sm90a::MlaVerifyTileSm90aKernel<true, true><<<grid, kT, kB, stream>>>(targs);
  } else if (split) {
    sm90a::MlaVerifyTileSm90aKernel<true, false><<<grid, kT, kB, stream>>>(targs);
  } else if (tma) {
    sm90a::MlaVerifyTileSm90aKernel<false, true><<<grid, kT, kB, stream>>>(targs);
  } else {
    sm90a::MlaVerifyTileSm90aKernel<false, false><<<grid, kT, kB, stream>>>(targs);
  }
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels::mla
