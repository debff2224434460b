// gather_wgmma: the gather fused into a Hopper warpgroup-MMA GEMM (wgmma, bf16/fp16 in, fp32
// accumulation), for many probes. Compiled only for -gencode arch=compute_90a,code=sm_90a
// (probe_score_wgmma_sm90a.cu).
//
// Block: kWGs warpgroups (128 threads each), a (64 kWGs) x kBN output tile: warpgroup w owns rows
// [64 w, 64 w + 64) and every column, one wgmma m64nBNk16 per 16-deep k-step with both operands
// read by the tensor cores from shared memory. K moves in 64-element tiles through a kStages-deep
// ring: the A tile (64 kWGs gathered rows of x) and the B tile (kBN rows of W, kTerms of them for
// exact precision) arrive by cp.async, 16 bytes a thread, the gathered rows zero-filled past
// num_rows and H. Each tile row is 128 bytes, stored in the tensor cores' 128-byte swizzle (chunk
// j of row r at chunk j ^ (r % 8)), so a 64 x 64 tile is one 8 KB "slab" the descriptors walk.
//
// Per k-tile: wait for its cp.async group, make it visible to the async proxy, barrier; issue this
// tile's wgmmas, then (4+ stages) wait until only they are in flight and load the tile
// kStages - 2 ahead into the stage read two batches ago, or (3 stages) load kStages - 1 ahead,
// the previous batch having completed before the barrier. Split-K
// (gridDim.z > 1) writes fp32 partials that SplitKReduceKernel sums, as for fused_tc.
#pragma once

#include <cute/arch/mma_sm90_gmma.hpp>

#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/blocks/alignment.h"
#include "kernels/blocks/cp_async.cuh"
#include "kernels/blocks/epilogue.cuh"
#include "kernels/blocks/row_gather.cuh"
#include "kernels/blocks/wgmma.cuh"
#include "kernels/probe_score/probe_score_device_helpers.cuh"

namespace probesidecar::kernels::probe_score_detail::sm90a {

inline constexpr int kBK = 64;  // elements per k-tile: one 128-byte swizzled row
inline constexpr int kSlabRowBytes = blocks::kSwizzleRowBytes;

template <int kWGs, int kBN, int kStages, int kTerms>
struct WgmmaShape {
  static constexpr int kThreads = 128 * kWGs;
  static constexpr int kBM = 64 * kWGs;
  static constexpr int kABytes = kBM * kSlabRowBytes;      // one stage of A
  static constexpr int kBTermBytes = kBN * kSlabRowBytes;  // one term of B
  static constexpr int kStageBytes = kABytes + kTerms * kBTermBytes;
  // + 1024: the swizzle needs 1024-byte aligned slabs; the dynamic base is aligned by hand.
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes;
  static constexpr int kAIters = kBM * 8 / kThreads;  // 16-byte chunks of A per thread
  static constexpr int kBIters = kBN * 8 / kThreads;  // of each B term
  static constexpr int kAcc = kBN / 2;                // fp32 accumulators per thread
  static_assert(kBN == 128 || kBN == 256, "wgmma N of 128 or 256");
  static_assert(kAIters * kThreads == kBM * 8 && kBIters * kThreads == kBN * 8, "chunk split");
};

template <typename T, int kBN>
struct WgmmaOp;
template <>
struct WgmmaOp<__nv_bfloat16, 128> {
  using type = cute::SM90::GMMA::MMA_64x128x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                              cute::SM90::GMMA::Major::K>;
};
template <>
struct WgmmaOp<__nv_bfloat16, 256> {
  using type = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<cute::SM90::GMMA::Major::K,
                                                              cute::SM90::GMMA::Major::K>;
};
template <>
struct WgmmaOp<__half, 128> {
  using type = cute::SM90::GMMA::MMA_64x128x16_F32F16F16_SS<cute::SM90::GMMA::Major::K,
                                                            cute::SM90::GMMA::Major::K>;
};
template <>
struct WgmmaOp<__half, 256> {
  using type = cute::SM90::GMMA::MMA_64x256x16_F32F16F16_SS<cute::SM90::GMMA::Major::K,
                                                            cute::SM90::GMMA::Major::K>;
};

// Grid (n_tiles, m_tiles, splits), n fastest so that the CTAs sharing a gathered A tile run
// together; block WgmmaShape::kThreads; dynamic shared memory WgmmaShape::kSmemBytes. TcParams
// as fused_tc reads them, plus w_rows (W's padded row count: B rows at or past it are zeros).
template <typename T, int kWGs, int kBN, int kStages, int kTerms>
__global__ void __launch_bounds__(128 * kWGs, 1)
    GatherWgmmaKernel(const __grid_constant__ TcParams p) {
  using S = WgmmaShape<kWGs, kBN, kStages, kTerms>;
  using Op = typename WgmmaOp<T, kBN>::type;
  // With 4 stages or more, one wgmma batch stays in flight while the next is issued, and loads
  // run kStages - 2 tiles ahead; with 3 (exact precision's tiles) keeping two tiles loading
  // matters more, so each batch completes before the barrier and loads run kStages - 1 ahead.
  constexpr bool kOverlap = kStages >= 4;
  constexpr int kAhead = kOverlap ? kStages - 2 : kStages - 1;
  static_assert(kStages >= 3, "at least 3 stages");
  extern __shared__ __align__(128) uint8_t wgmma_smem_raw[];
  uint8_t* smem = wgmma_smem_raw + blocks::SwizzleAtomPadding(blocks::SmemAddr(wgmma_smem_raw));
  const uint32_t s0 = blocks::SmemAddr(smem);
  // What follows (the split-K reduction, or the probe-outcome count: programmatic dependents) may
  // be scheduled now: it waits for this whole grid before reading. Triggered by every block, it
  // launches during the last wave.
  blocks::GridDependencyTrigger();

  const int n0 = blockIdx.x * kBN, m0 = blockIdx.y * S::kBM, split = blockIdx.z;
  const int tid = threadIdx.x;
  const int wg = tid / 128;
  const int chunk = tid & 7;  // this thread's 16-byte column of every tile row it loads
  const int row0 = tid >> 3;  // its first tile row; then every kThreads / 8 rows
  constexpr int kRowStep = S::kThreads / 8;
  const int kt_begin = (split * p.k_tiles) / p.splits;
  const int kt_end = ((split + 1) * p.k_tiles) / p.splits;
  const int nkt = kt_end - kt_begin;
  const T* w = static_cast<const T*>(p.weight);

  auto stage_addr = [&](int stage) { return s0 + stage * S::kStageBytes; };
  auto load_b = [&](int stage, int kt) {
    const int k = kt * kBK + chunk * 8;
    const bool k_in = k < p.w_row_stride;
#pragma unroll
    for (int term = 0; term < kTerms; ++term) {
      const uint32_t dst = stage_addr(stage) + S::kABytes + term * S::kBTermBytes;
#pragma unroll
      for (int i = 0; i < S::kBIters; ++i) {
        const int r = row0 + i * kRowStep;
        const bool ok = k_in && n0 + r < p.w_rows;
        const T* src =
            ok ? w + term * p.term_stride + static_cast<int64_t>(n0 + r) * p.w_row_stride + k : w;
        blocks::CpAsync16(dst + blocks::Swizzle128Offset(r, chunk), src, ok);
      }
    }
  };

  // Request-independent work first: the W tiles of the prologue, and this tile's row indices
  // (read speculatively up to max_rows; indices past num_rows are never dereferenced).
#pragma unroll
  for (int st = 0; st < kAhead; ++st) {  // the prologue's tiles
    if (st < nkt) load_b(st, kt_begin + st);
  }
  int32_t row_idx[S::kAIters];
  blocks::PrefetchRowIndices(row_idx, p.rows, m0 + row0, kRowStep, p.max_rows);
  const ProbeScoreDeviceArgs a = *p.args;
  const int num_rows = min(a.num_rows, p.max_rows);
  if (m0 >= num_rows) {
    blocks::CpAsyncWait<0>();
    return;
  }
  const bool vec_ok = blocks::RowsAre16ByteAligned<T>(a.x, a.x_row_stride);
  const T* a_row[S::kAIters];
  bool a_valid[S::kAIters];
  blocks::GatheredRowPointers(a_row, a_valid, row_idx, static_cast<const T*>(a.x), a.x_row_stride,
                              m0 + row0, kRowStep, num_rows);
  auto load_a = [&](int stage, int kt) {
    const int k = kt * kBK + chunk * 8;
    const bool k_in = k < p.hidden;  // H % 8 == 0: a chunk is wholly in or out
    const uint32_t dst = stage_addr(stage);
#pragma unroll
    for (int i = 0; i < S::kAIters; ++i) {
      const int r = row0 + i * kRowStep;
      const bool valid = a_valid[i] && k_in;
      if (vec_ok) {
        blocks::CpAsync16(dst + blocks::Swizzle128Offset(r, chunk),
                          valid ? static_cast<const void*>(a_row[i] + k) : p.weight, valid);
      } else {  // rows only 2-byte aligned: element loads, stored synchronously
        *reinterpret_cast<uint4*>(smem + (dst - s0) + blocks::Swizzle128Offset(r, chunk)) =
            blocks::Load16BytesBy2(a_row[i] + k, valid);
      }
    }
  };

  float acc[S::kAcc];
#pragma unroll
  for (int i = 0; i < S::kAcc; ++i) acc[i] = 0.0f;

#pragma unroll
  for (int st = 0; st < kAhead; ++st) {
    if (st < nkt) load_a(st, kt_begin + st);
    blocks::CpAsyncCommit();
  }

  for (int it = 0; it < nkt; ++it) {
    blocks::CpAsyncWait<kAhead - 1>();
    blocks::FenceProxyAsyncShared();  // cp.async wrote through the generic proxy; wgmma reads async
    if constexpr (!kOverlap) {
      blocks::FenceOperands(acc);
      cute::warpgroup_wait<0>();  // the previous batch: its stage is refilled below
    }
    __syncthreads();
    const int stage = it % kStages;
    const uint32_t a_base = stage_addr(stage) + wg * 64 * kSlabRowBytes;
    const uint32_t b_base = stage_addr(stage) + S::kABytes;
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint64_t da = blocks::SwizzledKMajorDesc(a_base + kk * 32);
#pragma unroll
      for (int term = 0; term < kTerms; ++term) {
        blocks::WgmmaSS<Op>(
            da, blocks::SwizzledKMajorDesc(b_base + term * S::kBTermBytes + kk * 32), acc);
      }
    }
    cute::warpgroup_commit_batch();
    if constexpr (kOverlap) cute::warpgroup_wait<1>();  // the previous batch is done
    blocks::FenceOperands(acc);
    const int next = it + kAhead;
    if (next < nkt) {
      load_a(next % kStages, kt_begin + next);
      load_b(next % kStages, kt_begin + next);
    }
    blocks::CpAsyncCommit();
  }
  cute::warpgroup_wait<0>();
  blocks::FenceOperands(acc);
  blocks::CpAsyncWait<0>();

  // Accumulator layout of wgmma m64nN (per warpgroup): warp v of the group holds rows
  // 16 v + lane / 4 and + 8; in each 8-column block j, columns 8 j + 2 (lane % 4) + {0, 1}:
  // acc[4 j + {0, 1}] for the first row, acc[4 j + {2, 3}] for the second.
  const int lane = tid & 31, warp_in_wg = (tid & 127) >> 5;
  const int row_base = m0 + wg * 64 + warp_in_wg * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < kBN / 8; ++j) {
    const int col = n0 + 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + 8 * h;
      if (row >= num_rows) continue;
      const float v0 = acc[4 * j + 2 * h] * p.acc_scale, v1 = acc[4 * j + 2 * h + 1] * p.acc_scale;
      if (p.splits == 1) {
        float* o = a.out + static_cast<int64_t>(row) * a.out_row_stride;
        blocks::StoreBiasActivated(o, col, p.num_probes, v0, p.bias, IsSigmoid(p.activation));
        blocks::StoreBiasActivated(o, col + 1, p.num_probes, v1, p.bias, IsSigmoid(p.activation));
      } else {
        blocks::StorePartialPair(
            p.partial + (static_cast<int64_t>(split) * p.partial_rows + row) * p.partial_ld + col,
            v0, v1);
      }
    }
  }
}

}  // namespace probesidecar::kernels::probe_score_detail::sm90a
