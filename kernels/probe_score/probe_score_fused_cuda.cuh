// fused_cuda: the CUDA-core kernel that gathers each selected row once and scores it against a
// few probes held in shared memory. Any dtype, any H, any alignment. Included only by
// probe_score_fused_cuda.cu (explicit instantiations and their launcher).
#pragma once

#include "kernels/blocks/alignment.h"
#include "kernels/blocks/cp_async.cuh"
#include "kernels/blocks/epilogue.cuh"
#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/blocks/row_gather.cuh"
#include "kernels/probe_score/probe_score_config.h"
#include "kernels/probe_score/probe_score_device_helpers.cuh"

namespace probesidecar::kernels::probe_score_detail {

// One 16-byte chunk (kVec elements) starting at p, raw: the unpacking to float happens at the
// point of use so that the loads in flight cost 4 registers each, not kVec. `valid` elements are
// in range (the rest read as 0); the 16-byte load needs vec_ok and a full chunk, otherwise
// elements are read one by one (rows only 2-byte aligned, or the tail of H).
template <typename T>
__device__ __forceinline__ uint4 LoadChunkRaw(const T* p, int valid, bool vec_ok) {
  constexpr int kVec = Elem<T>::kVec;
  if (vec_ok && valid >= kVec) return LdStream16(p);
  uint32_t w[4] = {0u, 0u, 0u, 0u};
  if constexpr (sizeof(T) == 4) {
    const uint32_t* q = reinterpret_cast<const uint32_t*>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) w[i] = i < valid ? __ldg(q + i) : 0u;
  } else {
    const uint16_t* q = reinterpret_cast<const uint16_t*>(p);
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const uint32_t h = i < valid ? static_cast<uint32_t>(__ldg(q + i)) : 0u;
      w[i / 2] |= h << (16 * (i % 2));
    }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// Sums v[0..N) over the 32 lanes of a warp while spreading the results: for N >= 32, lane l
// ends with the sums of indices l * (N / 32) + i in v[i]; for N < 32, v[0] holds the sum of index
// l / (32 / N). 31 + N - 1 shuffles instead of 5 * N for a plain butterfly per value.
template <int kCount, int kOffset, int N>
__device__ __forceinline__ void TransposeReduce(float (&v)[N], int lane) {
  if constexpr (kOffset >= 1) {
    if constexpr (kCount >= 2) {
      constexpr int kHalf = kCount / 2;
      const bool upper = (lane & kOffset) != 0;
#pragma unroll
      for (int i = 0; i < kHalf; ++i) {
        const float send = upper ? v[i] : v[i + kHalf];
        const float keep = upper ? v[i + kHalf] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOffset);
      }
      TransposeReduce<kHalf, kOffset / 2>(v, lane);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kOffset);
      TransposeReduce<1, kOffset / 2>(v, lane);
    }
  }
}

// fused_cuda: CUDA cores, any dtype, any H, any alignment.
//
// Grid (row_groups, splits, probe_tiles), block 256 threads = 8 warps. A block owns a K range
// [s * k_per_split, ...) and kPT probes; it keeps W for that range (or k_per_smem of it at a
// time) in shared memory as fp32 and streams row blocks of 32 rows (4 rows per warp) over it:
// each lane loads 16-byte chunks of 4 rows (8 loads in flight), multiplies by W from shared
// memory (one W read serves 4 rows), and the warp reduces 4 * kPT sums with a transposing
// shuffle reduction. With splits > 1 each block writes partial sums and the last block of a
// (row group, probe tile) to finish adds them in split order (deterministic), applies bias and
// activation, and resets its counter for the next launch.
template <typename T, int kPT>
__global__ void __launch_bounds__(kFusedThreads, 2)
    FusedCudaKernel(const __grid_constant__ FusedCudaParams p) {
  // What follows (the probe-outcome count, a programmatic dependent) may be scheduled now: it
  // waits for this whole grid before reading. Triggered by every block, it launches during the
  // last wave.
  blocks::GridDependencyTrigger();
  constexpr int kVec = Elem<T>::kVec;
  // Chunk steps per loop iteration: 4 for 1-2 probes (16 independent 16-byte loads in flight
  // per lane: this case is purely memory-bound), 2 otherwise, 1 for 16-bit inputs with 16 probes
  // where 64 accumulators leave no room for more raw words.
  constexpr int kUnroll = kPT <= 2 ? 4 : ((kPT >= 16 && sizeof(T) == 2) ? 1 : 2);
  constexpr int kGran = 32 * kVec;  // elements one warp covers per chunk step
  constexpr int kN = kFusedRowsPerWarp * kPT;
  extern __shared__ float4 fused_smem[];
  float* w_s = reinterpret_cast<float*>(fused_smem);  // [kPT, k_per_smem]

  __shared__ int s_is_last;
  const int g = blockIdx.x, split = blockIdx.y, pt = blockIdx.z;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int k_begin = split * p.k_per_split;
  const int k_len = min(p.k_per_split, p.hidden - k_begin);
  const int num_sub = (k_len + p.k_per_smem - 1) / p.k_per_smem;
  const int probe0 = pt * kPT;
  const int ldp = p.probe_tiles * kPT;  // partial row pitch

  // W[probe0 .. +kPT, kb .. kb + k_per_smem) -> w_s with cp.async, zero past the padded width.
  auto load_w = [&](int kb) {
    const int quads = p.k_per_smem / 4;
    for (int i = threadIdx.x; i < kPT * quads; i += kFusedThreads) {
      const int pp = i / quads, kk = (i % quads) * 4;
      const bool in = kb + kk < p.w_row_stride;
      blocks::CpAsync16(
          blocks::SmemAddr(w_s + 4 * i),
          in ? static_cast<const void*>(
                   p.weight + static_cast<int64_t>(probe0 + pp) * p.w_row_stride + kb + kk)
             : static_cast<const void*>(p.weight),
          in);
    }
    blocks::CpAsyncCommit();
  };

  // What does not depend on the request goes first, so that its latency overlaps the read of
  // the arguments: the W slice and the row indices of the first row block (read speculatively
  // up to max_rows; indices past num_rows are never dereferenced).
  if (num_sub == 1) load_w(k_begin);
  int32_t row_idx[kFusedRowsPerWarp];
  blocks::PrefetchRowIndices(row_idx, p.rows, g * kFusedRowsPerBlock + warp * kFusedRowsPerWarp, 1,
                             p.max_rows);
  const ProbeScoreDeviceArgs a = *p.args;
  const int num_rows = min(a.num_rows, p.max_rows);
  const int row_blocks = (num_rows + kFusedRowsPerBlock - 1) / kFusedRowsPerBlock;
  if (g >= row_blocks) {  // every split of this row group leaves too: counter untouched
    blocks::CpAsyncWait<0>();
    return;
  }
  const bool vec_ok = blocks::RowsAre16ByteAligned<T>(a.x, a.x_row_stride);
  const T* x = static_cast<const T*>(a.x);
  if (num_sub == 1) {
    blocks::CpAsyncWait<0>();
    __syncthreads();
  }

  for (int rb = g; rb < row_blocks; rb += p.row_groups) {
    const int r0 = rb * kFusedRowsPerBlock + warp * kFusedRowsPerWarp;
    const bool warp_active = r0 < num_rows;  // warp-uniform
    // Rows past num_rows read row 0 (valid memory); their sums are never written.
    const T* xr[kFusedRowsPerWarp];
#pragma unroll
    for (int i = 0; i < kFusedRowsPerWarp; ++i) {
      xr[i] =
          x + (r0 + i < num_rows ? static_cast<int64_t>(row_idx[i]) * a.x_row_stride : 0) + k_begin;
    }
    // Prefetch the next row block's indices.
    if (rb + p.row_groups < row_blocks) {
      blocks::PrefetchRowIndices(
          row_idx, p.rows, (rb + p.row_groups) * kFusedRowsPerBlock + warp * kFusedRowsPerWarp, 1,
          p.max_rows);
    }
    float acc[kN];
#pragma unroll
    for (int i = 0; i < kN; ++i) acc[i] = 0.0f;

    for (int sub = 0; sub < num_sub; ++sub) {
      const int sub_begin = sub * p.k_per_smem;
      const int sub_len = min(p.k_per_smem, k_len - sub_begin);
      if (num_sub > 1) {
        __syncthreads();  // the previous slice is no longer read
        load_w(k_begin + sub_begin);
        blocks::CpAsyncWait<0>();
        __syncthreads();
      }
      if (!warp_active) continue;
      for (int c = lane * kVec; c < sub_len; c += kUnroll * kGran) {
        uint4 xraw[kUnroll][kFusedRowsPerWarp];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int cu = c + u * kGran;
#pragma unroll
          for (int i = 0; i < kFusedRowsPerWarp; ++i) {
            xraw[u][i] = cu < sub_len
                             ? LoadChunkRaw<T>(xr[i] + sub_begin + cu, sub_len - cu, vec_ok)
                             : make_uint4(0u, 0u, 0u, 0u);
          }
        }
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          const int cu = c + u * kGran;
          if (cu < sub_len) {
            // Four elements of the 4 rows at a time: 16 unpacked floats live, not 4 * kVec.
#pragma unroll
            for (int q = 0; q < kVec / 4; ++q) {
              float xv[kFusedRowsPerWarp][4];
#pragma unroll
              for (int i = 0; i < kFusedRowsPerWarp; ++i) Elem<T>::UnpackQuad(xraw[u][i], q, xv[i]);
#pragma unroll
              for (int pp = 0; pp < kPT; ++pp) {
                const float4 w =
                    *reinterpret_cast<const float4*>(w_s + pp * p.k_per_smem + cu + 4 * q);
#pragma unroll
                for (int i = 0; i < kFusedRowsPerWarp; ++i) {
                  float s = acc[i * kPT + pp];
                  s = fmaf(xv[i][0], w.x, s);
                  s = fmaf(xv[i][1], w.y, s);
                  s = fmaf(xv[i][2], w.z, s);
                  s = fmaf(xv[i][3], w.w, s);
                  acc[i * kPT + pp] = s;
                }
              }
            }
          }
        }
      }
    }
    if (!warp_active) continue;

    TransposeReduce<kN, 16>(acc, lane);
    constexpr int kPerLane = kN >= 32 ? kN / 32 : 1;
    constexpr int kLanesPerValue = kN >= 32 ? 1 : 32 / kN;
    const bool lane_writes = (lane % kLanesPerValue) == 0;
    if (lane_writes) {
#pragma unroll
      for (int i = 0; i < kPerLane; ++i) {
        const int idx = kN >= 32 ? lane * kPerLane + i : lane / kLanesPerValue;
        const int row = r0 + idx / kPT;
        const int probe = probe0 + idx % kPT;
        if (row < num_rows && probe < p.num_probes) {
          if (p.splits == 1) {
            a.out[static_cast<int64_t>(row) * a.out_row_stride + probe] =
                blocks::Activate(IsSigmoid(p.activation), acc[i] + __ldg(p.bias + probe));
          } else {
            p.partial[(static_cast<int64_t>(split) * p.max_rows + row) * ldp + probe] = acc[i];
          }
        }
      }
    }
  }

  if (p.splits == 1) return;
  // Split-K fix-up: the last block of this (row group, probe tile) sums the partials.
  __threadfence();
  __syncthreads();
  int32_t* counter = p.counters + pt * p.row_groups + g;
  if (threadIdx.x == 0) s_is_last = atomicAdd(counter, 1) == p.splits - 1;
  __syncthreads();
  if (!s_is_last) return;
  __threadfence();
  for (int rb = g; rb < row_blocks; rb += p.row_groups) {
    for (int e = threadIdx.x; e < kFusedRowsPerBlock * kPT; e += kFusedThreads) {
      const int row = rb * kFusedRowsPerBlock + e / kPT;
      const int probe = probe0 + e % kPT;
      if (row >= num_rows || probe >= p.num_probes) continue;
      float sum = 0.0f;
      for (int s = 0; s < p.splits; ++s) {
        sum += __ldcg(p.partial + (static_cast<int64_t>(s) * p.max_rows + row) * ldp + probe);
      }
      a.out[static_cast<int64_t>(row) * a.out_row_stride + probe] =
          blocks::Activate(IsSigmoid(p.activation), sum + __ldg(p.bias + probe));
    }
  }
  if (threadIdx.x == 0) *counter = 0;
}

}  // namespace probesidecar::kernels::probe_score_detail
