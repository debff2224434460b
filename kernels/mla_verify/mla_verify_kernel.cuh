// MLA verify attention kernels: the device plan, the tile kernel (split-KV and baseline modes)
// and the combine. Portable path: mma.sync m16n8k16 (bf16 in, float32 accumulate), ldmatrix and
// cp.async; runs on sm_80 and later (the tile and ring depth chosen per device, kTiles).
//
// Tile kernel, per thread block: one row tile of one request range. A row tile holds M = 16, 32
// or 64 query rows (token-major: row = j * h_q + h) so that, for s_q * h_q <= 64, all rows of a
// request share every key read: each page comes from HBM once. Beyond 64 rows (h_q = 128, or
// h_q = 64 with s_q > 1, which are compute-bound anyway) the rows are cut into 64-row tiles;
// the tiles of one range are adjacent in the grid (blockIdx.x) so they run at the same time and
// all but the first read a page from L2.
//
// Warps: 4 per 16-row group ("row group" rg = warp / 4, "column group" cg = warp % 4). Per stage
// of 32 keys (half a page):
//   S = Q K^T : warp (rg, cg) computes rows rg*16..+16 x keys cg*8..+8 over the full 576 depth,
//               scales it to the log2 domain, masks it, and leaves it in shared memory;
//   softmax   : every warp of a row group reads its 16 rows x 32 scores back (identical work in
//               the 4 warps, so identical running max / sum without another exchange);
//   O += P V  : warp (rg, cg) owns O[rows rg*16..+16, columns cg*128..+128] in registers
//               (64 float32 per thread) and multiplies its bf16 P by V from shared memory.
// Keys stream through a cp.async ring of kStages stages; rows past a sequence's end are zero
// filled (never read), so NaN in unused cache rows cannot leak in through 0 * NaN.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/blocks/cp_async.cuh"
#include "kernels/blocks/online_softmax.cuh"
#include "kernels/blocks/warp_mma.cuh"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_common.cuh"
#include "kernels/mla_verify/mla_verify_plan.h"

namespace probesidecar::kernels::mla {

// One instantiation of kTiles (mla_verify_plan.h): 16 * kRowGroups rows, kStages key stages.
template <int kRowGroups, int kStages_>
struct TileConfig {
  static constexpr int kM = 16 * kRowGroups;
  static constexpr int kWarps = 4 * kRowGroups;
  static constexpr int kThreads = 32 * kWarps;
  static constexpr int kStages = kStages_;
  // Two 16-row blocks per SM where the SM's shared memory holds them (the planner counts them).
  static constexpr int kBlocksPerSm = BlocksPerSmFor(kM);
  static constexpr int kQBytes = kM * kSmemStride * 2;
  static constexpr int kStageBytes = kBlockN * kSmemStride * 2;
  static constexpr int kSBytes = kM * kSStride * 4;
  static constexpr int kSmemBytes = kQBytes + kStages * kStageBytes + kSBytes;
  static_assert(kSmemBytes == TileSmemBytes(kM, kStages), "the planner sizes tiles alike");
  static_assert(kThreads == TileThreads(kM), "the planner counts threads alike");
};

// ---------------------------------------------------------------------------------------------
// Plan kernel. Grid: 1 block; block: 1024 threads. Exclusive prefix of the requests' units,
// units per range, a partial slot base for every split request (prefix of their splits) and
// the list of split requests.

__device__ __forceinline__ int32_t BlockExclusiveScan(int32_t v, int32_t* warp_sums,
                                                      int32_t* total) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  int32_t x = v;
#pragma unroll
  for (int d = 1; d < 32; d <<= 1) {
    const int32_t y = __shfl_up_sync(0xffffffffu, x, d);
    if (lane >= d) x += y;
  }
  if (lane == 31) warp_sums[warp] = x;
  __syncthreads();
  if (warp == 0) {
    int32_t w = lane < static_cast<int>(blockDim.x >> 5) ? warp_sums[lane] : 0;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, w, d);
      if (lane >= d) w += y;
    }
    warp_sums[lane] = w;  // inclusive
  }
  __syncthreads();
  const int32_t before = (warp > 0 ? warp_sums[warp - 1] : 0) + x - v;
  *total = warp_sums[(blockDim.x >> 5) - 1];
  __syncthreads();
  return before;
}

__global__ void __launch_bounds__(1024) MlaVerifyPlanKernel(const int32_t* __restrict__ seqlens,
                                                            int32_t batch, int32_t num_parts,
                                                            int32_t* __restrict__ plan) {
  __shared__ int32_t warp_sums[32];
  // The sm_90a tile kernel after this one is a programmatic dependent: it may be scheduled now
  // (it waits for this grid before reading the plan).
  blocks::GridDependencyTrigger();
  int32_t* cum = plan + kPlanCum;
  int32_t* slot_base = cum + batch + 1;
  int32_t* split_list = slot_base + batch;
  int32_t carry = 0;
  for (int32_t base = 0; base < batch; base += blockDim.x) {
    const int32_t i = base + threadIdx.x;
    const int32_t units = i < batch ? UnitsOf(seqlens[i]) : 0;
    int32_t chunk_total;
    const int32_t before = BlockExclusiveScan(units, warp_sums, &chunk_total);
    if (i < batch) cum[i] = carry + before;
    carry += chunk_total;
  }
  if (threadIdx.x == 0) cum[batch] = carry;
  const int32_t per = UnitsPerPart(carry, num_parts);
  __syncthreads();  // cum[] complete before the second pass reads neighbours
  int32_t slots = 0, listed = 0;
  for (int32_t base = 0; base < batch; base += blockDim.x) {
    const int32_t i = base + threadIdx.x;
    int32_t splits = 0;
    if (i < batch) {
      splits = NumSplits(cum[i], cum[i + 1], per);
      if (splits < 2) splits = 0;
    }
    int32_t chunk_total, chunk_listed;
    const int32_t before = BlockExclusiveScan(splits, warp_sums, &chunk_total);
    const int32_t index = BlockExclusiveScan(splits > 0 ? 1 : 0, warp_sums, &chunk_listed);
    if (i < batch) {
      slot_base[i] = splits > 0 ? slots + before : -1;
      if (splits > 0) split_list[listed + index] = i;
    }
    slots += chunk_total;
    listed += chunk_listed;
  }
  if (threadIdx.x == 0) {
    plan[0] = per;
    plan[1] = carry;
    plan[2] = num_parts;
    plan[3] = batch;
    plan[4] = listed;
  }
}

// ---------------------------------------------------------------------------------------------
// Tile kernel.

template <int kRowGroups, int kStages_, bool kSplit>
__global__ void __launch_bounds__(TileConfig<kRowGroups, kStages_>::kThreads,
                                  TileConfig<kRowGroups, kStages_>::kBlocksPerSm)
    MlaVerifyTileKernel(const __grid_constant__ KernelArgs args) {
  // Grid: (row tiles, ranges) in split mode, (row tiles, batch) in baseline mode.
  // Block: 128 * kRowGroups threads (4 warps per 16 query rows); dynamic shared memory
  // TileConfig::kSmemBytes (Q tile, kStages key stages, score exchange).
  using Cfg = TileConfig<kRowGroups, kStages_>;
  constexpr int kM = Cfg::kM, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  const MlaVerifyParams& p = args.p;
  extern __shared__ __align__(16) uint8_t smem[];
  __nv_bfloat16* s_q = reinterpret_cast<__nv_bfloat16*>(smem);
  __nv_bfloat16* s_kv = reinterpret_cast<__nv_bfloat16*>(smem + Cfg::kQBytes);
  float* s_s = reinterpret_cast<float*>(smem + Cfg::kQBytes + kStages * Cfg::kStageBytes);

  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int rg = warp >> 2, cg = warp & 3;
  const int tile = blockIdx.x;
  const int32_t rows = p.s_q * p.h_q;

  // This block's range of units and the request it starts in.
  int32_t u0, u1;
  RequestCursor load_cur, comp_cur;
  if constexpr (kSplit) {
    if (!SplitRange(args, args.plan, blockIdx.y, &u0, &u1, &load_cur)) return;
  } else {
    const int32_t r = blockIdx.y;
    u0 = 0;
    u1 = UnitsOf(p.cache_seqlens[r]);
    load_cur = {nullptr, r, 0, u1, 0, nullptr};
    load_cur.Load(p);
  }
  comp_cur = load_cur;
  const int32_t num_blocks = 2 * (u1 - u0);  // two 32-key stages per page unit

  // Issues the cp.async copies of stage block i (keys of one half page) into ring slot `slot`.
  auto load_block = [&](int32_t i, int slot) {
    const int32_t u = u0 + (i >> 1);
    load_cur.Advance(p, u);
    const int32_t page_in_req = u - load_cur.begin;
    const int32_t k0 = page_in_req * kMlaPageSize + (i & 1) * kBlockN;
    const int32_t valid = min(kBlockN, max(0, load_cur.len - k0));
    const __nv_bfloat16* src = p.kv_cache;
    if (valid > 0) {
      src += static_cast<int64_t>(load_cur.table[page_in_req]) * p.kv_page_stride +
             static_cast<int64_t>((i & 1) * kBlockN) * p.kv_row_stride;
    }
    const uint32_t dst = blocks::SmemAddr(s_kv + slot * kBlockN * kSmemStride);
#pragma unroll 4
    for (int c = tid; c < kBlockN * kChunksPerRow; c += kThreads) {
      const int row = c / kChunksPerRow, chunk = c - row * kChunksPerRow;
      const bool ok = row < valid;
      const __nv_bfloat16* g = ok ? src + row * p.kv_row_stride + chunk * 8 : p.kv_cache;
      blocks::CpAsync16(dst + (row * kSmemStride + chunk * 8) * 2, g, ok);
    }
  };
  auto load_q = [&](int32_t r) {
    const uint32_t dst = blocks::SmemAddr(s_q);
    for (int c = tid; c < kM * kChunksPerRow; c += kThreads) {
      const int row = c / kChunksPerRow, chunk = c - row * kChunksPerRow;
      const int32_t g = tile * kM + row;
      const bool ok = g < rows;
      const __nv_bfloat16* src = p.q;
      if (ok) {
        const int32_t j = g / p.h_q, h = g - j * p.h_q;
        src += r * p.q_batch_stride + j * p.q_token_stride + h * p.q_head_stride + chunk * 8;
      }
      blocks::CpAsync16(dst + (row * kSmemStride + chunk * 8) * 2, src, ok);
    }
  };

  // Per-thread state: O fragment (rows lane/4 and lane/4 + 8 of the row group, 16 n-tiles of 8
  // columns starting at cg * 128), running max (log2 domain) and sum of the two rows.
  float o[16][4];
  float m_run[2], l_run[2];
  auto reset_state = [&]() {
#pragma unroll
    for (int n = 0; n < 16; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
  };
  reset_state();

  const int row_in_tile0 = rg * 16 + (lane >> 2);  // and + 8
  const int quad = lane & 3;

  // Writes the finished request's rows: straight to out/lse, or as a partial.
  auto finalize = [&](const RequestCursor& cur) {
    int64_t slot = 0;
    bool direct = true;
    if constexpr (kSplit) {
      direct = !PartialSlot(args, args.plan, args.plan[0], cur.r, cur.begin, cur.end, blockIdx.y,
                            &slot);
    }
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t g = tile * kM + row_in_tile0 + half * 8;
      if (g >= rows) continue;
      const float l = l_run[half];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const float lse2 = l > 0.0f ? m_run[half] + __log2f(l) : -INFINITY;
      const int32_t j = g / p.h_q, h = g - j * p.h_q;
      if (direct) {
        __nv_bfloat16* dst = p.out + cur.r * p.out_batch_stride + j * p.out_token_stride +
                             h * p.out_head_stride + cg * 128 + quad * 2;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) =
              __floats2bfloat162_rn(o[n][half * 2] * inv, o[n][half * 2 + 1] * inv);
        }
        if (p.lse != nullptr && cg == 0 && quad == 0) {
          p.lse[cur.r * p.lse_batch_stride + h * p.lse_head_stride + j] =
              l > 0.0f ? lse2 * blocks::kLn2 : -INFINITY;
        }
      } else {
        float* dst = args.partial_out + (slot * rows + g) * kMlaHeadDimV + cg * 128 + quad * 2;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) =
              make_float2(o[n][half * 2] * inv, o[n][half * 2 + 1] * inv);
        }
        if (cg == 0 && quad == 0) args.partial_lse[slot * rows + g] = lse2;
      }
    }
  };

  // Shared-memory addresses of this lane's ldmatrix rows.
  // A (Q, 16 x 16 per k-step): rows rg*16 + lane%16, columns (lane/16)*8.
  const uint32_t q_addr =
      blocks::SmemAddr(s_q + (rg * 16 + (lane & 15)) * kSmemStride + (lane >> 4) * 8);
  // B for S (K rows are keys): keys cg*8 + lane%8, depth (lane/8)*8: 4 matrices = 2 k-steps.
  const uint32_t k_off = ((cg * 8 + (lane & 7)) * kSmemStride + (lane >> 3) * 8) * 2;
  // B for P·V (transposed): keys (lane%8) + 8*((lane/8)%2), columns cg*128 + (lane/16)*8.
  const uint32_t v_off =
      (((lane & 7) + ((lane >> 3) & 1) * 8) * kSmemStride + cg * 128 + (lane >> 4) * 8) * 2;
  const uint32_t kv_base = blocks::SmemAddr(s_kv);

  // Prologue: the first kStages - 1 stages. One commit group per stage, empty ones included,
  // so that the wait counts below hold to the end.
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < num_blocks) load_block(i, i);
    blocks::CpAsyncCommit();
  }

  int32_t q_request = -1;
  for (int32_t i = 0; i < num_blocks; ++i) {
    blocks::CpAsyncWait<kStages - 2>();
    __syncthreads();  // stage i visible to all; everyone is done with stage i-1 and with s_s
    const int32_t u = u0 + (i >> 1);
    comp_cur.Advance(p, u);
    if (comp_cur.r != q_request) {
      // A new request: its Q tile (everyone finished the old one at the barrier above). This
      // drains the ring once per request boundary of the range.
      load_q(comp_cur.r);
      blocks::CpAsyncCommit();
      blocks::CpAsyncWait<0>();
      __syncthreads();
      q_request = comp_cur.r;
    }
    if (i + kStages - 1 < num_blocks) load_block(i + kStages - 1, (i + kStages - 1) % kStages);
    blocks::CpAsyncCommit();

    const int slot = i % kStages;
    const int32_t k_block = (u - comp_cur.begin) * kMlaPageSize + (i & 1) * kBlockN;
    const int32_t len = comp_cur.len;
    if (k_block < len) {  // a stage wholly past the end (second half of a last page) adds nothing
      // ---- S = Q K^T for rows rg*16..+16, keys cg*8..+8.
      float acc0[4] = {0.f, 0.f, 0.f, 0.f}, acc1[4] = {0.f, 0.f, 0.f, 0.f};
      const uint32_t k_addr = kv_base + slot * (kBlockN * kSmemStride * 2) + k_off;
#pragma unroll 6
      for (int kk = 0; kk < kMlaHeadDimQk / 32; ++kk) {
        uint32_t b[4], a[4], a2[4];
        blocks::LdMatrixX4(k_addr + kk * 64, b);
        blocks::LdMatrixX4(q_addr + kk * 64, a);
        blocks::LdMatrixX4(q_addr + kk * 64 + 32, a2);
        blocks::Mma16816<__nv_bfloat16>(acc0, a, b[0], b[1]);
        blocks::Mma16816<__nv_bfloat16>(acc1, a2, b[2], b[3]);
      }
      // Scale to log2 units and mask: key k is seen by query j iff k < len and
      // k <= len - s_q + j.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int32_t g = tile * kM + row_in_tile0 + half * 8;
        const int32_t j = g / p.h_q;
        const int32_t last_key = min(len - 1, len - p.s_q + j);
        const int32_t key = k_block + cg * 8 + quad * 2;
        float2 v;
        v.x = key <= last_key ? (acc0[half * 2] + acc1[half * 2]) * args.scale_log2 : -INFINITY;
        v.y = key + 1 <= last_key ? (acc0[half * 2 + 1] + acc1[half * 2 + 1]) * args.scale_log2
                                  : -INFINITY;
        *reinterpret_cast<float2*>(s_s + (row_in_tile0 + half * 8) * kSStride + cg * 8 +
                                   quad * 2) = v;
      }
      RowGroupBarrier(rg);

      // ---- Online softmax on the row group's 16 x 32 scores. This thread's A-fragment
      // columns for P: k-step ks, columns ks*16 + quad*2 + {0,1} and + 8.
      uint32_t pa[2][4];
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float* srow = s_s + (row_in_tile0 + half * 8) * kSStride + quad * 2;
        float2 sv[4];
#pragma unroll
        for (int c = 0; c < 4; ++c) sv[c] = *reinterpret_cast<const float2*>(srow + c * 8);
        float mx = fmaxf(fmaxf(fmaxf(sv[0].x, sv[0].y), fmaxf(sv[1].x, sv[1].y)),
                         fmaxf(fmaxf(sv[2].x, sv[2].y), fmaxf(sv[3].x, sv[3].y)));
        mx = QuadMax(mx);
        const blocks::OnlineSoftmaxStep step = blocks::NextOnlineSoftmaxStep(m_run[half], mx);
        const float m_use = step.offset, alpha = step.rescale;
        m_run[half] = step.max;
        float pv[8];
        float rs = 0.0f;
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          pv[2 * c] = exp2f(sv[c].x - m_use);
          pv[2 * c + 1] = exp2f(sv[c].y - m_use);
          rs += pv[2 * c] + pv[2 * c + 1];
        }
        rs = QuadSum(rs);
        l_run[half] = l_run[half] * alpha + rs;
#pragma unroll
        for (int n = 0; n < 16; ++n) {
          o[n][half * 2] *= alpha;
          o[n][half * 2 + 1] *= alpha;
        }
        // columns c*8 + quad*2: c = 0 -> k-step 0 low, 1 -> k-step 0 high, 2 / 3 -> k-step 1
        pa[0][half] = PackBf16(pv[0], pv[1]);
        pa[0][half + 2] = PackBf16(pv[2], pv[3]);
        pa[1][half] = PackBf16(pv[4], pv[5]);
        pa[1][half + 2] = PackBf16(pv[6], pv[7]);
      }

      // ---- O += P V for this warp's 128 columns.
      const uint32_t v_addr = kv_base + slot * (kBlockN * kSmemStride * 2) + v_off;
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
#pragma unroll
        for (int n2 = 0; n2 < 8; ++n2) {
          uint32_t b[4];
          blocks::LdMatrixX4Trans(v_addr + (ks * 16 * kSmemStride + n2 * 16) * 2, b);
          blocks::Mma16816<__nv_bfloat16>(o[2 * n2], pa[ks], b[0], b[1]);
          blocks::Mma16816<__nv_bfloat16>(o[2 * n2 + 1], pa[ks], b[2], b[3]);
        }
      }
    }

    // Last stage of this request in the range: write it out and start afresh.
    const bool last = i + 1 == num_blocks || u0 + ((i + 1) >> 1) >= comp_cur.end;
    if (last) {
      finalize(comp_cur);
      reset_state();
    }
  }
  blocks::CpAsyncWait<0>();
}

// ---------------------------------------------------------------------------------------------
// Combine kernel. Grid: (rows * 4, up to 16); block: 256 threads. Block (x, y) merges 128
// output columns (x % 4) of query row x / 4 for split requests y, y + gridDim.y, ... of the
// plan's list: out = sum_s w_s O_s / sum_s w_s with w_s = 2^(lse_s - max_s lse_s). The 8 warps
// take the splits round-robin (a lane holds 4 columns), 8 splits in flight per warp, then add up
// their sums in shared memory: a request split over every SM (batch 1) merges in a few
// microseconds, and a step with no split request costs one small launch, which overlaps the
// tile kernel's tail (programmatic dependent launch).
__global__ void __launch_bounds__(256) MlaVerifyCombineKernel(const __grid_constant__ KernelArgs args) {
  // Launched as a programmatic dependent of the tile kernel: nothing it wrote is read before this.
  blocks::GridDependencyWait();
  const MlaVerifyParams& p = args.p;
  const int32_t* plan = args.plan;
  const int32_t* cum = plan + kPlanCum;
  const int32_t rows = p.s_q * p.h_q;
  const int32_t g = blockIdx.x >> 2;
  const int col0 = (blockIdx.x & 3) * 128;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float red[8];
  __shared__ float4 acc_sm[8][32];
  __shared__ float wsum_sm[8];
  const int32_t listed = plan[4];
  for (int32_t idx = blockIdx.y; idx < listed; idx += gridDim.y) {
    const int32_t r = plan[kPlanCum + 2 * p.batch + 1 + idx];
    const int32_t splits = NumSplits(cum[r], cum[r + 1], plan[0]);
    const int64_t slot0 = plan[kPlanCum + p.batch + 1 + r];
    // Max LSE over the splits.
    float mx = -INFINITY;
    for (int s = threadIdx.x; s < splits; s += 256) {
      mx = fmaxf(mx, args.partial_lse[(slot0 + s) * rows + g]);
    }
    for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
    if (lane == 0) red[warp] = mx;
    __syncthreads();
    mx = red[0];
#pragma unroll
    for (int w = 1; w < 8; ++w) mx = fmaxf(mx, red[w]);
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    float wsum = 0.0f;
    if (mx != -INFINITY) {
      for (int s0 = warp; s0 < splits; s0 += 64) {
        float w[8];
        float4 v[8];
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          const int s = s0 + u * 8;
          if (s < splits) {
            const int64_t row = (slot0 + s) * rows + g;
            w[u] = exp2f(args.partial_lse[row] - mx);
            v[u] = *reinterpret_cast<const float4*>(args.partial_out + row * kMlaHeadDimV + col0 +
                                                    lane * 4);
          } else {
            w[u] = 0.0f;
            v[u] = make_float4(0.f, 0.f, 0.f, 0.f);
          }
        }
#pragma unroll
        for (int u = 0; u < 8; ++u) {
          wsum += w[u];
          acc.x += w[u] * v[u].x;
          acc.y += w[u] * v[u].y;
          acc.z += w[u] * v[u].z;
          acc.w += w[u] * v[u].w;
        }
      }
    }
    acc_sm[warp][lane] = acc;
    if (lane == 0) wsum_sm[warp] = wsum;
    __syncthreads();
    if (warp == 0) {
      float4 total = acc_sm[0][lane];
      float wtot = wsum_sm[0];
#pragma unroll
      for (int w = 1; w < 8; ++w) {
        const float4 a = acc_sm[w][lane];
        total.x += a.x;
        total.y += a.y;
        total.z += a.z;
        total.w += a.w;
        wtot += wsum_sm[w];
      }
      const float inv = wtot > 0.0f ? 1.0f / wtot : 0.0f;
      const int32_t j = g / p.h_q, h = g - j * p.h_q;
      StoreBf16x4(p.out + r * p.out_batch_stride + j * p.out_token_stride + h * p.out_head_stride +
                      col0 + lane * 4,
                  total, inv);
      if (p.lse != nullptr && col0 == 0 && lane == 0) {
        p.lse[r * p.lse_batch_stride + h * p.lse_head_stride + j] =
            wtot > 0.0f ? (mx + __log2f(wtot)) * blocks::kLn2 : -INFINITY;
      }
    }
    __syncthreads();  // red / acc_sm are reused by the next request
  }
}

// Combine kernel for plans whose requests split into a few parts each (batch comparable to the
// number of ranges). Grid: (ceil(rows / 8), MaxSplitRequests); block: 256 threads. Warp w of
// block (x, y) merges query row 8 x + w of split request y of the plan's list over all its splits
// and all 512 columns (a lane holds 16: four float4 at 128-column strides, so each load of a
// split's row is one coalesced 2 KB read), up to four splits in flight.
__global__ void __launch_bounds__(256) MlaVerifyCombineRowsKernel(const __grid_constant__ KernelArgs args) {
  // Launched as a programmatic dependent of the tile kernel: nothing it wrote is read before this.
  blocks::GridDependencyWait();
  const MlaVerifyParams& p = args.p;
  const int32_t* plan = args.plan;
  const int32_t* cum = plan + kPlanCum;
  const int32_t rows = p.s_q * p.h_q;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int32_t g = blockIdx.x * 8 + warp;
  const int32_t idx = blockIdx.y;
  if (g >= rows || idx >= plan[4]) return;
  const int32_t r = plan[kPlanCum + 2 * p.batch + 1 + idx];
  const int32_t splits = NumSplits(cum[r], cum[r + 1], plan[0]);
  const int64_t slot0 = plan[kPlanCum + p.batch + 1 + r];
  float mx = -INFINITY;
  for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, args.partial_lse[(slot0 + s) * rows + g]);
  for (int d = 16; d > 0; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
  float4 acc[4];
#pragma unroll
  for (int c = 0; c < 4; ++c) acc[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  float wsum = 0.0f;
  if (mx != -INFINITY) {
#pragma unroll 4
    for (int s = 0; s < splits; ++s) {
      const int64_t row = (slot0 + s) * rows + g;
      const float w = exp2f(args.partial_lse[row] - mx);
      const float4* src = reinterpret_cast<const float4*>(args.partial_out + row * kMlaHeadDimV);
      wsum += w;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const float4 v = src[c * 32 + lane];
        acc[c].x += w * v.x;
        acc[c].y += w * v.y;
        acc[c].z += w * v.z;
        acc[c].w += w * v.w;
      }
    }
  }
  const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
  const int32_t j = g / p.h_q, h = g - j * p.h_q;
  __nv_bfloat16* dst =
      p.out + r * p.out_batch_stride + j * p.out_token_stride + h * p.out_head_stride;
#pragma unroll
  for (int c = 0; c < 4; ++c) StoreBf16x4(dst + (c * 32 + lane) * 4, acc[c], inv);
  if (p.lse != nullptr && lane == 0) {
    p.lse[r * p.lse_batch_stride + h * p.lse_head_stride + j] =
        wsum > 0.0f ? (mx + __log2f(wsum)) * blocks::kLn2 : -INFINITY;
  }
}

}  // namespace probesidecar::kernels::mla
