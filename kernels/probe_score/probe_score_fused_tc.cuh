// fused_tc: the gather fused into a tensor-core GEMM (mma.sync m16n8k16, bf16/fp16 in, fp32
// accumulation), and the split-K reduction that follows it when K is split. Included only by
// probe_score_fused_tc.cu (explicit instantiations and their launchers).
#pragma once

#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/blocks/alignment.h"
#include "kernels/blocks/cp_async.cuh"
#include "kernels/blocks/epilogue.cuh"
#include "kernels/blocks/row_gather.cuh"
#include "kernels/blocks/warp_mma.cuh"
#include "kernels/probe_score/probe_score_device_helpers.cuh"

namespace probesidecar::kernels::probe_score_detail {

template <int kBM, int kBN, int kBK, int kWM, int kWN, int kStages, int kTerms>
struct TcShape {
  static constexpr int kThreads = kWM * kWN * 32;
  static constexpr int kWarpM = kBM / kWM;  // rows per warp
  static constexpr int kWarpN = kBN / kWN;  // probes per warp
  static constexpr int kMT = kWarpM / 16;
  static constexpr int kNT = kWarpN / 8;
  static constexpr int kChunks = kBK / 8;          // 16-byte chunks per smem row
  static constexpr int kAStage = kBM * kBK;        // elements
  static constexpr int kBTerm = kBN * kBK;         // one weight term's tile
  static constexpr int kBStage = kTerms * kBTerm;  // exact: the three terms side by side
  static constexpr int kSmemBytes = kStages * (kAStage + kBStage) * 2;
  static constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of chunks covers
  static constexpr int kAIters = kBM / kRowsPerPass;
  static constexpr int kBIters = kBN / kRowsPerPass;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tile must be 16 x 16 multiples");
  static_assert(kChunks >= 8 && kThreads % kChunks == 0, "the swizzle needs >= 8 chunks a row");
  static_assert(kBM % kRowsPerPass == 0 && kBN % kRowsPerPass == 0, "tile rows per pass");
};

// fused_tc: gather fused into a tensor-core GEMM (mma.sync m16n8k16, bf16/fp16 in, fp32 acc).
//
// Grid (n_tiles, m_tiles, splits): n fastest, so the CTAs that share a gathered A tile run
// together and the rows come from HBM once. Block kWM x kWN warps, each computing a
// (kBM / kWM) x (kBN / kWN) tile. A [kBM rows of x, kBK k] is gathered row by row with
// cp.async (16 bytes, zero-filled past num_rows and H) or, when rows are not 16-byte aligned,
// with 2-byte loads stored synchronously; B [kBN probes, kBK k] is W, already padded. kStages
// shared-memory stages; smem rows of kBK elements with the 16-byte chunk index XOR (row % 8), so
// that ldmatrix reads 8 rows without bank conflicts. A long kBK (256) makes each row's request
// 512 contiguous bytes, which HBM serves far better than 128-byte pieces of random rows.
// Split-K (splits > 1): each split writes its fp32 partial tile; SplitKReduceKernel sums them.
// Exact precision (kTerms = 3): each A fragment meets the three weight terms in turn, into the
// same fp32 accumulator (every bf16 x bf16 or fp16 x fp16 product is exact in fp32); the sum is
// multiplied by acc_scale (1 / the terms' power-of-two scale) before the bias.
template <typename T, int kBM, int kBN, int kBK, int kWM, int kWN, int kStages, int kTerms>
__global__ void __launch_bounds__(kWM* kWN * 32) FusedTcKernel(const __grid_constant__ TcParams p) {
  using S = TcShape<kBM, kBN, kBK, kWM, kWN, kStages, kTerms>;
  // What follows (the split-K reduction, or the probe-outcome count: programmatic dependents) may
  // be scheduled now: it waits for this whole grid before reading. Triggered by every block, it
  // launches during the last wave.
  blocks::GridDependencyTrigger();
  extern __shared__ uint4 tc_smem[];
  T* sa = reinterpret_cast<T*>(tc_smem);  // [kStages, kBM, kBK] swizzled
  T* sb = sa + kStages * S::kAStage;      // [kStages, kBN, kBK] swizzled

  const int n_tile = blockIdx.x, m_tile = blockIdx.y, split = blockIdx.z;
  const int m0 = m_tile * kBM, n0 = n_tile * kBN;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int warp_m = warp / kWN, warp_n = warp % kWN;
  const T* w = static_cast<const T*>(p.weight);
  const int chunk = tid % S::kChunks;  // this thread's 16-byte chunk column
  const int row0 = tid / S::kChunks;   // and its first tile row
  const int kt_begin = (split * p.k_tiles) / p.splits;
  const int kt_end = ((split + 1) * p.k_tiles) / p.splits;
  const int nkt = kt_end - kt_begin;

  auto load_b = [&](int stage, int kt) {
    const int k = kt * kBK + chunk * 8;
    const bool w_in = k < p.w_row_stride;  // W is zero-padded to w_row_stride columns
#pragma unroll
    for (int term = 0; term < kTerms; ++term) {
#pragma unroll
      for (int i = 0; i < S::kBIters; ++i) {
        const int r = row0 + i * S::kRowsPerPass;
        T* dst = sb + stage * S::kBStage + term * S::kBTerm + r * kBK + ((chunk ^ (r & 7)) * 8);
        blocks::CpAsync16(
            blocks::SmemAddr(dst),
            w_in ? static_cast<const void*>(w + term * p.term_stride +
                                            static_cast<int64_t>(n0 + r) * p.w_row_stride + k)
                 : p.weight,
            w_in);
      }
    }
  };

  // Request-independent work first, overlapping the read of the arguments: the W tiles of the
  // prologue stages (they join the first cp.async group) and the row indices of this tile, read
  // speculatively up to max_rows (indices past num_rows are never dereferenced).
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nkt) load_b(st, kt_begin + st);
  }
  int32_t row_idx[S::kAIters];
  blocks::PrefetchRowIndices(row_idx, p.rows, m0 + row0, S::kRowsPerPass, p.max_rows);

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
                              m0 + row0, S::kRowsPerPass, num_rows);

  auto load_a = [&](int stage, int kt) {
    const int k = kt * kBK + chunk * 8;
    const bool k_in = k < p.hidden;  // H % 8 == 0: a chunk is wholly in or out
#pragma unroll
    for (int i = 0; i < S::kAIters; ++i) {
      const int r = row0 + i * S::kRowsPerPass;
      T* dst = sa + stage * S::kAStage + r * kBK + ((chunk ^ (r & 7)) * 8);
      const bool valid = a_valid[i] && k_in;
      if (vec_ok) {
        blocks::CpAsync16(blocks::SmemAddr(dst),
                          valid ? static_cast<const void*>(a_row[i] + k) : p.weight, valid);
      } else {  // rows only 2-byte aligned
        *reinterpret_cast<uint4*>(dst) = blocks::Load16BytesBy2(a_row[i] + k, valid);
      }
    }
  };

  float acc[S::kMT][S::kNT][4];
#pragma unroll
  for (int i = 0; i < S::kMT; ++i)
#pragma unroll
    for (int j = 0; j < S::kNT; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;

#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (st < nkt) load_a(st, kt_begin + st);
    blocks::CpAsyncCommit();
  }

  for (int it = 0; it < nkt; ++it) {
    blocks::CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = it + kStages - 1;
    if (next < nkt) {
      load_a(next % kStages, kt_begin + next);
      load_b(next % kStages, kt_begin + next);
    }
    blocks::CpAsyncCommit();

    const int stage = it % kStages;
    const T* sa_st = sa + stage * S::kAStage;
    const T* sb_st = sb + stage * S::kBStage;
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      uint32_t af[S::kMT][4];
      uint32_t bf[S::kNT][2];
#pragma unroll
      for (int mt = 0; mt < S::kMT; ++mt) {
        const int r = warp_m * S::kWarpM + mt * 16 + (lane % 16);
        const int c = kk * 2 + lane / 16;
        blocks::LdMatrixX4(blocks::SmemAddr(sa_st + r * kBK + ((c ^ (r & 7)) * 8)), af[mt]);
      }
#pragma unroll
      for (int term = 0; term < kTerms; ++term) {
#pragma unroll
        for (int np = 0; np < S::kNT / 2; ++np) {
          const int r = warp_n * S::kWarpN + np * 16 + (lane / 16) * 8 + (lane % 8);
          const int c = kk * 2 + (lane / 8) % 2;
          uint32_t t[4];
          blocks::LdMatrixX4(
              blocks::SmemAddr(sb_st + term * S::kBTerm + r * kBK + ((c ^ (r & 7)) * 8)), t);
          bf[2 * np][0] = t[0];
          bf[2 * np][1] = t[1];
          bf[2 * np + 1][0] = t[2];
          bf[2 * np + 1][1] = t[3];
        }
#pragma unroll
        for (int mt = 0; mt < S::kMT; ++mt)
#pragma unroll
          for (int nt = 0; nt < S::kNT; ++nt) {
            blocks::Mma16816<T>(acc[mt][nt], af[mt], bf[nt][0], bf[nt][1]);
          }
      }
    }
  }
  blocks::CpAsyncWait<0>();
  if constexpr (kTerms > 1) {
#pragma unroll
    for (int i = 0; i < S::kMT; ++i)
#pragma unroll
      for (int j = 0; j < S::kNT; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) acc[i][j][e] *= p.acc_scale;
  }

  // Fragment (mt, nt): c0, c1 at (row g, cols 2t, 2t+1), c2, c3 at (row g + 8, same cols).
  const int g = lane / 4, t4 = lane % 4;
#pragma unroll
  for (int mt = 0; mt < S::kMT; ++mt) {
#pragma unroll
    for (int nt = 0; nt < S::kNT; ++nt) {
      const int col = n0 + warp_n * S::kWarpN + nt * 8 + 2 * t4;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = m0 + warp_m * S::kWarpM + mt * 16 + g + 8 * h;
        if (row >= num_rows) continue;
        const float v0 = acc[mt][nt][2 * h], v1 = acc[mt][nt][2 * h + 1];
        if (p.splits == 1) {
          blocks::StoreBiasActivatedPair(a.out + static_cast<int64_t>(row) * a.out_row_stride, col,
                                         p.num_probes, v0, v1, p.bias, IsSigmoid(p.activation));
        } else {
          blocks::StorePartialPair(
              p.partial + (static_cast<int64_t>(split) * p.partial_rows + row) * p.partial_ld + col,
              v0, v1);
        }
      }
    }
  }
}

// Grid ceil(max_rows * P / kThreads), block kThreads: out[r, p] = act(sum over splits, in
// order, of the partials + bias) for the rows below num_rows.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    SplitKReduceKernel(const __grid_constant__ SplitKReduceParams p) {
  blocks::GridDependencyWait();     // the partials of the GEMM kernel before it (its dependent)
  blocks::GridDependencyTrigger();  // the probe-outcome count after it may be scheduled
  const ProbeScoreDeviceArgs a = *p.args;
  const int num_rows = min(a.num_rows, p.max_rows);
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int row = static_cast<int>(idx / p.num_probes);
  const int probe = static_cast<int>(idx % p.num_probes);
  if (row >= num_rows) return;
  const float* src = p.partial + static_cast<int64_t>(row) * p.partial_ld + probe;
  const int64_t split_stride = static_cast<int64_t>(p.partial_rows) * p.partial_ld;
  float sum = 0.0f;
  for (int s = 0; s < p.splits; ++s) sum += __ldcg(src + s * split_stride);
  a.out[static_cast<int64_t>(row) * a.out_row_stride + probe] =
      blocks::Activate(IsSigmoid(p.activation), sum + __ldg(p.bias + probe));
}

}  // namespace probesidecar::kernels::probe_score_detail
