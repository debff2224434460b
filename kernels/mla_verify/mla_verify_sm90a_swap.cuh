// MLA verify tile kernel for sm_90a, swap-AB schedule, for s_q * h_q <= 32 query rows: the keys
// take the wgmma M side and the query rows the N side, so a page costs N = 16 or 32 columns of
// tensor work instead of a 64-row tile padded with zero rows. Shares the page-pair kernel's TMA
// boxes, descriptors and cursor (mla_verify_sm90a*.cuh); compiled only for sm_90a
// (mla_verify_sm90a.cu). The plan takes it where it measured faster (mla::UseSwapAbSchedule).
//
// Per cache page (64 keys), with kN = s_q * h_q query rows (16 or 32; h_q is a multiple of 16):
//   S^T = K Q^T      36 wgmma m64 nkN k16, A = the page's nine 64 x 64 boxes as TMA stores them
//                    (K-major), B = Q (kN x 576, K-major, swizzled like the boxes)
//   softmax over the keys of each column (the M axis): a thread holds 2 keys of kN / 4 columns,
//                    a warp 16 keys; the column maxima go through shared memory (one named barrier
//                    of the warpgroup a page); P^T (kN x 64 bf16, K-major) into shared memory
//   O^T = V^T P^T    8 x 4 wgmma m64 nkN k16, A = V^T (the page's first eight boxes as stored,
//                    read MN-major: dv along M), B = P^T; O^T is 512 x kN float32, 4 kN registers a
//                    thread
// Block: one consumer warpgroup (128 threads) and one producer warp (its lane 0 issues every TMA
// load). Shared memory: two Q buffers (the next request's Q lands while this one's last page
// runs), P^T, and a ring of kRing 64 x 64 boxes (23 at kN = 16, 18 at kN = 32) that the
// producer fills in order, box by box, as the consumer frees them: with nine boxes under compute
// the rest (72-112 KB) is always in flight, where the two-buffer schedules have moments with
// nothing in flight. A box slot has a "full" barrier (TMA bytes) and an "empty" one (the
// consumer's four warps, once the page's O^T wgmma are done).
//
// Only units that hold keys load and compute anything; a request of length 0 is written as zeros
// with LSE -inf. Key rows past a sequence's end are masked in S^T (a select, so NaN there cannot
// leak) and zeroed in the boxes before O^T reads them as V (0 * NaN would).
#pragma once

#include "kernels/mla_verify/mla_verify_sm90a_page.cuh"

namespace probesidecar::kernels::mla::sm90a {

inline constexpr int kSwapThreads = 160;  // consumer warpgroup + producer warp
inline constexpr int kSwapMaxRows = 32;   // the largest kN
// The dynamic shared memory a block may have on sm_90 (227 KB), less the alignment pad.
inline constexpr int kSwapSmemBudget = 227 * 1024 - 1024;

template <int kN>
struct SwapShape {
  static_assert(kN == 16 || kN == 32, "N: s_q * h_q rounded to 16 or 32");
  static constexpr int kQSlabBytes = kN * 128;          // one 64-column slab of Q, kN rows
  static constexpr int kQBytes = kQSlabBytes * kSlabs;  // a request's Q (multiple of 1024)
  static constexpr int kPtBytes = kN * 128;             // P^T: kN rows of 64 keys
  static constexpr int kFixed = 2 * kQBytes + kPtBytes + (2 * 4 + 4) * kN * 4 + 4 * 8 + 64;
  static constexpr int kRing = (kSwapSmemBudget - kFixed) / (kSlabBytes + 16);
};

template <int kN>
struct SwapStorage {
  using Shape = SwapShape<kN>;
  uint8_t q[2][Shape::kQBytes];            // 1024-byte aligned; request k of the range in q[k % 2]
  uint8_t pt[Shape::kPtBytes];             // P^T of the page under compute
  uint8_t ring[Shape::kRing][kSlabBytes];  // box b of the range's pages in slot b % kRing
  float red_max[2][4][kN];                 // per warp column maxima, by page parity
  float red_sum[4][kN];                    // per warp column sums, at a request's end
  uint64_t full[Shape::kRing], empty[Shape::kRing];
  uint64_t q_full[2], q_empty[2];
};
template <int kN>
inline constexpr int kSwapSmemBytes = static_cast<int>(sizeof(SwapStorage<kN>)) + 1024;
static_assert(kSwapSmemBytes<16> <= 227 * 1024 && kSwapSmemBytes<32> <= 227 * 1024,
              "a swap-AB block fits the 227 KB of an sm_90 block");
static_assert(SwapShape<16>::kRing >= 2 * kSlabs && SwapShape<32>::kRing >= 2 * kSlabs,
              "a page under compute and at least one in flight");

// Named barriers of the consumer warpgroup (128 threads; after CUTLASS's reserved ids).
enum SwapBarrierId : uint32_t {
  kSwapMaxReady = 0,  // the page's per-warp column maxima are in red_max
  kSwapPReady = 1,    // P^T written (and key rows past the end zeroed) by all four warps
  kSwapSumReady = 2,  // the request's per-warp column sums are in red_sum
};
__device__ __forceinline__ void SyncConsumers(uint32_t id) {
  cutlass::arch::NamedBarrier::arrive_and_wait(128, id);
}

// The wgmma atoms: S^T (A = K, B = Q, both K-major) and O^T (A = V^T, MN-major; B = P^T).
template <int kN>
struct SwapMma;
template <>
struct SwapMma<16> {
  using St = cute::SM90::GMMA::MMA_64x16x16_F32BF16BF16_SS<GmmaMajor::K, GmmaMajor::K>;
  using Ot = cute::SM90::GMMA::MMA_64x16x16_F32BF16BF16_SS<GmmaMajor::MN, GmmaMajor::K>;
};
template <>
struct SwapMma<32> {
  using St = cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<GmmaMajor::K, GmmaMajor::K>;
  using Ot = cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<GmmaMajor::MN, GmmaMajor::K>;
};

// The swap-AB tensor map of q: a box is a request's kN rows (h_q heads x kN / h_q tokens) of 64
// columns, rows token-major as everywhere.
struct SwapArgs {
  CUtensorMap kv_map;  // as Sm90aArgs
  CUtensorMap q_map;   // [b, s_q, h_q, 576] bf16, box 64 columns x h_q heads x s_q tokens
  KernelArgs args;
  TraceArgs trace;
};

template <int kN, bool kOwnPlan>
__global__ void __launch_bounds__(kSwapThreads, 1)
    MlaVerifySwapSm90aKernel(const __grid_constant__ SwapArgs targs) {
  // Grid: (1, ranges); block: 160 threads; dynamic shared memory kSwapSmemBytes<kN>. Launched as
  // a programmatic dependent of the kernel before it (the plan kernel, or what wrote the lengths
  // where the block plans itself): nothing global is read before the wait below.
  using Shape = SwapShape<kN>;
  constexpr int kRing = Shape::kRing;
  constexpr int kCols = kN / 4;  // columns (query rows) a thread holds
  constexpr int kAcc = kN / 2;   // accumulator registers of one m64 nkN wgmma
  using Mma = SwapMma<kN>;
  const KernelArgs& args = targs.args;
  const MlaVerifyParams& p = args.p;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  SwapStorage<kN>& sm = *reinterpret_cast<SwapStorage<kN>*>(
      smem_raw + blocks::SwizzleAtomPadding(blocks::SmemAddr(smem_raw)));

  const int tid = threadIdx.x;
  const int warp = tid >> 5, lane = tid & 31, quad = lane & 3;
  TraceRecorder rec;
  rec.Begin(targs.trace, warp == 4 ? 1 : 0, tid == 0 || tid == 128);

  if (tid == 0) {
    for (int s = 0; s < kRing; ++s) {
      cutlass::arch::ClusterTransactionBarrier::init(&sm.full[s], 1);
      cutlass::arch::ClusterTransactionBarrier::init(&sm.empty[s], 4);
    }
    for (int b = 0; b < 2; ++b) {
      cutlass::arch::ClusterTransactionBarrier::init(&sm.q_full[b], 1);
      cutlass::arch::ClusterTransactionBarrier::init(&sm.q_empty[b], 4);
    }
    cutlass::arch::fence_barrier_init();
    PrefetchTensorMaps(targs);
  }
  __syncthreads();

  int32_t u0, u1;
  RequestCursor start;
  __shared__ BlockPlan own_plan;
  const int32_t* plan;
  if (!EnterPlannedRange<kOwnPlan>(args, rec, own_plan, &plan, &u0, &u1, &start)) return;
  const int32_t* cum = plan + kPlanCum;
  const int32_t per = plan[0];
  PageCursor c;
  c.Init(p, start, u0, u1);
  int32_t step = 0;

  // ---- Producer: lane 0 of warp 4 walks the same units as the consumer and loads, in order, each
  // request's Q (into q[k % 2] once the request two before has released it) and each page's nine
  // boxes (into the next ring slots, each once the consumer has freed it).
  if (warp == 4) {
    if (lane != 0) return;
    uint32_t box = 0, qi = 0;
    while (true) {
      if (c.Has0()) {
        if (c.First()) {
          const int b = qi & 1;
          if (qi >= 2) {
            rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
            cutlass::arch::ClusterTransactionBarrier::wait(&sm.q_empty[b], ((qi >> 1) - 1) & 1);
            rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
          }
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&sm.q_full[b],
                                                                         Shape::kQBytes);
          for (int slab = 0; slab < kSlabs; ++slab) {
            cute::SM90_TMA_LOAD_4D::copy(&targs.q_map, &sm.q_full[b], kEvictLast,
                                         sm.q[b] + slab * Shape::kQSlabBytes, slab * 64, 0, 0, c.r);
          }
          ++qi;
        }
        for (int slab = 0; slab < kSlabs; ++slab, ++box) {
          const uint32_t s = box % kRing, use = box / kRing;
          if (use > 0) {
            if constexpr (kTraceOn) {
              if (!cutlass::arch::ClusterTransactionBarrier::test_wait(&sm.empty[s], (use - 1) & 1,
                                                                       1)) {
                rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
                cutlass::arch::ClusterTransactionBarrier::wait(&sm.empty[s], (use - 1) & 1);
                rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
              }
            } else {
              cutlass::arch::ClusterTransactionBarrier::wait(&sm.empty[s], (use - 1) & 1);
            }
          }
          cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&sm.full[s], kSlabBytes);
          cute::SM90_TMA_LOAD_3D::copy(&targs.kv_map, &sm.full[s], kEvictFirst, sm.ring[s],
                                       slab * 64, 0, c.page[0]);
        }
        rec.Add(MlaTraceEvent::kIssueLoad, step);
      }
      c.Advance(p, cum, u1);
      if (!c.Valid(u1)) break;
      ++step;
    }
    rec.End(step);
    return;
  }

  // ---- Consumer warpgroup. This thread's accumulator elements (i < kN / 8, h, e < 2):
  // acc[i * 4 + h * 2 + e] = row (key, or dv within 64) 16 warp + lane / 4 + 8 h, column (query
  // row) 8 i + 2 quad + e; its columns are numbered i * 2 + e (< kCols).
  const uint32_t ring0 = blocks::SmemAddr(sm.ring[0]);
  const uint32_t q0 = blocks::SmemAddr(sm.q[0]);
  const uint32_t pt = blocks::SmemAddr(sm.pt);
  const int key_lo = 16 * warp + (lane >> 2);  // this thread's keys: key_lo, key_lo + 8
  auto col_of = [&](int k) { return 8 * (k >> 1) + 2 * quad + (k & 1); };

  float o[8][kAcc];  // O^T: dv block m (64 rows) x kN columns
#pragma unroll
  for (int m = 0; m < 8; ++m)
#pragma unroll
    for (int i = 0; i < kAcc; ++i) o[m][i] = 0.0f;
  float m_run[kCols], l_run[kCols];  // running max (log2 domain), this thread's share of the sum
#pragma unroll
  for (int k = 0; k < kCols; ++k) {
    m_run[k] = -INFINITY;
    l_run[k] = 0.0f;
  }
  uint32_t box = 0, qi = 0, parity = 0;
  while (true) {
    const bool has = c.Has0();
    rec.Add(MlaTraceEvent::kStep, step);
    if (has) {
      const int32_t len = c.len;
      const int32_t k_page = c.Key0();
      const int32_t valid = len - k_page;  // keys in the page
      if (c.First()) {
        rec.Add(MlaTraceEvent::kWaitQBegin, step);
        cutlass::arch::ClusterTransactionBarrier::wait(&sm.q_full[qi & 1], (qi >> 1) & 1);
        rec.Add(MlaTraceEvent::kWaitQEnd, step);
      }
      // Slot addresses made opaque once per page, so that the descriptors are built here.
      uint32_t q_addr = q0 + (qi & 1) * Shape::kQBytes, r_addr = ring0;
      asm volatile("" : "+r"(q_addr), "+r"(r_addr));
      auto slot_of = [&](int slab) { return (box + slab) % kRing; };

      // ---- S^T = K Q^T, each box's wgmma as soon as it lands.
      float st[kAcc];
      blocks::FenceOperands(st);
#pragma unroll
      for (int slab = 0; slab < kSlabs; ++slab) {
        const uint32_t s = slot_of(slab);
        WaitBox(&sm.full[s], ((box + slab) / kRing) & 1, rec, step);
        cute::warpgroup_arrive();
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          blocks::WgmmaSS<typename Mma::St>(DescK(r_addr + s * kSlabBytes, ks * 32),
                                            DescK(q_addr, slab * Shape::kQSlabBytes + ks * 32), st,
                                            slab == 0 && ks == 0 ? ScaleOut::Zero : ScaleOut::One);
        }
        cute::warpgroup_commit_batch();
      }
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
      blocks::FenceOperands(st);
      // The request's last page in this range: its Q is dead (the producer may load the one after
      // next into its buffer).
      if (c.Last() && lane == 0)
        cutlass::arch::ClusterTransactionBarrier::arrive(&sm.q_empty[qi & 1]);

      // ---- Mask (causal, and keys past the end) and the column maxima of this page.
      float mx[kCols];
      const bool masked = k_page + kMlaPageSize > len - p.s_q + 1;
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        const int i = k >> 1, e = k & 1;
        if (masked) {
          const int32_t j = col_of(k) / p.h_q;
          const int32_t border = min(len, len - p.s_q + 1 + j) - k_page;
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            float& x = st[i * 4 + h * 2 + e];
            x = key_lo + 8 * h < border ? x : -INFINITY;
          }
        }
        float v = fmaxf(st[i * 4 + e], st[i * 4 + 2 + e]);
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 4));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 8));
        v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 16));
        mx[k] = v;
      }
      if (lane < 4) {
#pragma unroll
        for (int k = 0; k < kCols; ++k) sm.red_max[parity][warp][col_of(k)] = mx[k];
      }
      SyncConsumers(kSwapMaxReady);
      // Every warp's S^T is done: key rows past the end are zeroed in the boxes V is read from
      // (slabs 0..7).
      if (valid < kMlaPageSize) {
        const int per_slab = (kMlaPageSize - valid) * 8;  // 16-byte chunks
        for (int ch = tid; ch < 8 * per_slab; ch += 128) {
          const int slab = ch / per_slab;
          *reinterpret_cast<uint4*>(sm.ring[slot_of(slab)] + valid * 128 +
                                    (ch - slab * per_slab) * 16) = make_uint4(0, 0, 0, 0);
        }
      }
      float sc[kCols];
      bool moved = false;
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        const int col = col_of(k);
        const float v = fmaxf(fmaxf(sm.red_max[parity][0][col], sm.red_max[parity][1][col]),
                              fmaxf(sm.red_max[parity][2][col], sm.red_max[parity][3][col]));
        const blocks::OnlineSoftmaxStep sstep =
            blocks::NextOnlineSoftmaxStep(m_run[k], v * args.scale_log2);
        sc[k] = sstep.rescale;
        moved |= sc[k] != 1.0f;
        m_run[k] = sstep.max;
        const int i = k >> 1, e = k & 1;
        float sum = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          float& x = st[i * 4 + h * 2 + e];
          x = exp2f(fmaf(x, args.scale_log2, -sstep.offset));
          sum += x;
          // P^T[col][key] (K-major, swizzled).
          const int key = key_lo + 8 * h;
          *reinterpret_cast<__nv_bfloat16*>(sm.pt + blocks::Swizzle128Offset(col, key >> 3) +
                                            (key & 7) * 2) = __float2bfloat16_rn(x);
        }
        l_run[k] = l_run[k] * sc[k] + sum;
      }
      parity ^= 1;
      blocks::FenceProxyAsyncShared();
      // O^T rescale (per column), skipped by a warp whose columns' maxima did not move.
      if (__any_sync(0xffffffffu, moved)) {
#pragma unroll
        for (int m = 0; m < 8; ++m)
#pragma unroll
          for (int i = 0; i < kAcc; ++i) o[m][i] *= sc[(i >> 2) * 2 + (i & 1)];
      }
      SyncConsumers(kSwapPReady);

      // ---- O^T += V^T P^T: dv block m from box m of the page.
#pragma unroll
      for (int m = 0; m < 8; ++m) blocks::FenceOperands(o[m]);
      cute::warpgroup_arrive();
#pragma unroll
      for (int m = 0; m < 8; ++m) {
        const uint32_t v_addr = r_addr + slot_of(m) * kSlabBytes;
#pragma unroll
        for (int ks = 0; ks < 4; ++ks) {
          blocks::WgmmaSS<typename Mma::Ot>(DescV(v_addr, ks * 16 * 128), DescK(pt, ks * 32),
                                            o[m]);
        }
      }
      cute::warpgroup_commit_batch();
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
#pragma unroll
      for (int m = 0; m < 8; ++m) blocks::FenceOperands(o[m]);
      // The page's boxes are free.
      if (lane == 0) {
#pragma unroll 1
        for (int slab = 0; slab < kSlabs; ++slab)
          cutlass::arch::ClusterTransactionBarrier::arrive(&sm.empty[slot_of(slab)]);
      }
      box += kSlabs;
    }

    // ---- The request's last unit in this range: column sums, then O (normalised) to out, or to
    // its partial slot when the request is split over ranges.
    if (c.Last()) {
      rec.Add(MlaTraceEvent::kEpilogueBegin, step);
      float inv[kCols], lse2[kCols];
      if (has) {
#pragma unroll
        for (int k = 0; k < kCols; ++k) {
          float v = l_run[k];
          v += __shfl_xor_sync(0xffffffffu, v, 4);
          v += __shfl_xor_sync(0xffffffffu, v, 8);
          v += __shfl_xor_sync(0xffffffffu, v, 16);
          if (lane < 4) sm.red_sum[warp][col_of(k)] = v;
        }
        SyncConsumers(kSwapSumReady);
#pragma unroll
        for (int k = 0; k < kCols; ++k) {
          const int col = col_of(k);
          const float l =
              (sm.red_sum[0][col] + sm.red_sum[1][col]) + (sm.red_sum[2][col] + sm.red_sum[3][col]);
          inv[k] = l > 0.0f ? 1.0f / l : 0.0f;
          lse2[k] = l > 0.0f ? m_run[k] + __log2f(l) : -INFINITY;
        }
        ++qi;
      } else {  // a request of length 0
#pragma unroll
        for (int k = 0; k < kCols; ++k) {
          inv[k] = 0.0f;
          lse2[k] = -INFINITY;
        }
      }
      const int32_t r = c.r;
      int64_t slot = 0;
      const bool direct =
          !PartialSlot(args, plan, per, r, cum[r], cum[r + 1], blockIdx.y, &slot);
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        const int g = col_of(k);  // < kN = s_q * h_q
        const int32_t j = g / p.h_q, head = g - j * p.h_q;
        const int i = k >> 1, e = k & 1;
        if (direct) {
          __nv_bfloat16* dst =
              p.out + r * p.out_batch_stride + j * p.out_token_stride + head * p.out_head_stride;
#pragma unroll
          for (int m = 0; m < 8; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              dst[m * 64 + key_lo + 8 * h] = __float2bfloat16_rn(o[m][i * 4 + h * 2 + e] * inv[k]);
          if (p.lse != nullptr && warp == 0 && lane < 4) {
            p.lse[r * p.lse_batch_stride + head * p.lse_head_stride + j] =
                lse2[k] == -INFINITY ? -INFINITY : lse2[k] * blocks::kLn2;
          }
        } else {
          float* dst = args.partial_out + (slot * kN + g) * kMlaHeadDimV;
#pragma unroll
          for (int m = 0; m < 8; ++m)
#pragma unroll
            for (int h = 0; h < 2; ++h)
              dst[m * 64 + key_lo + 8 * h] = o[m][i * 4 + h * 2 + e] * inv[k];
          if (warp == 0 && lane < 4) args.partial_lse[slot * kN + g] = lse2[k];
        }
      }
#pragma unroll
      for (int m = 0; m < 8; ++m)
#pragma unroll
        for (int i = 0; i < kAcc; ++i) o[m][i] = 0.0f;
#pragma unroll
      for (int k = 0; k < kCols; ++k) {
        m_run[k] = -INFINITY;
        l_run[k] = 0.0f;
      }
      rec.Add(MlaTraceEvent::kEpilogueEnd, step);
    }
    c.Advance(p, cum, u1);
    if (!c.Valid(u1)) break;
    ++step;
  }
  rec.End(step);
}

}  // namespace probesidecar::kernels::mla::sm90a
