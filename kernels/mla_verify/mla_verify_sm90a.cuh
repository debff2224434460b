// MLA verify tile kernel for sm_90a: wgmma (warpgroup MMA) with both QK^T operands and V read
// by the tensor cores straight from shared memory, keys brought in by the tensor-memory
// accelerator (TMA). Compiled only for -gencode arch=compute_90a,code=sm_90a
// (mla_verify_sm90a.cu).
//
// Block: 2 warpgroups (256 threads), one 64-row query tile (the wgmma M; rows past s_q * h_q are
// zero and their results dropped), keys in stages of 32 (half a page) through a 3-deep ring.
// Per stage:
//   S = Q K^T  : split over the depth: warpgroup w multiplies depth columns [288 w, 288 w + 288)
//                (18 wgmma m64n32k16, Q and K from shared memory), then the two partial 64 x 32
//                score tiles are added through shared memory. Each score is computed once, and
//                both warpgroups end with the same (bitwise) scores, so their softmax state
//                (running max and sum per row) agrees without further exchange.
//   softmax    : online, in registers (the wgmma accumulator layout: a thread holds 2 rows).
//   O += P V   : warpgroup w owns O[64 rows, columns 256 w .. +256] (128 float32 per thread) and
//                runs 2 wgmma m64n256k16 with P from registers and V from shared memory.
// Shared tiles use the tensor cores' 128-byte-swizzled layout: a tile of R rows x 576 is 9 slabs
// of 64 columns; in a slab, row r takes bytes [128 r, 128 r + 128) and its 16-byte chunk j sits
// at chunk j ^ (r % 8). The same bytes serve as K (K-major: 8-row groups 1024 bytes apart) and
// as V (MN-major: 64-column groups one slab apart). Key stages come in by TMA (one thread issues
// 9 boxes of 32 rows x 64 columns per stage, completing on an mbarrier); the Q tile, once per
// request, by cp.async. A variant loads keys by cp.async too (kTma = false), for devices or
// drivers without tensor maps. Rows past a sequence's end that a TMA box brings in are zeroed
// before use, so NaN in unused cache rows cannot leak in through 0 * NaN.
#pragma once

#include <cuda.h>

#include <cute/arch/copy_sm90_desc.hpp>
#include <cute/arch/copy_sm90_tma.hpp>
#include <cute/arch/mma_sm90_desc.hpp>
#include <cute/arch/mma_sm90_gmma.hpp>
#include <cutlass/arch/barrier.h>

#include <utility>

#include "kernels/mla_verify/mla_verify_common.cuh"

namespace probesidecar::kernels::mla::sm90a {

inline constexpr int kThreads = 256;
inline constexpr int kM = 64;
inline constexpr int kN = 32;                       // keys per stage
inline constexpr int kStages = 3;
inline constexpr int kSlabs = kMlaHeadDimQk / 64;           // 9 slabs of 64 columns
inline constexpr int kQSlabBytes = kM * 128;                 // 8192
inline constexpr int kKSlabBytes = kN * 128;                 // 4096
inline constexpr int kQBytes = kSlabs * kQSlabBytes;         // 73728
inline constexpr int kStageBytes = kSlabs * kKSlabBytes;     // 36864
inline constexpr int kXBytes = 2 * 16 * kThreads / 2 * 4;    // 2 x (64 x 32 float32)
inline constexpr int kBarBytes = 64;                         // kStages mbarriers
// + 1024: the swizzle needs 1024-byte aligned slabs; the dynamic base is aligned by hand.
inline constexpr int kSmemBytes = 1024 + kQBytes + kStages * kStageBytes + kXBytes + kBarBytes;

// Launch arguments plus the cache's tensor map (a __grid_constant__ parameter, as TMA needs).
struct Sm90aArgs {
  CUtensorMap kv_map;  // [pages, 64, 576] bf16, box 32 x 64, 128-byte swizzle
  KernelArgs args;
};

// Byte offset of 16-byte chunk c (0..71) of row r in a swizzled tile with slabs of slab_bytes.
__device__ __forceinline__ uint32_t SwizzledChunk(int r, int c, int slab_bytes) {
  return (c >> 3) * slab_bytes + r * 128 + (((c & 7) ^ (r & 7)) << 4);
}

using GmmaMajor = cute::SM90::GMMA::Major;
using MmaS = cute::SM90::GMMA::MMA_64x32x16_F32BF16BF16_SS<GmmaMajor::K, GmmaMajor::K>;
using MmaO = cute::SM90::GMMA::MMA_64x256x16_F32BF16BF16_RS<GmmaMajor::K, GmmaMajor::MN>;

// A shared-memory matrix descriptor, 128-byte swizzle. K-major operands (Q, K): sbo = 1024 (the
// next 8 rows), lbo unused; a k-step inside a slab moves the start by 32 bytes (the swizzle is
// applied on the address bits, so the slab must be 1024-byte aligned). The MN-major V operand:
// sbo = 1024 (the next 8 keys, along K), lbo = the slab size (the next 64 columns, along N).
__device__ __forceinline__ uint64_t Desc(uint32_t smem_addr, uint32_t lbo, uint32_t sbo) {
  cute::GmmaDescriptor d;
  d.bitfield.start_address_ = static_cast<uint16_t>(smem_addr >> 4);
  d.bitfield.leading_byte_offset_ = static_cast<uint16_t>(lbo >> 4);
  d.bitfield.stride_byte_offset_ = static_cast<uint16_t>(sbo >> 4);
  d.bitfield.base_offset_ = 0;
  d.bitfield.layout_type_ = 1;  // 128-byte swizzle
  return d.desc_;
}

template <size_t... I>
__device__ __forceinline__ void WgmmaS(uint64_t da, uint64_t db, float (&d)[16],
                                       std::index_sequence<I...>) {
  MmaS::fma(da, db, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}
template <size_t... I>
__device__ __forceinline__ void WgmmaO(const uint32_t (&a)[4], uint64_t db, float (&d)[128],
                                       std::index_sequence<I...>) {
  MmaO::fma(a[0], a[1], a[2], a[3], db, d[I]..., cute::SM90::GMMA::ScaleOut::One);
}
template <int kN2>
__device__ __forceinline__ void FenceRegs(float (&r)[kN2]) {
#pragma unroll
  for (int i = 0; i < kN2; ++i) cute::warpgroup_fence_operand(r[i]);
}

__device__ __forceinline__ void FenceProxyAsync() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Barrier of the block's 256 threads other than __syncthreads (id 1), for the score exchange.
__device__ __forceinline__ void ExchangeBarrier() { asm volatile("bar.sync 1, 256;\n" ::: "memory"); }

template <bool kSplit, bool kTma>
__global__ void __launch_bounds__(kThreads, 1)
    MlaVerifyTileSm90aKernel(const __grid_constant__ Sm90aArgs targs) {
  // Grid: (64-row tiles, ranges) in split mode, (64-row tiles, batch) without split.
  // Block: 256 threads (2 warpgroups); dynamic shared memory kSmemBytes.
  const KernelArgs& args = targs.args;
  const MlaVerifyParams& p = args.p;
  extern __shared__ __align__(128) uint8_t smem_raw[];
  uint8_t* smem = smem_raw + ((1024 - (SmemAddr(smem_raw) & 1023)) & 1023);
  const uint32_t sq = SmemAddr(smem);
  const uint32_t skv = sq + kQBytes;
  float* sx = reinterpret_cast<float*>(smem + kQBytes + kStages * kStageBytes);
  uint64_t* bars = reinterpret_cast<uint64_t*>(smem + kQBytes + kStages * kStageBytes + kXBytes);
  if constexpr (kTma) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < kStages; ++s) cutlass::arch::ClusterTransactionBarrier::init(&bars[s], 1);
      cutlass::arch::fence_barrier_init();
    }
    __syncthreads();
  }

  const int tid = threadIdx.x;
  const int wg = tid >> 7;             // warpgroup: depth half for S, column half for O
  const int t = tid & 127;             // thread within the warpgroup
  const int lane = tid & 31, quad = lane & 3;
  const int row0 = ((t >> 5) << 4) + (lane >> 2);  // this thread's rows: row0 and row0 + 8
  const int tile = blockIdx.x;
  const int32_t rows = p.s_q * p.h_q;

  int32_t u0, u1;
  RequestCursor load_cur, comp_cur;
  if constexpr (kSplit) {
    if (!SplitRange(args, blockIdx.y, &u0, &u1, &load_cur)) return;
  } else {
    const int32_t r = blockIdx.y;
    u0 = 0;
    u1 = UnitsOf(p.cache_seqlens[r]);
    load_cur = {nullptr, r, 0, u1, 0, nullptr};
    load_cur.Load(p);
  }
  comp_cur = load_cur;
  const int32_t num_blocks = 2 * (u1 - u0);

  // Stage block i (32 keys, half a page) into ring slot `slot`. Returns the valid key rows.
  auto load_block = [&](int32_t i, int slot) {
    const int32_t u = u0 + (i >> 1);
    load_cur.Advance(p, u);
    const int32_t page_in_req = u - load_cur.begin;
    const int32_t k0 = page_in_req * kMlaPageSize + (i & 1) * kN;
    const int32_t valid = min(kN, max(0, load_cur.len - k0));
    const uint32_t dst = skv + slot * kStageBytes;
    if constexpr (kTma) {
      // One thread: expect the bytes, then 9 boxes (rows past the end come too; zeroed later).
      if (threadIdx.x == 0) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&bars[slot],
                                                                      valid > 0 ? kStageBytes : 0);
        if (valid > 0) {
          const int32_t page = load_cur.table[page_in_req];
#pragma unroll
          for (int sl = 0; sl < kSlabs; ++sl) {
            cute::SM90_TMA_LOAD_3D::copy(&targs.kv_map, &bars[slot],
                                         static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_NORMAL),
                                         smem + kQBytes + slot * kStageBytes + sl * kKSlabBytes,
                                         sl * 64, (i & 1) * kN, page);
          }
        }
      }
    } else {
      const __nv_bfloat16* src = p.kv_cache;
      if (valid > 0) {
        src += static_cast<int64_t>(load_cur.table[page_in_req]) * p.kv_page_stride +
               static_cast<int64_t>((i & 1) * kN) * p.kv_row_stride;
      }
#pragma unroll 3
      for (int c = tid; c < kN * kChunksPerRow; c += kThreads) {
        const int row = c / kChunksPerRow, chunk = c - row * kChunksPerRow;
        const bool ok = row < valid;
        const __nv_bfloat16* g = ok ? src + row * p.kv_row_stride + chunk * 8 : p.kv_cache;
        CpAsync16(dst + SwizzledChunk(row, chunk, kKSlabBytes), g, ok ? 16 : 0);
      }
    }
  };
  auto load_q = [&](int32_t r) {
    for (int c = tid; c < kM * kChunksPerRow; c += kThreads) {
      const int row = c / kChunksPerRow, chunk = c - row * kChunksPerRow;
      const int32_t g = tile * kM + row;
      const bool ok = g < rows;
      const __nv_bfloat16* src = p.q;
      if (ok) {
        const int32_t j = g / p.h_q, h = g - j * p.h_q;
        src += r * p.q_batch_stride + j * p.q_token_stride + h * p.q_head_stride + chunk * 8;
      }
      CpAsync16(sq + SwizzledChunk(row, chunk, kQSlabBytes), src, ok ? 16 : 0);
    }
  };

  float o[128];
  float m_run[2], l_run[2];
  auto reset_state = [&]() {
#pragma unroll
    for (int i = 0; i < 128; ++i) o[i] = 0.0f;
    m_run[0] = m_run[1] = -INFINITY;
    l_run[0] = l_run[1] = 0.0f;
  };
  reset_state();

  auto finalize = [&](const RequestCursor& cur) {
    int64_t slot = 0;
    bool direct = true;
    if constexpr (kSplit) direct = !PartialSlot(args, cur, blockIdx.y, &slot);
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int32_t g = tile * kM + row0 + half * 8;
      if (g >= rows) continue;
      const float l = l_run[half];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      const float lse2 = l > 0.0f ? m_run[half] + __log2f(l) : -INFINITY;
      const int32_t j = g / p.h_q, h = g - j * p.h_q;
      const int col = wg * 256 + quad * 2;
      if (direct) {
        __nv_bfloat16* dst = p.out + cur.r * p.out_batch_stride + j * p.out_token_stride +
                             h * p.out_head_stride + col;
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          *reinterpret_cast<__nv_bfloat162*>(dst + n * 8) =
              __floats2bfloat162_rn(o[n * 4 + half * 2] * inv, o[n * 4 + half * 2 + 1] * inv);
        }
        if (p.lse != nullptr && wg == 0 && quad == 0) {
          p.lse[cur.r * p.lse_batch_stride + h * p.lse_head_stride + j] =
              l > 0.0f ? lse2 * kLn2 : -INFINITY;
        }
      } else {
        float* dst = args.partial_out + (slot * rows + g) * kMlaHeadDimV + col;
#pragma unroll
        for (int n = 0; n < 32; ++n) {
          *reinterpret_cast<float2*>(dst + n * 8) =
              make_float2(o[n * 4 + half * 2] * inv, o[n * 4 + half * 2 + 1] * inv);
        }
        if (wg == 0 && quad == 0) args.partial_lse[slot * rows + g] = lse2;
      }
    }
  };

#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < num_blocks) load_block(i, i);
    if constexpr (!kTma) CpAsyncCommit();
  }

  // P of the stage whose P·V is in flight: wgmma reads these registers asynchronously, so they
  // live outside the loop and are "touched" (fenced) only after each wait.
  uint32_t pa[2][4] = {};
  auto fence_pa = [&]() {
#pragma unroll
    for (int k = 0; k < 8; ++k) cute::warpgroup_fence_operand(pa[k >> 2][k & 3]);
  };
  int32_t q_request = -1;
  for (int32_t i = 0; i < num_blocks; ++i) {
    if constexpr (kTma) {
      cutlass::arch::ClusterTransactionBarrier::wait(&bars[i % kStages], (i / kStages) & 1);
    } else {
      CpAsyncWait<kStages - 2>();
      FenceProxyAsync();  // cp.async writes via the generic proxy; wgmma reads via the async one
    }
    __syncthreads();
    const int32_t u = u0 + (i >> 1);
    comp_cur.Advance(p, u);
    if (comp_cur.r != q_request) {
      load_q(comp_cur.r);
      CpAsyncCommit();
      CpAsyncWait<0>();
      FenceProxyAsync();
      __syncthreads();
      q_request = comp_cur.r;
    }
    // The next stage's loads go into the slot of stage i - 1, whose P·V may still run (it is
    // waited for together with this stage's scores): issued after the exchange barrier below.
    auto issue_next = [&]() {
      if (i + kStages - 1 < num_blocks) load_block(i + kStages - 1, (i + kStages - 1) % kStages);
      if constexpr (!kTma) CpAsyncCommit();
    };

    const int slot = i % kStages;
    const uint32_t stage = skv + slot * kStageBytes;
    const int32_t k_block = (u - comp_cur.begin) * kMlaPageSize + (i & 1) * kN;
    const int32_t len = comp_cur.len;
    if (kTma && k_block < len && len - k_block < kN) {
      // The last, partial stage of a sequence: zero the rows past its end that the box brought.
      const int valid = len - k_block;
      uint4* base = reinterpret_cast<uint4*>(smem + kQBytes + slot * kStageBytes);
      for (int c = tid; c < kSlabs * (kN - valid) * 8; c += kThreads) {
        const int sl = c / ((kN - valid) * 8), rest = c - sl * ((kN - valid) * 8);
        base[(sl * kKSlabBytes + (valid + (rest >> 3)) * 128) / 16 + (rest & 7)] = make_uint4(0, 0, 0, 0);
      }
      FenceProxyAsync();
      __syncthreads();
    }
    if (k_block < len) {
      // ---- S partial over this warpgroup's depth half: 18 k-steps of 16.
      float s[16];
#pragma unroll
      for (int k = 0; k < 16; ++k) s[k] = 0.0f;
      FenceRegs(s);
      cute::warpgroup_arrive();
#pragma unroll
      for (int kk = 0; kk < 18; ++kk) {
        const int d0 = wg * 288 + kk * 16;  // depth of this k-step
        const uint32_t in_row = (d0 & 63) * 2;
        WgmmaS(Desc(sq + (d0 >> 6) * kQSlabBytes + in_row, 16, 1024),
               Desc(stage + (d0 >> 6) * kKSlabBytes + in_row, 16, 1024), s,
               std::make_index_sequence<16>{});
      }
      cute::warpgroup_commit_batch();
      cute::warpgroup_wait<0>();  // these scores, and the previous stage's P·V
      FenceRegs(s);
      FenceRegs(o);
      fence_pa();
      // ---- Add the other warpgroup's partial (same register positions, thread-major).
#pragma unroll
      for (int k = 0; k < 16; ++k) sx[(wg * 16 + k) * 128 + t] = s[k];
      ExchangeBarrier();
      issue_next();
#pragma unroll
      for (int k = 0; k < 16; ++k) s[k] += sx[((1 - wg) * 16 + k) * 128 + t];
      // ---- Scale, mask, online softmax. s[n * 4 + e]: row row0 + 8 * (e / 2), key
      // k_block + n * 8 + quad * 2 + e % 2.
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const int32_t g = tile * kM + row0 + half * 8;
        const int32_t j = g / p.h_q;
        const int32_t last_key = min(len - 1, len - p.s_q + j);
        float v[8];
        float mx = -INFINITY;
#pragma unroll
        for (int n = 0; n < 4; ++n) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int32_t key = k_block + n * 8 + quad * 2 + e;
            const float x = key <= last_key ? s[n * 4 + half * 2 + e] * args.scale_log2 : -INFINITY;
            v[n * 2 + e] = x;
            mx = fmaxf(mx, x);
          }
        }
        mx = QuadMax(mx);
        const float m_new = fmaxf(m_run[half], mx);
        const float m_use = m_new == -INFINITY ? 0.0f : m_new;
        const float alpha = exp2f(m_run[half] - m_use);
        m_run[half] = m_new;
        float rs = 0.0f;
#pragma unroll
        for (int k = 0; k < 8; ++k) {
          v[k] = exp2f(v[k] - m_use);
          rs += v[k];
        }
        rs = QuadSum(rs);
        l_run[half] = l_run[half] * alpha + rs;
        if (alpha != 1.0f) {  // the running max moved (rare once it has settled)
#pragma unroll
          for (int n = 0; n < 32; ++n) {
            o[n * 4 + half * 2] *= alpha;
            o[n * 4 + half * 2 + 1] *= alpha;
          }
        }
        // A fragment of k-step ks: keys ks*16 + quad*2 (regs 0/1: rows row0 / row0+8) and
        // + 8 (regs 2/3): n-chunks 2 ks and 2 ks + 1.
        pa[0][half] = PackBf16(v[0], v[1]);
        pa[0][half + 2] = PackBf16(v[2], v[3]);
        pa[1][half] = PackBf16(v[4], v[5]);
        pa[1][half + 2] = PackBf16(v[6], v[7]);
      }
      // ---- O += P V for this warpgroup's 256 columns: keys 16 ks .. +16. Not waited for
      // here: it runs on while the next stage's barrier wait and score wgmmas are issued.
      FenceRegs(o);
      cute::warpgroup_arrive();
#pragma unroll
      for (int ks = 0; ks < 2; ++ks) {
        const uint32_t off = wg * 4 * kKSlabBytes + ks * 16 * 128;
        WgmmaO(pa[ks], Desc(stage + off, kKSlabBytes, 1024), o, std::make_index_sequence<128>{});
      }
      cute::warpgroup_commit_batch();
      fence_pa();
    } else {
      cute::warpgroup_wait<0>();
      FenceRegs(o);
      fence_pa();
      ExchangeBarrier();
      issue_next();
    }
    const bool last = i + 1 == num_blocks || u0 + ((i + 1) >> 1) >= comp_cur.end;
    if (last) {
      cute::warpgroup_wait<0>();
      FenceRegs(o);
      fence_pa();
      finalize(comp_cur);
      reset_state();
    }
  }
  CpAsyncWait<0>();
}

}  // namespace probesidecar::kernels::mla::sm90a
