// Alignment tests the kernels' vector loads and their launchers' checks rely on. Plain C++ (host
// and device).
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define PROBESIDECAR_HD __host__ __device__ __forceinline__
#else
#define PROBESIDECAR_HD inline
#endif

namespace probesidecar::kernels::blocks {

PROBESIDECAR_HD bool Is16ByteAligned(const void* p) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

// Whether every row of a matrix of T at `base` with `row_stride` elements between rows starts on
// a 16-byte boundary (16-byte vector loads of whole rows are legal). Rows of an odd stride or at
// an odd offset are only element aligned. The arguments are references to the caller's fields:
// by-value copies change how nvcc allocates the registers of the kernels that test it (fused_cuda
// spilled more in SASS).
template <typename T>
PROBESIDECAR_HD bool RowsAre16ByteAligned(const void* const& base, const int64_t& row_stride) {
  return (reinterpret_cast<uintptr_t>(base) % 16 == 0) &&
         ((row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);
}

}  // namespace probesidecar::kernels::blocks

#undef PROBESIDECAR_HD
