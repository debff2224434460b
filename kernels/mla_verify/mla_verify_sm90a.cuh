// MLA verify tile kernels for sm_90a: wgmma with every operand read by the tensor cores where it
// lands in shared memory, Q and keys brought in by the tensor-memory accelerator (TMA), split-KV
// mode with the plan of mla_verify_plan.h. Compiled only for -gencode
// arch=compute_90a,code=sm_90a (mla_verify_sm90a.cu). This file holds the layouts and wgmma / TMA
// helpers both schedules use and the page-pair ("seesaw") kernel; mla_verify_sm90a_page.cuh the
// one-page kernel, which the plan takes where it measured faster (mla::UseOnePageSchedule). Both
// record the in-kernel trace of mla_verify_trace.h where it is compiled in.
//
// Page-pair kernel. Grid: (64-row query tiles, ranges of the flattened batch); one block per SM.
// Block: 2 warpgroups (256 threads) on one 64-row tile (the wgmma M; rows past s_q * h_q are zeros
// that TMA fills in, and their results are dropped). Dynamic shared memory kSmemBytes: the Q tile
// and two cache pages of 64 x 576 bf16.
//
// Schedule (after FlashMLA's dense decode kernel, "seesaw"): keys come one cache page (64 keys)
// at a time, in pairs; warpgroup 0 owns the even page of a pair (buffer K0), warpgroup 1 the odd
// one (K1). Each warpgroup computes its page's scores S = Q K^T (64 x 64: 36 wgmma m64n64k16,
// both operands in shared memory). O (64 x 512 float32) is split by columns: warpgroup 0 holds
// O_L = O[:, 0:256], warpgroup 1 O_R = O[:, 256:512] (128 registers per thread). Per pair:
//   wg0: softmax of S0 against the running max m -> m0, scale0; P0 (relative to m0) into
//        shared memory; m0, scale0 published         O_L = O_L scale0 + P0 V0_L  (P0 in registers)
//   wg1: O_R = O_R scale0 + P0 V0_R, and under it the softmax of S1 against m0 -> m1, scale1;
//        P1, m1, scale1 published                   O_R = O_R scale1 + P1 V1_R  (P1 in registers)
//   wg0: O_L = O_L scale1 + P1 V1_L
//   each: the scores of its page of the next pair
// so one warpgroup's softmax runs while the other's wgmma keep the tensor cores busy. A page is
// nine 64 x 64 boxes and arrives in three TMAs (boxes 0..3, 4..7 and 8, SlabGroupBar), each on
// the barrier of its first box; each group is reloaded with the next pair's page as soon as its
// last reader is done (the even page's first), and the score wgmma of a page start on its first
// group while the others are still arriving. P0 and P1 are kept in the rope box (columns
// 512..575) of their own page, which is dead once that page's scores are done.
// The next request's Q tile is loaded as soon as the current request's last scores are done, so a
// block streams its whole range without draining at request boundaries.
//
// Shared tiles use the tensor cores' 128-byte-swizzled layout (what TMA writes): a 64-row tile is
// 9 slabs of 64 columns; in a slab, row r takes bytes [128 r, 128 r + 128) and its 16-byte chunk
// c sits at chunk c ^ (r % 8). The same bytes serve as K (K-major) and as V (MN-major). Key rows
// past a sequence's end that a box brings in are zeroed in V before use, so NaN in unused cache
// rows cannot leak in through 0 * NaN; their scores are masked.
#pragma once

#include <cuda.h>
#include <cutlass/arch/barrier.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>

#include "kernels/blocks/cp_async.cuh"
#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/blocks/online_softmax.cuh"
#include "kernels/blocks/wgmma.cuh"
#include "kernels/mla_verify/mla_verify_common.cuh"
#include "kernels/mla_verify/mla_verify_trace.cuh"

namespace probesidecar::kernels::mla::sm90a {

inline constexpr int kThreads = 256;
inline constexpr int kM = 64;                           // query rows per tile
inline constexpr int kSlabs = kMlaHeadDimQk / 64;       // 9 slabs of 64 columns
inline constexpr int kSlabBytes = 64 * 128;             // 64 rows x 64 bf16
inline constexpr int kTileBytes = kSlabs * kSlabBytes;  // 73728: the Q tile, or one page
inline constexpr int kPSlab = 8;                        // the rope slab, reused for P
inline constexpr uint64_t kEvictFirst =  // cache pages: read once (or by sibling tiles at once)
    static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_FIRST);
inline constexpr uint64_t kEvictLast =  // a Q tile: read by every block of its request
    static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST);
// A page's boxes travel in three groups, each one TMA completing on the barrier of its first
// slab: slabs 0..3 and 4..7 (32 KB each, kv_slab_map), and the rope slab 8 (kv_map). Issuing a
// TMA costs the issuing thread ~100 cycles, which its warpgroup waits for at its next wgmma: 3 a
// page instead of 9. Loads and waits name whole groups ([begin, end) on 0, 4, 8, 9).
__host__ __device__ constexpr int SlabGroupBar(int slab) {
  return slab < kPSlab ? slab & ~3 : slab;
}

struct SharedStorage {
  uint8_t q[kTileBytes];       // 1024-byte aligned (the swizzle's period)
  uint8_t k[2][kTileBytes];    // K0 (even pages), K1 (odd pages)
  float max0[kM], scale0[kM];  // written by warpgroup 0, read by warpgroup 1
  float max1[kM], scale1[kM];  // written by warpgroup 1, read by warpgroup 0
  float row_sum[2][kM];        // per warpgroup, at the end of a request
  uint64_t bar_k[2][kSlabs];   // one per box of each page buffer
  uint64_t bar_q;
};
// + 1024: the dynamic base is aligned to 1024 bytes by hand.
inline constexpr int kSmemBytes = static_cast<int>(sizeof(SharedStorage)) + 1024;

// Launch arguments plus the tensor maps (__grid_constant__, as TMA needs).
struct Sm90aArgs {
  CUtensorMap kv_map;       // [pages, 64, 576] bf16, box 64 x 64, 128-byte swizzle
  CUtensorMap kv_slab_map;  // the same as [pages, 9 slabs, 64, 64]: box 4 slabs (32 KB)
  CUtensorMap q_map;        // [b, s_q, h_q, 576] bf16, box 64 rows (heads x tokens) x 64 columns
  KernelArgs args;
  TraceArgs trace;  // where the timestamp trace goes (nowhere unless compiled in and set)
};

// Thread 0, once it has initialised the block's barriers: both tensor maps into the descriptor
// cache (`Args`: Sm90aArgs, or the swap-AB kernel's own).
template <typename Args>
__device__ __forceinline__ void PrefetchTensorMaps(const Args& targs) {
  cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&targs.kv_map));
  cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&targs.q_map));
}
__device__ __forceinline__ void PrefetchTensorMaps(const Sm90aArgs& targs) {
  PrefetchTensorMaps<Sm90aArgs>(targs);
  cute::prefetch_tma_descriptor(reinterpret_cast<const cute::TmaDescriptor*>(&targs.kv_slab_map));
}

// A block's own plan (PlanInBlock), in its static shared memory.
struct BlockPlan {
  int32_t ints[PlanInts(kBlockPlanMaxBatch)];
};

// Every thread, after the __syncthreads that follows the barriers' initialisation: waits for what
// this kernel programmatically depends on (the plan kernel, or, where the block plans itself,
// whatever wrote the lengths), lets the combine be scheduled (it waits too), makes the block's
// plan into `own` where kOwnPlan (launched so where args.plan_store is set), and finds this
// block's range of work units [u0, u1) and the request it starts in. *plan: the plan to read, the
// workspace's or `own`. The choice is a template parameter, so that a kernel reading the
// workspace's plan keeps its registers as they were (reads through a pointer chosen at run time
// spilled 12 more bytes of the page-pair kernel, which runs at the 255-register limit). False: the
// block has no work.
template <bool kOwnPlan>
__device__ __forceinline__ bool EnterPlannedRange(const KernelArgs& args, TraceRecorder& rec,
                                                  BlockPlan& own, const int32_t** plan,
                                                  int32_t* u0, int32_t* u1, RequestCursor* start) {
  blocks::GridDependencyWait();
  blocks::GridDependencyTrigger();
  rec.Add(MlaTraceEvent::kGridWaitEnd, 0);
  if constexpr (kOwnPlan) {
    MakeBlockPlan(args, static_cast<int32_t>(gridDim.y), own.ints);
    *plan = own.ints;
  } else {
    *plan = args.plan;
  }
  return SplitRange(args, *plan, blockIdx.y, u0, u1, start);
}

// Waits for a page box; in a traced build, records the wait when the box had not landed yet.
__device__ __forceinline__ void WaitBox(uint64_t* bar, int phase, TraceRecorder& rec,
                                        int32_t step) {
  if constexpr (kTraceOn) {
    if (cutlass::arch::ClusterTransactionBarrier::test_wait(bar, phase, 1)) return;
    rec.Add(MlaTraceEvent::kWaitKvBegin, step);
    cutlass::arch::ClusterTransactionBarrier::wait(bar, phase);
    rec.Add(MlaTraceEvent::kWaitKvEnd, step);
  } else {
    cutlass::arch::ClusterTransactionBarrier::wait(bar, phase);
  }
}

// Named barriers (ids after CUTLASS's reserved ones). The 256-thread ones pair an arrive of one
// warpgroup with a wait of the other.
enum NamedBarrierId : uint32_t {
  kScale0Ready = 0,  // wg0 -> wg1: max0 / scale0 of this pair, P0 in K0's slab 8
  kScale1Ready,      // wg1 -> wg0: max1 / scale1, P1 in K1's slab 8
  kRowSums,          // both: row sums exchanged at the end of a request
  kWarpgroup0,       // 128 threads of one warpgroup (after zeroing V rows)
  kWarpgroup1,
};
__device__ __forceinline__ void Arrive(uint32_t id) {
  cutlass::arch::NamedBarrier::arrive(kThreads, id);
}
__device__ __forceinline__ void Wait(uint32_t id) {
  cutlass::arch::NamedBarrier::arrive_and_wait(kThreads, id);
}
__device__ __forceinline__ void SyncWarpgroup(int wg) {
  cutlass::arch::NamedBarrier::arrive_and_wait(128, kWarpgroup0 + wg);
}

using cute::SM90::GMMA::ScaleOut;
using GmmaMajor = cute::SM90::GMMA::Major;
using MmaS = cute::SM90::GMMA::MMA_64x64x16_F32BF16BF16_SS<GmmaMajor::K, GmmaMajor::K>;
using MmaPvRs = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<GmmaMajor::K, GmmaMajor::MN>;
using MmaPvSs = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_SS<GmmaMajor::K, GmmaMajor::MN>;

// Shared-memory descriptors (kernels/blocks/wgmma.cuh): Q, K and P are K-major; V, the first 512
// columns of the same key rows, is MN-major with the next 64 columns one slab further (lbo), and
// a k-step of 16 keys moves its start by 16 rows (2048 bytes).
// Both as a base plus an offset (blocks::SwizzledSmemDescAt): each wgmma of a loop adds an
// immediate to a base formed once.
__device__ __forceinline__ uint64_t DescK(uint32_t base, uint32_t off = 0) {
  return blocks::SwizzledKMajorDescAt(base, off);
}
__device__ __forceinline__ uint64_t DescV(uint32_t base, uint32_t off = 0) {
  return blocks::SwizzledSmemDescAt(base, off, kSlabBytes, blocks::kSwizzleAtomBytes);
}

// Scores over slabs [kBegin, kEnd) of a page (4 k-steps each), each slab after its box arrived;
// one commit group per slab. kZeroFirst: the first k-step overwrites s instead of adding.
template <int kBegin, int kEnd, bool kZeroFirst>
__device__ __forceinline__ void ScoreSlabs(uint32_t sq, uint32_t sk, uint64_t* bars, int phase,
                                           float (&s)[32], TraceRecorder& rec, int32_t step) {
  static_assert(SlabGroupBar(kBegin) == kBegin, "scores start on a group of boxes");
#pragma unroll
  for (int slab = kBegin; slab < kEnd; ++slab) {
    if (SlabGroupBar(slab) == slab) WaitBox(&bars[slab], phase, rec, step);
    cute::warpgroup_arrive();
#pragma unroll
    for (int ks = 0; ks < 4; ++ks) {
      const uint32_t off = slab * kSlabBytes + ks * 32;
      blocks::WgmmaSS<MmaS>(
          DescK(sq, off), DescK(sk, off), s,
          kZeroFirst && slab == kBegin && ks == 0 ? ScaleOut::Zero : ScaleOut::One);
    }
    cute::warpgroup_commit_batch();
  }
}

// O_half += P V[:, 256 half ..] with P from registers (pk[n][r]: the bf16 pair of keys
// n * 8 + quad * 2 of row r of this thread) and V from the page in shared memory.
__device__ __forceinline__ void PvFromRegisters(const uint32_t (&pk)[8][2], uint32_t page, int half,
                                                float (&o)[128]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    blocks::WgmmaRS<MmaPvRs>(pk[2 * ks][0], pk[2 * ks][1], pk[2 * ks + 1][0], pk[2 * ks + 1][1],
                             DescV(page, half * 4 * kSlabBytes + ks * 16 * 128), o);
  }
}
// O_half += P V[:, 256 half ..] with P from the page's slab 8 (the other warpgroup put it there).
__device__ __forceinline__ void PvFromShared(uint32_t p_page, uint32_t v_page, int half,
                                             float (&o)[128]) {
#pragma unroll
  for (int ks = 0; ks < 4; ++ks) {
    blocks::WgmmaSS<MmaPvSs>(DescK(p_page, kPSlab * kSlabBytes + ks * 32),
                             DescV(v_page, half * 4 * kSlabBytes + ks * 16 * 128), o);
  }
}

// One thread: the groups of slabs [begin, end) of cache page `page` into a page buffer.
__device__ __forceinline__ void LoadPageBoxes(const Sm90aArgs& targs, uint8_t* dst, uint64_t* bars,
                                              int32_t page, int begin, int end) {
  for (int slab = begin; slab < end;) {
    if (slab < kPSlab) {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&bars[slab], 4 * kSlabBytes);
      cute::SM90_TMA_LOAD_4D::copy(&targs.kv_slab_map, &bars[slab], kEvictFirst,
                                   dst + slab * kSlabBytes, 0, 0, slab, page);
      slab += 4;
    } else {
      cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&bars[slab], kSlabBytes);
      cute::SM90_TMA_LOAD_3D::copy(&targs.kv_map, &bars[slab], kEvictFirst, dst + slab * kSlabBytes,
                                   slab * 64, 0, page);
      ++slab;
    }
  }
}
// The same groups' barrier phases completed without data (a page slot that holds no page).
__device__ __forceinline__ void SkipPageBoxes(uint64_t* bars, int begin, int end) {
  for (int slab = begin; slab < end; ++slab) {
    if (SlabGroupBar(slab) == slab) cutlass::arch::ClusterTransactionBarrier::arrive(&bars[slab]);
  }
}

// Zeroes key rows [valid, 64) of slabs [4 half, 4 half + 4) of a page (one warpgroup, t = its
// thread), then makes the zeros visible to the tensor cores of the warpgroup.
__device__ __forceinline__ void ZeroRowsPastEnd(uint8_t* page, int half, int valid, int t, int wg) {
  const int per_slab = (64 - valid) * 8;  // 16-byte chunks
  for (int c = t; c < 4 * per_slab; c += 128) {
    const int slab = 4 * half + c / per_slab;
    const int rest = c - (c / per_slab) * per_slab;
    *reinterpret_cast<uint4*>(page + slab * kSlabBytes + valid * 128 + rest * 16) =
        make_uint4(0, 0, 0, 0);
  }
  blocks::FenceProxyAsyncShared();
  SyncWarpgroup(wg);
}

// This thread's share of row h of a page's probabilities, in place: s = 2^(s scale_log2 - offset)
// (s[n * 4 + h * 2 + e]: key n * 8 + quad * 2 + e), also as bf16 pairs into pk[n][h] (the RS
// operand, and what store_p puts in shared memory); returns their sum.
__device__ __forceinline__ float ExponentiateRow(float (&s)[32], int h, float scale_log2,
                                                 float offset, uint32_t (&pk)[8][2]) {
  float sum = 0.0f;
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float& x = s[n * 4 + h * 2 + e];
      x = exp2f(fmaf(x, scale_log2, -offset));
      sum += x;
    }
    pk[n][h] = PackBf16(s[n * 4 + h * 2], s[n * 4 + h * 2 + 1]);
  }
  return sum;
}

// The pairs of pages of a block's range [u0, u1) of the flattened batch: each request's part of
// the range two pages at a time from its first page there (a part's last pair may hold one page).
// The pair's cache page indices are read when the cursor arrives at the pair, a pair before the
// TMA loads that use them, so that no issuing thread waits for a global load there.
struct PairCursor {
  int32_t r;                   // request
  int32_t u;                   // unit (flattened page) of the pair's first page
  int32_t req_begin;           // the request's first unit (cum[r])
  int32_t seg_begin, seg_end;  // the request's units inside the range
  int32_t len;                 // the request's length
  int32_t page[2];             // cache pages of units u, u + 1 (where Has0 / Has1)

  __device__ __forceinline__ bool Valid(int32_t u1) const { return u < u1; }
  __device__ __forceinline__ int32_t Page() const { return u - req_begin; }
  __device__ __forceinline__ int32_t Key0() const { return Page() * kMlaPageSize; }
  // Unit u + i is in this request's part of the range and holds keys.
  __device__ __forceinline__ bool HasPage(int i) const {
    return u + i < seg_end && Key0() + i * kMlaPageSize < len;
  }
  __device__ __forceinline__ bool Has0() const { return Key0() < len; }
  __device__ __forceinline__ bool Has1() const { return HasPage(1); }
  __device__ __forceinline__ bool First() const { return u == seg_begin; }
  __device__ __forceinline__ bool Last() const { return u + 2 >= seg_end; }

  __device__ __forceinline__ const int32_t* Table(const MlaVerifyParams& p) const {
    return p.block_table + static_cast<int64_t>(r) * p.block_table_batch_stride;
  }
  __device__ __forceinline__ void LoadPages(const MlaVerifyParams& p) {
    const int32_t* table = Table(p);
    page[0] = Has0() ? table[Page()] : 0;
    page[1] = Has1() ? table[Page() + 1] : 0;
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
    u += 2;
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

template <bool kOwnPlan>
__global__ void __launch_bounds__(kThreads, 1)
    MlaVerifyTileSm90aKernel(const __grid_constant__ Sm90aArgs targs) {
  // Grid: (64-row tiles, ranges); block: 256 threads (2 warpgroups); dynamic shared memory
  // kSmemBytes. Launched as a programmatic dependent of the kernel before it (the plan kernel, or
  // what wrote the lengths where the block plans itself): nothing global is read before the wait
  // below.
  const KernelArgs& args = targs.args;
  const MlaVerifyParams& p = args.p;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  SharedStorage& sm = *reinterpret_cast<SharedStorage*>(
      smem_raw + blocks::SwizzleAtomPadding(blocks::SmemAddr(smem_raw)));
  const uint32_t sq = blocks::SmemAddr(sm.q);
  const uint32_t sk[2] = {blocks::SmemAddr(sm.k[0]), blocks::SmemAddr(sm.k[1])};

  const int tid = threadIdx.x;
  const int wg = tid >> 7;  // 0: even pages, O[:, 0:256]; 1: odd pages, O[:, 256:512]
  const int t = tid & 127;
  const int lane = tid & 31, quad = lane & 3;
  const int row0 = ((t >> 5) << 4) + (lane >> 2);  // this thread's rows: row0, row0 + 8
  const int tile = blockIdx.x;
  const int32_t rows = p.s_q * p.h_q;
  TraceRecorder rec;
  rec.Begin(targs.trace, wg, t == 0);
  int32_t step = 0;  // pairs done (the trace's step)

  if (tid == 0) {
    for (int b = 0; b < 2; ++b)
      for (int s = 0; s < kSlabs; ++s)
        cutlass::arch::ClusterTransactionBarrier::init(&sm.bar_k[b][s], 1);
    cutlass::arch::ClusterTransactionBarrier::init(&sm.bar_q, 1);
    cutlass::arch::fence_barrier_init();
    PrefetchTensorMaps(targs);
  }
  __syncthreads();

  // This block's range and the request it starts in.
  int32_t u0, u1;
  RequestCursor start;
  __shared__ BlockPlan own_plan;
  const int32_t* plan;
  if (!EnterPlannedRange<kOwnPlan>(args, rec, own_plan, &plan, &u0, &u1, &start)) return;
  const int32_t* cum = plan + kPlanCum;
  const int32_t per = plan[0];
  // The pair being computed and the next one (its pages are loaded during this one).
  PairCursor cur;
  cur.Init(p, start, u0, u1);
  PairCursor nxt = cur;
  nxt.Advance(p, cum, u1);

  // This thread's two query rows (h = 0, 1) in the request: g, its token j (-1 past the rows).
  // Recomputed where used (cheap) rather than held in registers across the loop.
  auto row_g = [&](int h) { return tile * kM + row0 + 8 * h; };
  auto row_j = [&](int h) { return row_g(h) < rows ? row_g(h) / p.h_q : -1; };
  // Keys [0, border) are visible to the row: min(L, L - s_q + 1 + j); L for padding rows.
  auto border_of = [&](int h, int32_t len) {
    const int32_t j = row_j(h);
    return j < 0 ? len : min(len, len - p.s_q + 1 + j);
  };

  // Q tile of request r: nine boxes of 64 columns x (heads x tokens) = 64 rows.
  auto load_q = [&](int32_t r) {
    const int32_t g0 = tile * kM;
    cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&sm.bar_q, kTileBytes);
    for (int slab = 0; slab < kSlabs; ++slab) {
      cute::SM90_TMA_LOAD_4D::copy(&targs.q_map, &sm.bar_q, kEvictLast, sm.q + slab * kSlabBytes,
                                   slab * 64, g0 % p.h_q, g0 / p.h_q, r);
    }
  };

  // A page slot of a pair with no page in it gets its barriers' phases completed without data,
  // and its stale contents run through the wgmma with all-zero probabilities: every pair issues
  // the same wgmma sequence, so no accumulator is in flight where control flow merges. Stale V
  // is finite: a buffer holds zeros until its first load, and the rows past a sequence's end
  // that a load brings are zeroed in the pair that uses them.
  auto load_or_skip = [&](const PairCursor& c, int which, int begin, int end) {
    const bool has = which == 0 ? c.Has0() : c.Has1();
    if (has) {
      LoadPageBoxes(targs, sm.k[which], sm.bar_k[which], c.page[which], begin, end);
    } else {
      SkipPageBoxes(sm.bar_k[which], begin, end);
    }
  };
  // Prologue: the first pair's Q and pages, and its scores. A buffer the first pair leaves
  // unloaded is zeroed (once the other loads are under way), the TMA writes into it later.
  if (tid == 0) {
    load_q(cur.r);
    load_or_skip(cur, 0, 0, kSlabs);
    load_or_skip(cur, 1, 0, kSlabs);
  }
#pragma unroll 1
  for (int b = 0; b < 2; ++b) {
    if (b == 0 ? cur.Has0() : cur.Has1()) continue;
    for (int c = tid; c < kTileBytes / 16; c += kThreads) {
      reinterpret_cast<uint4*>(sm.k[b])[c] = make_uint4(0, 0, 0, 0);
    }
  }
  blocks::FenceProxyAsyncShared();
  __syncthreads();

  float o[128];
#pragma unroll
  for (int i = 0; i < 128; ++i) o[i] = 0.0f;
  float s[32];                              // this warpgroup's page scores, then its probabilities
  float m_run[2] = {-INFINITY, -INFINITY};  // running max (log2 domain) after the last pair
  float l_run[2] = {0.0f, 0.0f};            // this thread's share of the row sums
  int phase = 0;                            // of this warpgroup's page buffer's barriers
  int q_phase = 0;

  rec.Add(MlaTraceEvent::kStep, step);
  rec.Add(MlaTraceEvent::kWaitQBegin, step);
  cutlass::arch::ClusterTransactionBarrier::wait(&sm.bar_q, q_phase);
  rec.Add(MlaTraceEvent::kWaitQEnd, step);
  q_phase ^= 1;
  blocks::FenceOperands(s);
  ScoreSlabs<0, kSlabs, true>(sq, wg == 0 ? sk[0] : sk[1], wg == 0 ? sm.bar_k[0] : sm.bar_k[1],
                              phase, s, rec, step);
  rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
  cute::warpgroup_wait<0>();
  rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
  blocks::FenceOperands(s);
  phase ^= 1;

  while (true) {
    // Shared-memory addresses made opaque to the compiler once per pair, so that the ~50 wgmma
    // descriptors are rebuilt from them here instead of being hoisted out of the loop (they
    // would not fit in the registers next to O).
    uint32_t q_addr = sq, k_addr[2] = {sk[0], sk[1]};
    asm volatile("" : "+r"(q_addr), "+r"(k_addr[0]), "+r"(k_addr[1]));
    const int32_t len = cur.len;
    // This warpgroup's page of the pair: first key, and whether its scores need the mask.
    const int32_t k_page = cur.Key0() + wg * kMlaPageSize;
    const bool has_mine = wg == 0 ? cur.Has0() : cur.Has1();
    const bool has0 = cur.Has0(), has1 = cur.Has1();
    const int32_t valid0 = len - cur.Key0(), valid1 = valid0 - kMlaPageSize;  // keys in a page
    const bool nxt_valid = nxt.Valid(u1);

    // ---- Softmax of this warpgroup's page: mask (causal and past the end; a page that is not
    // there is all masked), row max in log2 units. s[n * 4 + e]: row row0 + 8 (e / 2), key
    // k_page + n * 8 + quad * 2 + e % 2.
    float mx[2];
    const bool masked = !has_mine || k_page + kMlaPageSize > len - p.s_q + 1;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float v = -INFINITY;
      if (masked) {
        const int32_t border = has_mine ? border_of(h, len) - k_page : 0;
#pragma unroll
        for (int n = 0; n < 8; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int key = n * 8 + quad * 2 + e;
            float& x = s[n * 4 + h * 2 + e];
            x = key < border ? x : -INFINITY;
            v = fmaxf(v, x);
          }
        }
      } else {
#pragma unroll
        for (int n = 0; n < 8; ++n) v = fmaxf(v, fmaxf(s[n * 4 + h * 2], s[n * 4 + h * 2 + 1]));
      }
      mx[h] = QuadMax(v) * args.scale_log2;  // -inf stays -inf (scale > 0)
    }

    uint32_t pk[8][2];  // this warpgroup's P as bf16 pairs (the RS operand, and P in smem)
    // P (bf16 pairs) into the page's slab 8 (K-major, swizzled) for the other warpgroup's SS
    // wgmma; the slab's rope keys are dead once the page's scores are done.
    auto store_p = [&](uint8_t* page_buf) {
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
    };
    auto rescale_o = [&](const float(&sc)[2]) {
      if (__any_sync(0xffffffffu, sc[0] != 1.0f || sc[1] != 1.0f)) {  // the max moved
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          o[n * 4] *= sc[0];
          o[n * 4 + 1] *= sc[0];
          o[n * 4 + 2] *= sc[1];
          o[n * 4 + 3] *= sc[1];
        }
      }
    };
    if (wg == 0) {
      // ---- Warpgroup 0: m0 = max(m, rowmax S0), scale0 = 2^(m - m0), P0 relative to m0
      // (published with m0 and scale0 for wg1, before anything waits on the tensor cores).
      float sc0[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const blocks::OnlineSoftmaxStep step = blocks::NextOnlineSoftmaxStep(m_run[h], mx[h]);
        sc0[h] = step.rescale;
        const float sum = ExponentiateRow(s, h, args.scale_log2, step.offset, pk);
        l_run[h] = l_run[h] * sc0[h] + sum;
        m_run[h] = step.max;
        if (quad == 0) {
          sm.max0[row0 + 8 * h] = step.max;
          sm.scale0[row0 + 8 * h] = sc0[h];
        }
      }
      store_p(sm.k[0]);
      Arrive(kScale0Ready);
      // ---- O_L = O_L scale0 + P0 V0_L.
      rescale_o(sc0);
      if (has0 && valid0 < kMlaPageSize) ZeroRowsPastEnd(sm.k[0], 0, valid0, t, 0);
      blocks::FenceOperands(o);
      blocks::FenceOperands(pk);
      cute::warpgroup_arrive();
      PvFromRegisters(pk, k_addr[0], 0, o);
      cute::warpgroup_commit_batch();
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
      blocks::FenceOperands(o);
      blocks::FenceOperands(pk);
      // K0's boxes 0..3 (V0_L) are dead: the next even page's first boxes.
      if (tid == 0 && nxt_valid) {
        load_or_skip(nxt, 0, 0, 4);
        rec.Add(MlaTraceEvent::kIssueLoad, step);
      }
      // ---- wg1's m1, scale1 (and P1 in K1's slab 8): O_L = O_L scale1 + P1 V1_L. wg1's scores
      // of this pair are done, so Q is dead: the next request's Q.
      rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
      Wait(kScale1Ready);
      rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
      float sc1[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        sc1[h] = sm.scale1[row0 + 8 * h];
        m_run[h] = sm.max1[row0 + 8 * h];
        l_run[h] *= sc1[h];
      }
      if (tid == 0 && nxt_valid && nxt.First()) load_q(nxt.r);
      rescale_o(sc1);
      if (has1 && valid1 < kMlaPageSize) ZeroRowsPastEnd(sm.k[1], 0, valid1, t, 0);
      blocks::FenceOperands(o);
      cute::warpgroup_arrive();
      PvFromShared(k_addr[1], k_addr[1], 0, o);
      cute::warpgroup_commit_batch();
      // ---- The next even page's scores: boxes 0..3 (loaded above), then, once P1 V1_L is done
      // (K1's boxes 0..3 and 8 are dead: the next odd page's), boxes 4..8 (loaded by wg1 early).
      if (nxt_valid) {
        rec.Add(MlaTraceEvent::kStep, step + 1);
        if (nxt.First()) {
          rec.Add(MlaTraceEvent::kWaitQBegin, step + 1);
          cutlass::arch::ClusterTransactionBarrier::wait(&sm.bar_q, q_phase);
          rec.Add(MlaTraceEvent::kWaitQEnd, step + 1);
        }
        blocks::FenceOperands(s);
        ScoreSlabs<0, 4, true>(q_addr, k_addr[0], sm.bar_k[0], phase, s, rec, step + 1);
        rec.Add(MlaTraceEvent::kWaitMmaBegin, step + 1);
        cute::warpgroup_wait<4>();
        rec.Add(MlaTraceEvent::kWaitMmaEnd, step + 1);
        blocks::FenceOperands(o);
        if (tid == 0) {
          load_or_skip(nxt, 1, 0, 4);
          load_or_skip(nxt, 1, kPSlab, kSlabs);
          rec.Add(MlaTraceEvent::kIssueLoad, step);
        }
        ScoreSlabs<4, kSlabs, false>(q_addr, k_addr[0], sm.bar_k[0], phase, s, rec, step + 1);
        rec.Add(MlaTraceEvent::kWaitMmaBegin, step + 1);
        cute::warpgroup_wait<0>();
        rec.Add(MlaTraceEvent::kWaitMmaEnd, step + 1);
        blocks::FenceOperands(s);
        phase ^= 1;
      } else {
        rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
        cute::warpgroup_wait<0>();
        rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
        blocks::FenceOperands(o);
      }
    } else {
      // ---- Warpgroup 1: O_R = O_R scale0 + P0 V0_R first (its operands are all there), with
      // the softmax of S1 under it: m1 = max(m0, rowmax S1), scale1 = 2^(m0 - m1).
      rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
      Wait(kScale0Ready);
      rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
      float m0[2], sc0[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m0[h] = sm.max0[row0 + 8 * h];
        sc0[h] = sm.scale0[row0 + 8 * h];
      }
      rescale_o(sc0);
      if (has0 && valid0 < kMlaPageSize) ZeroRowsPastEnd(sm.k[0], 1, valid0, t, 1);
      blocks::FenceOperands(o);
      cute::warpgroup_arrive();
      PvFromShared(k_addr[0], k_addr[0], 1, o);
      cute::warpgroup_commit_batch();
      float sc1[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const blocks::OnlineSoftmaxStep step = blocks::NextOnlineSoftmaxStep(m0[h], mx[h]);
        sc1[h] = step.rescale;
        const float sum = ExponentiateRow(s, h, args.scale_log2, step.offset, pk);
        l_run[h] = l_run[h] * (sc0[h] * sc1[h]) + sum;
        m_run[h] = step.max;
        if (quad == 0) {
          sm.max1[row0 + 8 * h] = step.max;
          sm.scale1[row0 + 8 * h] = sc1[h];
        }
      }
      store_p(sm.k[1]);
      Arrive(kScale1Ready);
      // Once P0 V0_R is done, K0's boxes 4..8 are dead: the next even page's last boxes.
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
      blocks::FenceOperands(o);
      if (t == 0 && nxt_valid) {
        load_or_skip(nxt, 0, 4, kSlabs);
        rec.Add(MlaTraceEvent::kIssueLoad, step);
      }
      // ---- O_R = O_R scale1 + P1 V1_R.
      rescale_o(sc1);
      if (has1 && valid1 < kMlaPageSize) ZeroRowsPastEnd(sm.k[1], 1, valid1, t, 1);
      blocks::FenceOperands(o);
      blocks::FenceOperands(pk);
      cute::warpgroup_arrive();
      PvFromRegisters(pk, k_addr[1], 1, o);
      cute::warpgroup_commit_batch();
      rec.Add(MlaTraceEvent::kWaitMmaBegin, step);
      cute::warpgroup_wait<0>();
      rec.Add(MlaTraceEvent::kWaitMmaEnd, step);
      blocks::FenceOperands(o);
      blocks::FenceOperands(pk);
      // K1's boxes 4..7 (V1_R) are dead: the next odd page's.
      if (t == 0 && nxt_valid) {
        load_or_skip(nxt, 1, 4, kPSlab);
        rec.Add(MlaTraceEvent::kIssueLoad, step);
      }
      // ---- The next odd page's scores: boxes 0..3 and 8 (loaded by wg0), then 4..7.
      if (nxt_valid) {
        rec.Add(MlaTraceEvent::kStep, step + 1);
        if (nxt.First()) {
          rec.Add(MlaTraceEvent::kWaitQBegin, step + 1);
          cutlass::arch::ClusterTransactionBarrier::wait(&sm.bar_q, q_phase);
          rec.Add(MlaTraceEvent::kWaitQEnd, step + 1);
        }
        blocks::FenceOperands(s);
        ScoreSlabs<0, 4, true>(q_addr, k_addr[1], sm.bar_k[1], phase, s, rec, step + 1);
        ScoreSlabs<kPSlab, kSlabs, false>(q_addr, k_addr[1], sm.bar_k[1], phase, s, rec, step + 1);
        ScoreSlabs<4, kPSlab, false>(q_addr, k_addr[1], sm.bar_k[1], phase, s, rec, step + 1);
        rec.Add(MlaTraceEvent::kWaitMmaBegin, step + 1);
        cute::warpgroup_wait<0>();
        rec.Add(MlaTraceEvent::kWaitMmaEnd, step + 1);
        blocks::FenceOperands(s);
        phase ^= 1;
      }
    }
    if (nxt_valid && nxt.First()) q_phase ^= 1;

    // ---- The request's last pair in this range: row sums of both warpgroups, then this
    // warpgroup's half of O to out (or to a partial slot when the request is split).
    if (cur.Last()) {
      rec.Add(MlaTraceEvent::kEpilogueBegin, step);
      float l_tot[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        l_tot[h] = QuadSum(l_run[h]);
        if (quad == 0) sm.row_sum[wg][row0 + 8 * h] = l_tot[h];
      }
      rec.Add(MlaTraceEvent::kWaitPeerBegin, step);
      Wait(kRowSums);
      rec.Add(MlaTraceEvent::kWaitPeerEnd, step);
      const int32_t r = cur.r;
      int64_t slot = 0;
      const bool direct =
          !PartialSlot(args, plan, per, r, cum[r], cum[r + 1], blockIdx.y, &slot);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int32_t g = row_g(h);
        if (g >= rows) continue;
        const float l = sm.row_sum[0][row0 + 8 * h] + sm.row_sum[1][row0 + 8 * h];
        const float inv = l > 0.0f ? 1.0f / l : 0.0f;
        const float lse2 = l > 0.0f ? m_run[h] + __log2f(l) : -INFINITY;
        const int32_t j = g / p.h_q, head = g - j * p.h_q;
        const int col = wg * 256 + quad * 2;
        if (direct) {
          __nv_bfloat16* dst = p.out + r * p.out_batch_stride + j * p.out_token_stride +
                               head * p.out_head_stride + col;
#pragma unroll
          for (int n = 0; n < 32; ++n) {
            *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) =
                __floats2bfloat162_rn(o[n * 4 + h * 2] * inv, o[n * 4 + h * 2 + 1] * inv);
          }
          if (p.lse != nullptr && wg == 0 && quad == 0) {
            p.lse[r * p.lse_batch_stride + head * p.lse_head_stride + j] =
                l > 0.0f ? lse2 * blocks::kLn2 : -INFINITY;
          }
        } else {
          float* dst = args.partial_out + (slot * rows + g) * kMlaHeadDimV + col;
#pragma unroll
          for (int n = 0; n < 32; ++n) {
            *reinterpret_cast<float2*>(dst + n * 8) =
                make_float2(o[n * 4 + h * 2] * inv, o[n * 4 + h * 2 + 1] * inv);
          }
          if (wg == 0 && quad == 0) args.partial_lse[slot * rows + g] = lse2;
        }
      }
#pragma unroll
      for (int i = 0; i < 128; ++i) o[i] = 0.0f;
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        m_run[h] = -INFINITY;
        l_run[h] = 0.0f;
      }
      rec.Add(MlaTraceEvent::kEpilogueEnd, step);
    }
    if (!nxt_valid) break;
    cur = nxt;
    nxt.Advance(p, cum, u1);
    ++step;
  }
  rec.End(step);
}

}  // namespace probesidecar::kernels::mla::sm90a
