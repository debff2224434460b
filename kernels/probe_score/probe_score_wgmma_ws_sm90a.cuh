// gather_wgmma, warp-specialised (the "128x256ws" configuration, fast precision, no split):
// one producer warpgroup feeds two consumer warpgroups through an mbarrier ring, so that the
// tensor cores never wait for a block-wide barrier. Compiled only for sm_90a
// (probe_score_wgmma_sm90a.cu), next to the plain multistage kernel whose tile and shared
// layout it shares (probe_score_wgmma_sm90a.cuh).
//
// Block 384 threads = 3 warpgroups, a 128 x 256 output tile, K in 64-deep tiles through
// kWsStages stages of (A 128 x 64, B 256 x 64), both 128-byte swizzled.
//   producer (warpgroup 0): per tile, one thread expects B's bytes on the
//     stage's "full" barrier and brings B (W rows n0 .. n0 + 255, K columns kt * 64 ..) in with
//     one TMA box; all 128 threads gather A (8 rows x 16 bytes each) with cp.async and arrive on
//     the same barrier when their copies land (cp.async.mbarrier.arrive.noinc). Before refilling
//     a stage it waits for the stage's "empty" barrier.
//   consumers (warpgroups 1, 2): wait "full", make the cp.async bytes visible to
//     the async proxy, issue 4 wgmma m64n256k16 (rows 64 (w - 1) ..), keep one batch in flight,
//     and release the previous stage on "empty" (every consumer thread arrives).
#pragma once

#include <cuda.h>
#include <cutlass/arch/barrier.h>

#include <cute/arch/copy_sm90_tma.hpp>

#include "kernels/probe_score/probe_score_wgmma_sm90a.cuh"

namespace probesidecar::kernels::probe_score_detail::sm90a {

inline constexpr int kWsStages = 4;
inline constexpr int kWsBN = 256;
inline constexpr int kWsBM = 128;
inline constexpr int kWsThreads = 384;
inline constexpr int kWsABytes = kWsBM * kSlabRowBytes;      // 16 KB
inline constexpr int kWsBBytes = kWsBN * kSlabRowBytes;      // 32 KB
inline constexpr int kWsStageBytes = kWsABytes + kWsBBytes;  // 48 KB
inline constexpr int kWsBarrierBytes = 128;                  // 2 x kWsStages mbarriers
inline constexpr int kWsSmemBytes = 1024 + kWsStages * kWsStageBytes + kWsBarrierBytes;

// The launch arguments plus W's tensor map (a __grid_constant__ parameter, as TMA needs): W as a
// 2-D tensor [w_rows, w_row_stride] of the activations' type, boxes of 256 rows x 64 columns,
// 128-byte swizzle.
struct WsArgs {
  CUtensorMap w_map;
  TcParams p;
};

template <typename T>
__global__ void __launch_bounds__(kWsThreads, 1)
    GatherWgmmaWsKernel(const __grid_constant__ WsArgs args) {
  // What follows (the probe-outcome count, a programmatic dependent) may be scheduled now: it
  // waits for this whole grid before reading. Triggered by every block, it launches during the
  // last wave.
  blocks::GridDependencyTrigger();
  using Op = typename WgmmaOp<T, kWsBN>::type;
  constexpr int kAcc = kWsBN / 2;
  const TcParams& p = args.p;
  extern __shared__ __align__(128) uint8_t ws_smem_raw[];
  uint8_t* smem = ws_smem_raw + blocks::SwizzleAtomPadding(blocks::SmemAddr(ws_smem_raw));
  const uint32_t s0 = blocks::SmemAddr(smem);
  uint64_t* full = reinterpret_cast<uint64_t*>(smem + kWsStages * kWsStageBytes);
  uint64_t* empty = full + kWsStages;
  const int tid = threadIdx.x;
  if (tid == 0) {
    for (int s = 0; s < kWsStages; ++s) {
      cutlass::arch::ClusterBarrier::init(&full[s], 128 + 1);  // A's threads + B's expect_tx
      cutlass::arch::ClusterBarrier::init(&empty[s], 256);     // every consumer thread
    }
    cutlass::arch::fence_barrier_init();
  }
  __syncthreads();

  const int n0 = blockIdx.x * kWsBN, m0 = blockIdx.y * kWsBM;
  const int nkt = p.k_tiles;
  const ProbeScoreDeviceArgs a = *p.args;
  const int num_rows = min(a.num_rows, p.max_rows);
  if (m0 >= num_rows) return;  // every thread leaves: no barrier is waited on

  if (tid < 128) {
    // ---- Producer.
    const int chunk = tid & 7, row0 = tid >> 3;  // rows row0 + 16 i, i < 8
    const bool vec_ok = blocks::RowsAre16ByteAligned<T>(a.x, a.x_row_stride);
    const T* x = static_cast<const T*>(a.x);
    const T* a_row[8];
    uint32_t valid_mask = 0;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int r = m0 + row0 + 16 * i;
      const bool ok = r < num_rows;
      valid_mask |= ok ? 1u << i : 0u;
      a_row[i] = ok ? x + static_cast<int64_t>(__ldg(p.rows + r)) * a.x_row_stride : x;
    }
    for (int it = 0; it < nkt; ++it) {
      const int s = it % kWsStages;
      if (it >= kWsStages)
        cutlass::arch::ClusterBarrier::wait(&empty[s], ((it / kWsStages) + 1) & 1);
      const uint32_t stage = s0 + s * kWsStageBytes;
      if (tid == 0) {
        cutlass::arch::ClusterTransactionBarrier::arrive_and_expect_tx(&full[s], kWsBBytes);
        cute::SM90_TMA_LOAD_2D::copy(&args.w_map, &full[s],
                                     static_cast<uint64_t>(cute::TMA::CacheHintSm90::EVICT_LAST),
                                     smem + s * kWsStageBytes + kWsABytes, it * kBK, n0);
      }
      const int k = it * kBK + chunk * 8;
      const bool k_in = k < p.hidden;  // H % 8 == 0: a chunk is wholly in or out
      if (vec_ok) {
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int r = row0 + 16 * i;
          const bool ok = k_in && (valid_mask >> i & 1u);
          blocks::CpAsync16(stage + blocks::Swizzle128Offset(r, chunk),
                            ok ? static_cast<const void*>(a_row[i] + k) : p.weight, ok);
        }
        cutlass::arch::cpasync_barrier_arrive_noinc(&full[s]);
      } else {  // rows only 2-byte aligned: element loads, stored, fenced, then a plain arrive
#pragma unroll
        for (int i = 0; i < 8; ++i) {
          const int r = row0 + 16 * i;
          const bool ok = k_in && (valid_mask >> i & 1u);
          *reinterpret_cast<uint4*>(smem + s * kWsStageBytes + blocks::Swizzle128Offset(r, chunk)) =
              blocks::Load16BytesBy2(a_row[i] + k, ok);
        }
        blocks::FenceProxyAsyncShared();
        cutlass::arch::ClusterBarrier::arrive(&full[s]);
      }
    }
    blocks::CpAsyncWait<0>();  // leave only once the copies have landed
    return;
  }

  // ---- Consumers.
  const int wg = (tid >> 7) - 1;
  float acc[kAcc];
#pragma unroll
  for (int i = 0; i < kAcc; ++i) acc[i] = 0.0f;
  for (int it = 0; it < nkt; ++it) {
    const int s = it % kWsStages;
    cutlass::arch::ClusterBarrier::wait(&full[s], (it / kWsStages) & 1);
    blocks::FenceProxyAsyncShared();  // the producer's cp.async bytes, for the async proxy's reads
    const uint32_t a_base = s0 + s * kWsStageBytes + wg * 64 * kSlabRowBytes;
    const uint32_t b_base = s0 + s * kWsStageBytes + kWsABytes;
    blocks::FenceOperands(acc);
    cute::warpgroup_arrive();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      blocks::WgmmaSS<Op>(blocks::SwizzledKMajorDesc(a_base + kk * 32),
                          blocks::SwizzledKMajorDesc(b_base + kk * 32), acc);
    }
    cute::warpgroup_commit_batch();
    cute::warpgroup_wait<1>();  // the previous batch is done: its stage goes back
    blocks::FenceOperands(acc);
    if (it > 0) cutlass::arch::ClusterBarrier::arrive(&empty[(it - 1) % kWsStages]);
  }
  cute::warpgroup_wait<0>();
  blocks::FenceOperands(acc);

  // Epilogue: the wgmma accumulator layout (probe_score_wgmma_sm90a.cuh), bias and activation.
  const int lane = tid & 31, warp_in_wg = (tid & 127) >> 5;
  const int row_base = m0 + wg * 64 + warp_in_wg * 16 + lane / 4;
#pragma unroll
  for (int j = 0; j < kWsBN / 8; ++j) {
    const int col = n0 + 8 * j + 2 * (lane & 3);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int row = row_base + 8 * h;
      if (row >= num_rows) continue;
      float* o = a.out + static_cast<int64_t>(row) * a.out_row_stride;
      blocks::StoreBiasActivated(o, col, p.num_probes, acc[4 * j + 2 * h], p.bias,
                                 IsSigmoid(p.activation));
      blocks::StoreBiasActivated(o, col + 1, p.num_probes, acc[4 * j + 2 * h + 1], p.bias,
                                 IsSigmoid(p.activation));
    }
  }
}

}  // namespace probesidecar::kernels::probe_score_detail::sm90a
