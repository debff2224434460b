// Gathering the rows of an activation matrix that an index array names into shared-memory tiles,
// 16 bytes at a time: the speculative read of a tile's row indices, the rows' base pointers, and
// the element loads that stand in for cp.async where rows are only 2-byte aligned. Callers branch
// on the alignment themselves (if (vec_ok) CpAsync16 else Load16BytesBy2): the branch inside a
// shared helper changes how nvcc schedules their main loops.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace probesidecar::kernels::blocks {

// The row indices of tile rows first, first + step, ..., read before the request's row count is
// known, so that their latency overlaps other work: reads stop at max_rows - 1 (the array's
// size); indices past the row count are never dereferenced.
template <int kN>
__device__ __forceinline__ void PrefetchRowIndices(int32_t (&index)[kN], const int32_t* rows,
                                                   int first, int step, int max_rows) {
#pragma unroll
  for (int i = 0; i < kN; ++i) index[i] = __ldg(rows + min(first + i * step, max_rows - 1));
}

// The base pointers of those rows of x [T, row_stride]; rows at or past num_rows are invalid and
// point at row 0 (valid memory that is never read).
template <typename T, int kN>
__device__ __forceinline__ void GatheredRowPointers(const T* (&row)[kN], bool (&valid)[kN],
                                                    const int32_t (&index)[kN], const T* x,
                                                    int64_t row_stride, int first, int step,
                                                    int num_rows) {
#pragma unroll
  for (int i = 0; i < kN; ++i) {
    valid[i] = first + i * step < num_rows;
    row[i] = valid[i] ? x + static_cast<int64_t>(index[i]) * row_stride : x;
  }
}

// 16 bytes at `src` as eight 2-byte loads (rows of an odd element stride or at an odd element
// offset are only 2-byte aligned); zeros, and nothing read, when !valid. Stored synchronously by
// the caller, whose barrier (or proxy fence, for the tensor cores) publishes them.
__device__ __forceinline__ uint4 Load16BytesBy2(const void* src, bool valid) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  uint32_t h[8];
#pragma unroll
  for (int e = 0; e < 8; ++e) h[e] = valid ? __ldg(s + e) : 0u;
  return make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16), h[4] | (h[5] << 16),
                    h[6] | (h[7] << 16));
}

}  // namespace probesidecar::kernels::blocks
