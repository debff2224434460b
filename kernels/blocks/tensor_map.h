// Tensor maps (TMA descriptors) for the sm_90a kernels, encoded on the host by the driver's
// cuTensorMapEncodeTiled. The binaries do not link libcuda: the encoder is looked up once per
// process through the runtime (cudaGetDriverEntryPointByVersion). Plain C++ with CUDA headers.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

namespace probesidecar::kernels::blocks {

// Whether the driver provides the encoder (looked up on the first call, once per process).
bool TensorMapEncoderAvailable();

// A tiled map of a `rank`-dimensional tensor of 16-bit `type` elements at `base`, boxes of
// `box` elements, in the 128-byte swizzle the wgmma descriptors read (no interleave, L2
// promotion of 256 bytes, boxes past the tensor's bounds zero-filled). dims[0] is the innermost
// (contiguous) extent in elements; byte_strides[i] is the distance in bytes between consecutive
// indices of dimension i + 1 (rank - 1 of them). Host only, no device access.
// cudaErrorNotSupported when the driver lacks the encoder, cudaErrorInvalidValue for what the
// encoder refuses.
cudaError_t EncodeSwizzled128TensorMap(CUtensorMap* map, CUtensorMapDataType type, int rank,
                                       const void* base, const cuuint64_t* dims,
                                       const cuuint64_t* byte_strides, const cuuint32_t* box);

}  // namespace probesidecar::kernels::blocks
