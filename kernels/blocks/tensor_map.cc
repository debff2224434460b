#include "kernels/blocks/tensor_map.h"

#include <cudaTypedefs.h>

namespace probesidecar::kernels::blocks {
namespace {

PFN_cuTensorMapEncodeTiled_v12000 Encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encoder = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult query;
    return cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                            &query) == cudaSuccess &&
                   query == cudaDriverEntryPointSuccess
               ? reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn)
               : nullptr;
  }();
  return encoder;
}

}  // namespace

bool TensorMapEncoderAvailable() { return Encoder() != nullptr; }

cudaError_t EncodeSwizzled128TensorMap(CUtensorMap* map, CUtensorMapDataType type, int rank,
                                       const void* base, const cuuint64_t* dims,
                                       const cuuint64_t* byte_strides, const cuuint32_t* box) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = Encoder();
  if (encode == nullptr) return cudaErrorNotSupported;
  if (map == nullptr || rank < 1 || rank > 5) return cudaErrorInvalidValue;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  const CUresult r =
      encode(map, type, static_cast<cuuint32_t>(rank), const_cast<void*>(base), dims, byte_strides,
             box, elem_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace probesidecar::kernels::blocks
