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
// overlaps wg1's scores of page i + 1. wg1 alone holds the running max and row sums; at a
// request's last page it hands 1 / row sum to wg0 and each writes its half of O.
//
// Against the page-pair kernel (the in-kernel trace, bench/mla_verify/NOTES.md): about 5,300 cycles
// per page on the H200 whatever the shape, where a pair takes 9,300-10,500 (4,650-5,250 a page)
// even with its second warpgroup waiting 2,000-2,800 cycles a pair for page boxes at h_q = 16:
// with one page's scores at a time, the tensor cores idle during wg1's softmax. Where a block has
// few pages (one request over all SMs, short sequences) its shorter start and end win.
#pragma once

#include "kernels/mla_verify/mla_verify_sm90a.cuh"

namespace probesidecar::kernels::mla::sm90a {

// Boxes [begin, end) of the page a cursor names into page buffer `which`, or, where the cursor's
// slot holds no page, the boxes' barrier phases completed without data (the buffer's stale, finite
// contents then run through the same wgmma with all-zero probabilities).
__device__ __forceinline__ void LoadOrSkip(const Sm90aArgs& targs, bool has, int32_t page,
                                           uint8_t* dst, uint64_t* bars, int begin, int end) {
  if (has) {
    LoadPageBoxes(targs, dst, bars, page, begin, end);
  } else {
    SkipPageBoxes(bars, begin, end);
  }
}

// This thread's share of a page's scores (rows row0, row0 + 8 as h = 0, 1; s[n * 4 + h * 2 + e]:
// key n * 8 + quad * 2 + e of the page): keys at or past border[h] (relative to the page) set to
// -inf when `masked`, and the row maxima in log2 units (-inf stays -inf).
__device__ __forceinline__ void MaskAndRowMax(float (&s)[32], bool masked,
                                              const int32_t (&border)[2], int quad,
                                              float scale_log2, float (&mx)[2]) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float v = -INFINITY;
    if (masked) {
#pragma unroll
      for (int n = 0; n < 8; ++n) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = n * 8 + quad * 2 + e;
          float& x = s[n * 4 + h * 2 + e];
          x = key < border[h] ? x : -INFINITY;
          v = fmaxf(v, x);
        }
      }
    } else {
#pragma unroll
      for (int n = 0; n < 8; ++n) v = fmaxf(v, fmaxf(s[n * 4 + h * 2], s[n * 4 + h * 2 + 1]));
    }
    mx[h] = QuadMax(v) * scale_log2;
  }
}

// P (bf16 pairs, pk[n][h]) of this thread's rows into a page's slab 8 (K-major, swizzled) for the
// other warpgroup's SS wgmma; the slab's rope keys are dead once the page's scores are done.
__device__ __forceinline__ void StoreP(uint8_t* page_buf, const uint32_t (&pk)[8][2], int row0,
                                       int quad) {
  uint8_t* dst = page_buf + kPSlab * kSlabBytes;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int r = row0 + 8 * h;
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      *reinterpret_cast<uint32_t*>(dst + blocks::Swizzle128Offset(r, n) + quad * 4) = pk[n][h];
    }
  }
  blocks::FenceProxyAsyncShared();
}

// O (this thread's 64 x 256 half, rows row0 and row0 + 8) times the rows' rescale factors; skipped
// by a warp whose rows' maxima did not move.
__device__ __forceinline__ void RescaleO(float (&o)[128], const float (&sc)[2]) {
  if (__any_sync(0xffffffffu, sc[0] != 1.0f || sc[1] != 1.0f)) {
#pragma unroll
    for (int n = 0; n < 32; ++n) {
      o[n * 4] *= sc[0];
      o[n * 4 + 1] *= sc[0];
      o[n * 4 + 2] *= sc[1];
      o[n * 4 + 3] *= sc[1];
    }
  }
}

// This warpgroup's half of O (columns 256 wg ..) of a finished request r, times inv[h] (1 / row
// sum), to out, or to its partial slot when the request is split over ranges; lse2[h] (log2
// domain, -inf for a row that saw no key) goes with it where write_lse. `plan`: the block's.
__device__ __forceinline__ void WriteRows(const KernelArgs& args, const int32_t* plan, int32_t r,
                                          int32_t per, int tile, int row0, int quad, int wg,
                                          const float (&o)[128], const float (&inv)[2],
                                          const float (&lse2)[2], bool write_lse) {
  const MlaVerifyParams& p = args.p;
  const int32_t* cum = plan + kPlanCum;
  const int32_t rows = p.s_q * p.h_q;
  int64_t slot = 0;
  const bool direct = !PartialSlot(args, plan, per, r, cum[r], cum[r + 1], blockIdx.y, &slot);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int32_t g = tile * kM + row0 + 8 * h;
    if (g >= rows) continue;
    const int32_t j = g / p.h_q, head = g - j * p.h_q;
    const int col = wg * 256 + quad * 2;
    if (direct) {
      __nv_bfloat16* dst =
          p.out + r * p.out_batch_stride + j * p.out_token_stride + head * p.out_head_stride + col;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) =
            __floats2bfloat162_rn(o[n * 4 + h * 2] * inv[h], o[n * 4 + h * 2 + 1] * inv[h]);
      }
      if (p.lse != nullptr && write_lse && quad == 0) {
        p.lse[r * p.lse_batch_stride + head * p.lse_head_stride + j] =
            lse2[h] == -INFINITY ? -INFINITY : lse2[h] * blocks::kLn2;
      }
    } else {
      float* dst = args.partial_out + (slot * rows + g) * kMlaHeadDimV + col;
#pragma unroll
      for (int n = 0; n < 32; ++n) {
        *reinterpret_cast<float2*>(dst + n * 8) =
            make_float2(o[n * 4 + h * 2] * inv[h], o[n * 4 + h * 2 + 1] * inv[h]);
      }
      if (write_lse && quad == 0) args.partial_lse[slot * rows + g] = lse2[h];
    }
  }
}

// The steps of a block's range [u0, u1) of the flattened batch: each request's part of the range
// kPages pages at a time from its first page there (a part's last step may hold fewer). The step's
// cache page indices are read when the cursor arrives at it, a step or two before the TMA loads
// that use them, so that no issuing thread waits for a global load there.
template <int kPages>
struct StepCursor {
  int32_t r;                   // request
  int32_t u;                   // unit (flattened page) of the step's first page
  int32_t req_begin;           // the request's first unit (cum[r])
  int32_t seg_begin, seg_end;  // the request's units inside the range
  int32_t len;                 // the request's length
  int32_t page[kPages];        // cache pages of units u, u + 1, ... (where HasPage)

  __device__ __forceinline__ bool Valid(int32_t u1) const { return u < u1; }
  __device__ __forceinline__ int32_t Page() const { return u - req_begin; }
  __device__ __forceinline__ int32_t Key0() const { return Page() * kMlaPageSize; }
  // Unit u + i is in this request's part of the range and holds keys.
  __device__ __forceinline__ bool HasPage(int i) const {
    return (i == 0 || u + i < seg_end) && Key0() + i * kMlaPageSize < len;
  }
  __device__ __forceinline__ bool Has0() const { return HasPage(0); }
  __device__ __forceinline__ bool Has1() const { return HasPage(1); }
  __device__ __forceinline__ bool First() const { return u == seg_begin; }
  __device__ __forceinline__ bool Last() const { return u + kPages >= seg_end; }

  __device__ __forceinline__ const int32_t* Table(const MlaVerifyParams& p) const {
    return p.block_table + static_cast<int64_t>(r) * p.block_table_batch_stride;
  }
  __device__ __forceinline__ void LoadPages(const MlaVerifyParams& p) {
    const int32_t* table = Table(p);
#pragma unroll
    for (int i = 0; i < kPages; ++i) page[i] = HasPage(i) ? table[Page() + i] : 0;
  }
  __device__ __forceinline__ void Init(const MlaVerifyParams& p, const RequestCursor& start,
                                       int32_t u0, int32_t u1) {
    r = start.r;
    u = seg_begin = u0;
    req_begin = start.begin;
    seg_end = min(u1, start.end);
    len = start.len;
    LoadPages(p);
  }
  __device__ __forceinline__ void Advance(const MlaVerifyParams& p, const int32_t* cum,
                                          int32_t u1) {
    if (u >= u1) return;
    u += kPages;
    if (u < seg_end) {
      LoadPages(p);
      return;
    }
    if (seg_end >= u1) {
      u = u1;
      return;
    }
    ++r;
    req_begin = seg_begin = u = seg_end;
    seg_end = min(u1, cum[r + 1]);
    len = p.cache_seqlens[r];
    LoadPages(p);
  }
};

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
  kPReady0 = 0,      // P of an even page in its slab 8, its O rescale in scale[0]
  kPReady1 = 1,      // the same for odd pages
  kRequestDone = 2,  // a request's last page: 1 / row sums in inv_sum (both warpgroups wait)
};
static_assert(static_cast<uint32_t>(kRequestDone) < static_cast<uint32_t>(kWarpgroup0),
              "the warpgroup barriers keep their own ids");

using PageCursor = StepCursor<1>;

template <bool kOwnPlan>
__global__ void __launch_bounds__(kThreads, 1)
    MlaVerifyPageSm90aKernel(const __grid_constant__ Sm90aArgs targs) {
  // Grid: (64-row tiles, ranges); block: 256 threads (2 warpgroups); dynamic shared memory
  // kPageSmemBytes. Launched as a programmatic dependent of the kernel before it (the plan kernel,
  // or what wrote the lengths where the block plans itself): nothing global is read before the
  // wait below.
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
    rec.Add(MlaTraceEvent::kStep, step);

    if (wg == 1) {
      if (c0.First()) {
        rec.Add(MlaTraceEvent::kWaitQBegin, step);
        cutlass::arch::ClusterTransactionBarrier::wait(&sm.bar_q, q_phase);
        rec.Add(MlaTraceEvent::kWaitQEnd, step);
        q_phase ^= 1;
      }
      blocks::FenceOperands(s);
      ScoreSlabs<0, kSlabs, true>(q_addr, k_addr, sm.bar_k[b], phase, s, rec, step);
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
      blocks::FenceOperands(s);
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
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
      blocks::FenceOperands(o);
      blocks::FenceOperands(pk);
      if (t == 0 && c2_valid) {
        LoadOrSkip(targs, c2.Has0(), c2.page[0], sm.k[b], sm.bar_k[b], 4, kPSlab);
        rec.Add(MlaTraceEvent::kIssueLoad, step);
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
        rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
        Wait(kRequestDone);
        rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
        WriteRows(args, plan, c0.r, per, tile, row0, quad, 1, o, inv, lse2, true);
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
      rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
      Wait(kPReady0 + b);
      rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
      const float sc[2] = {sm.scale[b][row0], sm.scale[b][row0 + 8]};
      RescaleO(o, sc);
      if (has && valid < kMlaPageSize) ZeroRowsPastEnd(sm.k[b], 0, valid, t, 0);
      blocks::FenceOperands(o);
      cute::warpgroup_arrive();
      PvFromShared(k_addr, k_addr, 0, o);
      cute::warpgroup_commit_batch();
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
      blocks::FenceOperands(o);
      if (tid == 0 && c2_valid) {
        LoadOrSkip(targs, c2.Has0(), c2.page[0], sm.k[b], sm.bar_k[b], 0, 4);
        LoadOrSkip(targs, c2.Has0(), c2.page[0], sm.k[b], sm.bar_k[b], kPSlab, kSlabs);
        rec.Add(MlaTraceEvent::kIssueLoad, step);
      }
      if (c0.Last()) {
        rec.Add(MlaTraceEvent::kEpilogueBegin, step);
        rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
        Wait(kRequestDone);
        rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
        const float inv[2] = {sm.inv_sum[req_parity][row0], sm.inv_sum[req_parity][row0 + 8]};
        const float no_lse[2] = {0.0f, 0.0f};
        WriteRows(args, plan, c0.r, per, tile, row0, quad, 0, o, inv, no_lse, false);
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
