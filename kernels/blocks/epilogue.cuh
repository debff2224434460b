// The epilogue of a GEMM whose float32 sums are the outputs: bias, an optional sigmoid and a
// bounds-checked store; and the store of one K split's partial sums for a reduction after it.
#pragma once

#include <cuda_runtime.h>

namespace probesidecar::kernels::blocks {

// v, through 1 / (1 + e^-v) when `sigmoid`.
__device__ __forceinline__ float Activate(bool sigmoid, float v) {
  return sigmoid ? 1.0f / (1.0f + expf(-v)) : v;
}

// Column col of one output row (`row` points at its column 0), if below num_cols: sum v with its
// bias and activation.
__device__ __forceinline__ void StoreBiasActivated(float* row, int col, int num_cols, float v,
                                                   const float* bias, bool sigmoid) {
  if (col < num_cols) row[col] = Activate(sigmoid, v + __ldg(bias + col));
}

// Columns col and col + 1 of one output row, those below num_cols: sums v0 and v1 with their bias
// and activation. fused_tc stores its pairs with this, the gather_wgmma kernels with two
// StoreBiasActivated calls: each form keeps the machine code of the kernels that use it (the other
// form changes their register allocation).
__device__ __forceinline__ void StoreBiasActivatedPair(float* row, int col, int num_cols, float v0,
                                                       float v1, const float* bias, bool sigmoid) {
  const float v[2] = {v0, v1};
#pragma unroll
  for (int e = 0; e < 2; ++e) {
    if (col + e < num_cols) row[col + e] = Activate(sigmoid, v[e] + __ldg(bias + col + e));
  }
}

// Partial sums of two adjacent columns of one split (`p` 8-byte aligned; partial tiles are padded
// to whole tiles, so no bounds), cached in L2 only: the reduction reads them from there.
__device__ __forceinline__ void StorePartialPair(float* p, float v0, float v1) {
  __stcg(reinterpret_cast<float2*>(p), make_float2(v0, v1));
}

}  // namespace probesidecar::kernels::blocks
