// MLA verify tile kernel for sm_90a, one-page schedule: both warpgroups on one cache page at a time
// while the other page buffer refills (the plan takes it where a row tile's scores are cheap next
// to its page loads, mla::UseOnePageSchedule). Shares the page-pair kernel's layouts, TMA boxes and
// wgmma helpers (mla_verify_sm90a.cuh); compiled only for sm_90a (mla_verify_sm90a.cu).
//
// Grid: (64-row query tiles, ranges of the flattened batch); one block per SM. Block: 2
// warpgroups (256 threads) on one 64-row tile. Dynamic shared memory kPageSmemBytes: the Q tile
// and two page buffers of 64 x 576 bf16; page i of a block's range lives in buffer i % 2.
//
// Per page (FlashInfer's Hopper MLA order, with TMA and a barrier per box):
//   wg1: S = Q K^T (36 wgmma m64n64k16; each box's wgmma start as soon as it lands); mask; online
//        softmax against its running max -> the rows' O rescale and P (bf16); P into the page's
//        slab 8 (its rope keys are dead once S is done) and the rescale into shared memory; then
//        O_R = O_R rescale + P V_R with P from registers. Once that is done, boxes 4..7 of the
//        buffer are dead: it issues them for page i + 2.
//   wg0: waits for wg1's P; O_L = O_L rescale + P V_L with P from shared memory. Once done,
//        boxes 0..3 and 8 are dead: it issues them for page i + 2.
// So while one page is under compute the other buffer's page is in flight, and the dead half of
// the computed page starts refilling as soon as the first P V half is done. wg0's P V of page i
// overlaps wg1's scores of page i + 1. With kScoresUnderPv, wg1 issues the scores of page i + 1
// right behind its P V of page i instead of waiting for that P V first (the tensor cores go from
// one to the other without a drain; the boxes 4..7 are reissued once the first score slab's group
// is behind it). wg1 alone holds the running max and row sums; at a request's last page it hands
// 1 / row sum to wg0 and each writes its half of O.
#pragma once

#include "kernels/mla_verify/mla_verify_sm90a.cuh"

namespace probesidecar::kernels::mla::sm90a {

struct PageStorage {
  uint8_t q[kTileBytes];     // 1024-byte aligned (the swizzle's period)
  uint8_t k[2][kTileBytes];  // page i in k[i % 2]
  float scale[2][kM];        // wg1 -> wg0: the O rescale of page i, in scale[i % 2]
  float inv_sum[2][kM];      // wg1 -> wg0: 1 / row sum of a finished request, by its parity
  uint64_t bar_k[2][kSlabs];
  uint64_t bar_q;
};
inline constexpr int kPageSmemBytes = static_cast<int>(sizeof(PageStorage)) + 1024;

// Named barriers of this kernel (wg1 arrives, wg0 waits). Ids 3 and 4 are kWarpgroup0 / 1, which
// ZeroRowsPastEnd uses.
enum PageBarrierId : uint32_t {
  kPReady0 = 0,  // P of an even page in its slab 8, its O rescale in scale[0]
  kPReady1 = 1,  // the same for odd pages
  kRequestDone = 2,  // a request's last page: 1 / row sums in inv_sum (both warpgroups wait)
};
static_assert(static_cast<uint32_t>(kRequestDone) < static_cast<uint32_t>(kWarpgroup0),
              "the warpgroup barriers keep their own ids");

using PageCursor = StepCursor<1>;

template <bool kScoresUnderPv>
__global__ void __launch_bounds__(kThreads, 1)
    MlaVerifyPageSm90aKernel(const __grid_constant__ Sm90aArgs targs) {
  // Grid: (64-row tiles, ranges); block: 256 threads (2 warpgroups); dynamic shared memory
  // kPageSmemBytes. Launched as a programmatic dependent of the plan kernel: nothing global is
  // read before the wait below.
  const KernelArgs& args = targs.args;
  const MlaVerifyParams& p = args.p;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  PageStorage& sm = *reinterpret_cast<PageStorage*>(
      smem_raw + blocks::SwizzleAtomPadding(blocks::SmemAddr(smem_raw)));
  const uint32_t sq = blocks::SmemAddr(sm.q);
  const uint32_t sk0 = blocks::SmemAddr(sm.k[0]);  // buffer b at sk0 + b * kTileBytes

  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // 0: O[:, 0:256]; 1: scores, softmax and O[:, 256:512]
  const int t = tid & 127;
  const int lane = tid & 31, quad = lane & 3;
  const int row0 = ((t >> 5) << 4) + (lane >> 2);  // this thread's rows: row0, row0 + 8
  const int tile = blockIdx.x;
  const int32_t rows = p.s_q * p.h_q;
  TraceRecorder rec;
  rec.Begin(targs.trace, wg, t == 0);
  int32_t step = 0;  // pages done (the trace's step)

  if (tid == 0) {
    for (int b = 0; b < 2; ++b)
      for (int s = 0; s < kSlabs; ++s)
        cutlass::arch::ClusterTransactionBarrier::init(&sm.bar_k[b][s], 1);
    cutlass::arch::ClusterTransactionBarrier::init(&sm.bar_q, 1);
    cutlass::arch::fence_barrier_init();
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&targs.kv_map));
    cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&targs.q_map));
  }
  __syncthreads();
  blocks::GridDependencyWait();     // the plan is written
  blocks::GridDependencyTrigger();  // the combine may be scheduled (it waits too)
  rec.Add(MlaTraceEvent::kGridWaitEnd, 0);

  int32_t u0, u1;
  RequestCursor start;
  if (!SplitRange(args, blockIdx.y, &u0, &u1, &start)) return;
  const int32_t* cum = args.plan + kPlanCum;
  const int32_t per = args.plan[0];
  // The page being computed (c0), the next one (in flight) and the one after (loaded into c0's
  // buffer as its boxes die).
  PageCursor c0;
  c0.Init(p, start, u0, u1);
  PageCursor c1 = c0;
  c1.Advance(p, cum, u1);
  PageCursor c2 = c1;
  c2.Advance(p, cum, u1);

  auto border_of = [&](int h, int32_t len) {
    const int32_t g = tile * kM + row0 + 8 * h;
    return g >= rows ? len : min(len, len - p.s_q + 1 + g / p.h_q);
  };
  auto load_q = [&](int32_t r) {
    const int32_t g0 = tile * kM;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&sm.bar_q, kTileBytes);
    for (int slab = 0; slab < kSlabs; ++slab) {
      cute::SM90_TMA_LOAD_4D::copy(&targs.q_map, &sm.bar_q, kEvictLast, sm.q + slab * kSlabBytes,
                                   slab * 64, g0 % p.h_q, g0 / p.h_q, r);
    }
  };

  // Prologue: Q and the first two pages. A buffer whose first page slot is empty (a request of
  // length 0) is zeroed, so that the stale contents later empty slots compute on are finite.
  if (tid == 0) {
    load_q(c0.r);
    LoadOrSkip(targs, c0.Has0(), c0.page[0], sm.k[0], sm.bar_k[0], 0, kSlabs);
    if (c1.Valid(u1)) LoadOrSkip(targs, c1.Has0(), c1.page[0], sm.k[1], sm.bar_k[1], 0, kSlabs);
  }
#pragma unroll 1
  for (int b = 0; b < 2; ++b) {
    if (b == 0 ? c0.Has0() : (!c1.Valid(u1) || c1.Has0())) continue;
    for (int c = tid; c < kTileBytes / 16; c += kThreads) {
      reinterpret_cast<uint4*>(sm.k[b])[c] = make_uint4(0, 0, 0, 0);
    }
  }
  blocks::FenceProxyAsyncShared();
  __syncthreads();

  float o[128];  // this warpgroup's half of O
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float s[32];                              // wg1: the page's scores, then its probabilities
  float m_run[2] = {-INFINITY, -INFINITY};  // wg1: running max (log2 domain)
  float l_run[2] = {0.0f, 0.0f};            // wg1: this thread's share of the row sums
  int q_phase = 0;
  int req_parity = 0;  // requests finished, mod 2 (which inv_sum row the next one uses)
  if (kScoresUnderPv && wg == 1) {  // the first page's scores; the loop issues the others
    rec.Add(MlaTraceEvent::kStep, 0);
    Traced(rec, MlaTraceEvent::kWaitQBegin, 0,
           [&] { cutlass::arch::ClusterTransactionBarrier::wait(&sm.bar_q, q_phase); });
    q_phase ^= 1;
    blocks::FenceOperands(s);
    ScoreSlabs<0, kSlabs, true>(sq, sk0, sm.bar_k[0], 0, s, rec, 0);
    Traced(rec, MlaTraceEvent::kWaitMmaBegin, 0, [] { cute::warpgroup_wait<0>(); });
    blocks::FenceOperands(s);
  }

  while (true) {
    const int b = step & 1;
    const int phase = (step >> 1) & 1;  // of buffer b's barriers: its (step / 2)-th page
    // Shared-memory addresses made opaque once per page, so that the wgmma descriptors are rebuilt
    // here rather than hoisted out of the loop into registers O needs.
    uint32_t q_addr = sq, k_addr = sk0 + b * kTileBytes;
    asm volatile("" : "+r"(q_addr), "+r"(k_addr));
    const int32_t len = c0.len;
    const int32_t k_page = c0.Key0();
    const bool has = c0.Has0();
    const int32_t valid = len - k_page;  // keys in the page (when has)
    const bool c1_valid = c1.Valid(u1), c2_valid = c2.Valid(u1);
    if (wg == 0 || !kScoresUnderPv) rec.Add(MlaTraceEvent::kStep, step);

    if (wg == 1) {
      if constexpr (!kScoresUnderPv) {
        if (c0.First()) {
          Traced(rec, MlaTraceEvent::kWaitQBegin, step,
                 [&] { cutlass::arch::ClusterTransactionBarrier::wait(&sm.bar_q, q_phase); });
          q_phase ^= 1;
        }
        blocks::FenceOperands(s);
        ScoreSlabs<0, kSlabs, true>(q_addr, k_addr, sm.bar_k[b], phase, s, rec, step);
        Traced(rec, MlaTraceEvent::kWaitMmaBegin, step, [] { cute::warpgroup_wait<0>(); });
        blocks::FenceOperands(s);
      }
      // The request's last scores in this range are done: Q is dead, the next request's comes.
      if (t == 0 && c0.Last() && c1_valid) load_q(c1.r);

      float mx[2];
      {
        const bool masked = !has || k_page + kMlaPageSize > len - p.s_q + 1;
        const int32_t border[2] = {has ? border_of(0, len) - k_page : 0,
                                   has ? border_of(1, len) - k_page : 0};
        MaskAndRowMax(s, masked, border, quad, args.scale_log2, mx);
      }
      uint32_t pk[8][2];  // P as bf16 pairs: the RS operand, and what goes to slab 8
      float sc[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const blocks::OnlineSoftmaxStep sstep = blocks::NextOnlineSoftmaxStep(m_run[h], mx[h]);
        sc[h] = sstep.rescale;
        const float sum = ExponentiateRow(s, h, args.scale_log2, sstep.offset, pk);
        l_run[h] = l_run[h] * sc[h] + sum;
        m_run[h] = sstep.max;
        if (quad == 0) sm.scale[b][row0 + 8 * h] = sc[h];
      }
      StoreP(sm.k[b], pk, row0, quad);
      Arrive(kPReady0 + b);
      // ---- O_R = O_R rescale + P V_R; then boxes 4..7 of this buffer take page i + 2's.
      RescaleO(o, sc);
      if (has && valid < kMlaPageSize) ZeroRowsPastEnd(sm.k[b], 1, valid, t, 1);
      blocks::FenceOperands(o);
      blocks::FenceOperands(pk);
      cute::warpgroup_arrive();
      PvFromRegisters(pk, k_addr, 1, o);
      cute::warpgroup_commit_batch();
      auto load_v_right = [&] {  // boxes 4..7 are dead once P V_R is done
        if (t == 0 && c2_valid) {
          LoadOrSkip(targs, c2.Has0(), c2.page[0], sm.k[b], sm.bar_k[b], 4, kPSlab);
          rec.Add(MlaTraceEvent::kIssueLoad, step);
        }
      };
      if (kScoresUnderPv && c1_valid) {
        // ---- The next page's scores behind P V_R (other buffer; the next request's Q, loaded
        // above, where the next page starts one).
        const int nb = b ^ 1, nphase = ((step + 1) >> 1) & 1;
        const uint32_t n_addr = sk0 + nb * kTileBytes;
        rec.Add(MlaTraceEvent::kStep, step + 1);
        if (c1.First()) {
          Traced(rec, MlaTraceEvent::kWaitQBegin, step + 1,
                 [&] { cutlass::arch::ClusterTransactionBarrier::wait(&sm.bar_q, q_phase); });
          q_phase ^= 1;
        }
        blocks::FenceOperands(s);
        ScoreSlabs<0, 1, true>(q_addr, n_addr, sm.bar_k[nb], nphase, s, rec, step + 1);
        Traced(rec, MlaTraceEvent::kWaitMmaBegin, step, [] { cute::warpgroup_wait<1>(); });
        blocks::FenceOperands(o);
        blocks::FenceOperands(pk);
        load_v_right();
        ScoreSlabs<1, kSlabs, false>(q_addr, n_addr, sm.bar_k[nb], nphase, s, rec, step + 1);
        Traced(rec, MlaTraceEvent::kWaitMmaBegin, step + 1, [] { cute::warpgroup_wait<0>(); });
        blocks::FenceOperands(s);
      } else {
        Traced(rec, MlaTraceEvent::kWaitMmaBegin, step, [] { cute::warpgroup_wait<0>(); });
        blocks::FenceOperands(o);
        blocks::FenceOperands(pk);
        load_v_right();
      }
      // ---- The request's last page in this range: 1 / row sums to wg0, LSE, O_R out.
      if (c0.Last()) {
        rec.Add(MlaTraceEvent::kEpilogueBegin, step);
        float inv[2], lse2[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const float l = QuadSum(l_run[h]);
          inv[h] = l > 0.0f ? 1.0f / l : 0.0f;
          lse2[h] = l > 0.0f ? m_run[h] + __log2f(l) : -INFINITY;
          if (quad == 0) sm.inv_sum[req_parity][row0 + 8 * h] = inv[h];
        }
        Traced(rec, MlaTraceEvent::kWaitPeerBegin, step, [] { Wait(kRequestDone); });
        WriteRows(args, c0.r, per, tile, row0, quad, 1, o, inv, lse2, true);
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          m_run[h] = -INFINITY;
          l_run[h] = 0.0f;
        }
        req_parity ^= 1;
        rec.Add(MlaTraceEvent::kEpilogueEnd, step);
      }
    } else {
      // ---- O_L = O_L rescale + P V_L, with wg1's P from slab 8; then boxes 0..3 and 8 of this
      // buffer take page i + 2's.
      Traced(rec, MlaTraceEvent::kWaitPeerBegin, step, [&] { Wait(kPReady0 + b); });
      const float sc[2] = {sm.scale[b][row0], sm.scale[b][row0 + 8]};
      RescaleO(o, sc);
      if (has && valid < kMlaPageSize) ZeroRowsPastEnd(sm.k[b], 0, valid, t, 0);
      blocks::FenceOperands(o);
      cute::warpgroup_arrive();
      PvFromShared(k_addr, k_addr, 0, o);
      cute::warpgroup_commit_batch();
      Traced(rec, MlaTraceEvent::kWaitMmaBegin, step, [] { cute::warpgroup_wait<0>(); });
      blocks::FenceOperands(o);
      if (tid == 0 && c2_valid) {
        LoadOrSkip(targs, c2.Has0(), c2.page[0], sm.k[b], sm.bar_k[b], 0, 4);
        LoadOrSkip(targs, c2.Has0(), c2.page[0], sm.k[b], sm.bar_k[b], kPSlab, kSlabs);
        rec.Add(MlaTraceEvent::kIssueLoad, step);
      }
      if (c0.Last()) {
        rec.Add(MlaTraceEvent::kEpilogueBegin, step);
        Traced(rec, MlaTraceEvent::kWaitPeerBegin, step, [] { Wait(kRequestDone); });
        const float inv[2] = {sm.inv_sum[req_parity][row0], sm.inv_sum[req_parity][row0 + 8]};
        const float no_lse[2] = {0.0f, 0.0f};
        WriteRows(args, c0.r, per, tile, row0, quad, 0, o, inv, no_lse, false);
#pragma unroll
        for (int i = 0; i < 128; ++i) o[i] = 0.0f;
        req_parity ^= 1;
        rec.Add(MlaTraceEvent::kEpilogueEnd, step);
      }
    }
    if (!c1_valid) break;
    c0 = c1;
    c1 = c2;
    c2.Advance(p, cum, u1);
    ++step;
  }
  rec.End(step);
}

}  // namespace probesidecar::kernels::mla::sm90a
