// gather_gemm: the kernels around the cuBLAS GEMM — the gather of the selected rows into a
// contiguous staging buffer, and the bias / activation epilogue on the GEMM's fp32 result.
// Included only by probe_score_gather_gemm.cu (instantiations and launchers).
#pragma once

#include "kernels/blocks/alignment.h"
#include "kernels/blocks/epilogue.cuh"
#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/probe_score/probe_score_device_helpers.cuh"

namespace probesidecar::kernels::probe_score_detail {

// Grid ceil(chunk_rows / 8), block 256 threads (a warp per row): staging[i] =
// x[rows[row_begin + i]] for the rows below num_rows (the others are left as they are: the
// epilogue never reads them).
template <typename T>
__global__ void __launch_bounds__(256) GatherRowsKernel(const __grid_constant__ GatherParams p) {
  constexpr int kVec = Elem<T>::kVec;
  const ProbeScoreDeviceArgs a = *p.args;
  const int local = blockIdx.x * 8 + threadIdx.x / 32;
  const int row = p.row_begin + local;
  const int lane = threadIdx.x % 32;
  if (local >= p.chunk_rows || row >= a.num_rows) return;
  const T* src =
      static_cast<const T*>(a.x) + static_cast<int64_t>(__ldg(p.rows + row)) * a.x_row_stride;
  T* dst = static_cast<T*>(p.staging) + static_cast<int64_t>(local) * p.hidden;
  const bool vec_ok = blocks::RowsAre16ByteAligned<T>(a.x, a.x_row_stride) && p.hidden % kVec == 0;
  if (vec_ok) {
    const int n = p.hidden / kVec;
    int c = lane;
    for (; c + 96 < n; c += 128) {  // 4 loads in flight per lane
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = LdStream16(src + (c + 32 * u) * kVec);
#pragma unroll
      for (int u = 0; u < 4; ++u) reinterpret_cast<uint4*>(dst)[c + 32 * u] = v[u];
    }
    for (; c < n; c += 32) reinterpret_cast<uint4*>(dst)[c] = LdStream16(src + c * kVec);
  } else {
    for (int h = lane; h < p.hidden; h += 32) dst[h] = src[h];
  }
}

// Grid ceil(chunk_rows * P / kThreads), block kThreads: out = act(c + bias) for the rows below
// num_rows.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    GemmEpilogueKernel(const __grid_constant__ EpilogueParams p) {
  // What follows (the probe-outcome count, a programmatic dependent) may be scheduled now: it
  // waits for this whole grid before reading. Triggered by every block, it launches during the
  // last wave.
  blocks::GridDependencyTrigger();
  const ProbeScoreDeviceArgs a = *p.args;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int local = static_cast<int>(idx / p.num_probes);
  const int probe = static_cast<int>(idx % p.num_probes);
  const int row = p.row_begin + local;
  if (local >= p.chunk_rows || row >= a.num_rows) return;
  a.out[static_cast<int64_t>(row) * a.out_row_stride + probe] = blocks::Activate(
      IsSigmoid(p.activation),
      __ldcg(p.c + static_cast<int64_t>(local) * p.ldc + probe) + __ldg(p.bias + probe));
}

}  // namespace probesidecar::kernels::probe_score_detail
