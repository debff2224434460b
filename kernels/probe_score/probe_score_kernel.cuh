// Device code for probe scoring: the CUDA-core fused kernel (fused_cuda), the tensor-core fused
// kernel (fused_tc), and the gather / epilogue kernels around cuBLAS (gather_gemm). Launchers
// and the choice of tile shapes live in probe_score.cu; this header is included only there and
// in the explicit-instantiation files.
//
// Everything a request changes is read from device memory (ProbeScoreDeviceArgs, rows), so
// the grids depend only on the launch shape (max_rows, P, H): one captured graph serves every
// request of its shape. Rows past args->num_rows are never read for output and never written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/probe_score/probe_score.h"

namespace probesidecar::kernels::probe_score_detail {

// ------------------------------------------------------------------------------------------
// Parameters (plain structs, passed as __grid_constant__ const).

// Weights are stored padded: rows to a multiple of kProbePad (zeros), columns to a multiple of
// kHiddenPad (zeros), so tensor-core tiles never need bounds checks on W.
inline constexpr int kProbePad = 128;
inline constexpr int kHiddenPad = 64;

struct FusedCudaParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // device, one struct
  const int32_t* rows = nullptr;               // [max_rows]
  const float* weight = nullptr;               // [p_pad, w_row_stride] fp32, zero padded
  const float* bias = nullptr;                 // [P]
  float* partial = nullptr;     // [splits, max_rows, probe_tiles * kPT] fp32 (splits > 1 only)
  int32_t* counters = nullptr;  // [probe_tiles * row_groups], zero between launches
  int32_t max_rows = 0;
  int32_t hidden = 0;        // H
  int32_t num_probes = 0;    // P
  int32_t w_row_stride = 0;  // elements, multiple of kHiddenPad
  int32_t splits = 1;        // K splits (gridDim.y)
  int32_t k_per_split = 0;   // elements, a multiple of the chunk granularity (32 * vector)
  int32_t k_per_smem = 0;    // elements of W held in shared memory at once (same multiple)
  int32_t row_groups = 0;    // gridDim.x; block g handles row blocks g, g + row_groups, ...
  int32_t probe_tiles = 0;   // gridDim.z
  int32_t activation = 0;    // Activation
};

struct TcParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // device, one struct
  const int32_t* rows = nullptr;               // [max_rows]
  const void* weight = nullptr;  // [p_pad, w_row_stride] bf16/fp16 (the activation dtype)
  const float* bias = nullptr;   // [P]
  float* partial = nullptr;      // [splits, partial_rows, partial_ld] fp32 (splits > 1 only)
  int32_t partial_rows = 0;      // m_tiles * BM
  int32_t partial_ld = 0;        // n_tiles * BN, elements
  int32_t max_rows = 0;
  int32_t hidden = 0;        // H, a multiple of 8
  int32_t num_probes = 0;    // P
  int32_t w_row_stride = 0;  // elements, multiple of kHiddenPad
  int32_t k_tiles = 0;       // ceil(H / BK)
  int32_t splits = 1;        // gridDim.z
  int32_t activation = 0;
};

// The split-K reduction of fused_tc: a second kernel, so the sum runs in split order on every
// SM at once (deterministic, no counters) instead of in one last-arriving CTA.
struct SplitKReduceParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // device
  const float* partial = nullptr;              // [splits, partial_rows, partial_ld]
  const float* bias = nullptr;                 // [P]
  int32_t splits = 0;
  int32_t partial_rows = 0;
  int32_t partial_ld = 0;
  int32_t max_rows = 0;
  int32_t num_probes = 0;
  int32_t activation = 0;
};

struct GatherParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // device
  const int32_t* rows = nullptr;               // [max_rows]
  void* staging = nullptr;                     // [chunk_rows, hidden] x dtype, contiguous
  int32_t hidden = 0;
  int32_t row_begin = 0;  // first output row of this chunk
  int32_t chunk_rows = 0;
};

struct EpilogueParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // device
  const float* c = nullptr;     // [chunk_rows, ldc] fp32, the GEMM result for rows row_begin..
  int32_t ldc = 0;              // elements
  const float* bias = nullptr;  // [P]
  int32_t num_probes = 0;
  int32_t row_begin = 0;
  int32_t chunk_rows = 0;
  int32_t activation = 0;
};

// ------------------------------------------------------------------------------------------
// Small device helpers.

__device__ __forceinline__ float Activate(int activation, float v) {
  return activation == static_cast<int>(Activation::kSigmoid) ? 1.0f / (1.0f + expf(-v)) : v;
}

template <typename T>
struct Elem;
template <>
struct Elem<float> {
  static constexpr int kVec = 4;  // elements per 16-byte load
  __device__ __forceinline__ static float Load(const float* p) { return __ldg(p); }
  // Elements 4q .. 4q + 3 of a raw chunk.
  __device__ __forceinline__ static void UnpackQuad(const uint4& v, int /*q*/, float (&f)[4]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
  __device__ __forceinline__ static void Unpack(const uint4& v, float (&f)[kVec]) {
    f[0] = __uint_as_float(v.x);
    f[1] = __uint_as_float(v.y);
    f[2] = __uint_as_float(v.z);
    f[3] = __uint_as_float(v.w);
  }
};
template <>
struct Elem<__nv_bfloat16> {
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float Load(const __nv_bfloat16* p) {
    return __uint_as_float(static_cast<uint32_t>(__ldg(reinterpret_cast<const uint16_t*>(p)))
                           << 16);
  }
  __device__ __forceinline__ static void UnpackQuad(const uint4& v, int q, float (&f)[4]) {
    const uint32_t lo = q == 0 ? v.x : v.z, hi = q == 0 ? v.y : v.w;
    f[0] = __uint_as_float(lo << 16);
    f[1] = __uint_as_float(lo & 0xffff0000u);
    f[2] = __uint_as_float(hi << 16);
    f[3] = __uint_as_float(hi & 0xffff0000u);
  }
  __device__ __forceinline__ static void Unpack(const uint4& v, float (&f)[kVec]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      f[2 * i] = __uint_as_float(w[i] << 16);
      f[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};
template <>
struct Elem<__half> {
  static constexpr int kVec = 8;
  __device__ __forceinline__ static float Load(const __half* p) {
    return __half2float(__ushort_as_half(__ldg(reinterpret_cast<const uint16_t*>(p))));
  }
  __device__ __forceinline__ static void UnpackQuad(const uint4& v, int q, float (&f)[4]) {
    const uint32_t lo = q == 0 ? v.x : v.z, hi = q == 0 ? v.y : v.w;
    const float2 a = __half22float2(*reinterpret_cast<const __half2*>(&lo));
    const float2 b = __half22float2(*reinterpret_cast<const __half2*>(&hi));
    f[0] = a.x;
    f[1] = a.y;
    f[2] = b.x;
    f[3] = b.y;
  }
  __device__ __forceinline__ static void Unpack(const uint4& v, float (&f)[kVec]) {
    const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 t = __half22float2(*reinterpret_cast<const __half2*>(&w[i]));
      f[2 * i] = t.x;
      f[2 * i + 1] = t.y;
    }
  }
};

// 16-byte streaming load: activations are read once, so keep them out of L1.
__device__ __forceinline__ uint4 LdStream16(const void* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

// cp.async (16 bytes, zero-filled when !valid), its groups, and ldmatrix.
__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(src_size)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

// Whether 16-byte vector loads of every row are legal: base pointer and row pitch 16-byte
// aligned. Rows of an odd stride or at an odd offset are only 2-byte aligned.
template <typename T>
__device__ __forceinline__ bool RowsAre16ByteAligned(const ProbeScoreDeviceArgs& a) {
  return (reinterpret_cast<uintptr_t>(a.x) % 16 == 0) &&
         ((a.x_row_stride * static_cast<int64_t>(sizeof(T))) % 16 == 0);
}

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

// ------------------------------------------------------------------------------------------
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
inline constexpr int kFusedThreads = 256;
inline constexpr int kFusedRowsPerWarp = 4;
inline constexpr int kFusedRowsPerBlock = 32;

template <typename T, int kPT>
__global__ void __launch_bounds__(kFusedThreads, 2)
    FusedCudaKernel(const __grid_constant__ FusedCudaParams p) {
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
      CpAsync16(SmemAddr(w_s + 4 * i),
                in ? static_cast<const void*>(
                         p.weight + static_cast<int64_t>(probe0 + pp) * p.w_row_stride + kb + kk)
                   : static_cast<const void*>(p.weight),
                in);
    }
    CpAsyncCommit();
  };

  // What does not depend on the request goes first, so that its latency overlaps the read of
  // the arguments: the W slice and the row indices of the first row block (read speculatively
  // up to max_rows; indices past num_rows are never dereferenced).
  if (num_sub == 1) load_w(k_begin);
  int32_t row_idx[kFusedRowsPerWarp];
  {
    const int r0 = g * kFusedRowsPerBlock + warp * kFusedRowsPerWarp;
#pragma unroll
    for (int i = 0; i < kFusedRowsPerWarp; ++i) {
      row_idx[i] = __ldg(p.rows + min(r0 + i, p.max_rows - 1));
    }
  }
  const ProbeScoreDeviceArgs a = *p.args;
  const int num_rows = min(a.num_rows, p.max_rows);
  const int row_blocks = (num_rows + kFusedRowsPerBlock - 1) / kFusedRowsPerBlock;
  if (g >= row_blocks) {  // every split of this row group leaves too: counter untouched
    CpAsyncWait<0>();
    return;
  }
  const bool vec_ok = RowsAre16ByteAligned<T>(a);
  const T* x = static_cast<const T*>(a.x);
  if (num_sub == 1) {
    CpAsyncWait<0>();
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
      const int rn = (rb + p.row_groups) * kFusedRowsPerBlock + warp * kFusedRowsPerWarp;
#pragma unroll
      for (int i = 0; i < kFusedRowsPerWarp; ++i) {
        row_idx[i] = __ldg(p.rows + min(rn + i, p.max_rows - 1));
      }
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
        CpAsyncWait<0>();
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
                Activate(p.activation, acc[i] + __ldg(p.bias + probe));
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
          Activate(p.activation, sum + __ldg(p.bias + probe));
    }
  }
  if (threadIdx.x == 0) *counter = 0;
}

// ------------------------------------------------------------------------------------------
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

template <typename T>
__device__ __forceinline__ void Mma16816(float (&d)[4], const uint32_t (&a)[4],
                                         const uint32_t (&b)[2]) {
  if constexpr (std::is_same_v<T, __nv_bfloat16>) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, "
        "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
}

template <int kBM, int kBN, int kBK, int kWM, int kWN, int kStages>
struct TcShape {
  static constexpr int kThreads = kWM * kWN * 32;
  static constexpr int kWarpM = kBM / kWM;  // rows per warp
  static constexpr int kWarpN = kBN / kWN;  // probes per warp
  static constexpr int kMT = kWarpM / 16;
  static constexpr int kNT = kWarpN / 8;
  static constexpr int kChunks = kBK / 8;    // 16-byte chunks per smem row
  static constexpr int kAStage = kBM * kBK;  // elements
  static constexpr int kBStage = kBN * kBK;
  static constexpr int kSmemBytes = kStages * (kAStage + kBStage) * 2;
  static constexpr int kRowsPerPass = kThreads / kChunks;  // rows one pass of chunks covers
  static constexpr int kAIters = kBM / kRowsPerPass;
  static constexpr int kBIters = kBN / kRowsPerPass;
  static_assert(kWarpM % 16 == 0 && kWarpN % 16 == 0, "warp tile must be 16 x 16 multiples");
  static_assert(kChunks >= 8 && kThreads % kChunks == 0, "the swizzle needs >= 8 chunks a row");
  static_assert(kBM % kRowsPerPass == 0 && kBN % kRowsPerPass == 0, "tile rows per pass");
};

template <typename T, int kBM, int kBN, int kBK, int kWM, int kWN, int kStages>
__global__ void __launch_bounds__(kWM* kWN * 32) FusedTcKernel(const __grid_constant__ TcParams p) {
  using S = TcShape<kBM, kBN, kBK, kWM, kWN, kStages>;
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
    for (int i = 0; i < S::kBIters; ++i) {
      const int r = row0 + i * S::kRowsPerPass;
      T* dst = sb + stage * S::kBStage + r * kBK + ((chunk ^ (r & 7)) * 8);
      CpAsync16(
          SmemAddr(dst),
          w_in ? static_cast<const void*>(w + static_cast<int64_t>(n0 + r) * p.w_row_stride + k)
               : p.weight,
          w_in);
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
#pragma unroll
  for (int i = 0; i < S::kAIters; ++i) {
    row_idx[i] = __ldg(p.rows + min(m0 + row0 + i * S::kRowsPerPass, p.max_rows - 1));
  }

  const ProbeScoreDeviceArgs a = *p.args;
  const int num_rows = min(a.num_rows, p.max_rows);
  if (m0 >= num_rows) {
    CpAsyncWait<0>();
    return;
  }
  const bool vec_ok = RowsAre16ByteAligned<T>(a);
  const T* x = static_cast<const T*>(a.x);
  const T* a_row[S::kAIters];
  bool a_valid[S::kAIters];
#pragma unroll
  for (int i = 0; i < S::kAIters; ++i) {
    a_valid[i] = m0 + row0 + i * S::kRowsPerPass < num_rows;
    a_row[i] = a_valid[i] ? x + static_cast<int64_t>(row_idx[i]) * a.x_row_stride : x;
  }

  auto load_a = [&](int stage, int kt) {
    const int k = kt * kBK + chunk * 8;
    const bool k_in = k < p.hidden;  // H % 8 == 0: a chunk is wholly in or out
#pragma unroll
    for (int i = 0; i < S::kAIters; ++i) {
      const int r = row0 + i * S::kRowsPerPass;
      T* dst = sa + stage * S::kAStage + r * kBK + ((chunk ^ (r & 7)) * 8);
      const bool valid = a_valid[i] && k_in;
      if (vec_ok) {
        CpAsync16(SmemAddr(dst), valid ? static_cast<const void*>(a_row[i] + k) : p.weight, valid);
      } else {
        uint32_t h[8];
        const uint16_t* src = reinterpret_cast<const uint16_t*>(a_row[i] + k);
#pragma unroll
        for (int e = 0; e < 8; ++e) h[e] = valid ? __ldg(src + e) : 0u;
        *reinterpret_cast<uint4*>(dst) = make_uint4(h[0] | (h[1] << 16), h[2] | (h[3] << 16),
                                                    h[4] | (h[5] << 16), h[6] | (h[7] << 16));
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
    CpAsyncCommit();
  }

  for (int it = 0; it < nkt; ++it) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();
    const int next = it + kStages - 1;
    if (next < nkt) {
      load_a(next % kStages, kt_begin + next);
      load_b(next % kStages, kt_begin + next);
    }
    CpAsyncCommit();

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
        LdMatrixX4(af[mt], SmemAddr(sa_st + r * kBK + ((c ^ (r & 7)) * 8)));
      }
#pragma unroll
      for (int np = 0; np < S::kNT / 2; ++np) {
        const int r = warp_n * S::kWarpN + np * 16 + (lane / 16) * 8 + (lane % 8);
        const int c = kk * 2 + (lane / 8) % 2;
        uint32_t t[4];
        LdMatrixX4(t, SmemAddr(sb_st + r * kBK + ((c ^ (r & 7)) * 8)));
        bf[2 * np][0] = t[0];
        bf[2 * np][1] = t[1];
        bf[2 * np + 1][0] = t[2];
        bf[2 * np + 1][1] = t[3];
      }
#pragma unroll
      for (int mt = 0; mt < S::kMT; ++mt)
#pragma unroll
        for (int nt = 0; nt < S::kNT; ++nt) Mma16816<T>(acc[mt][nt], af[mt], bf[nt]);
    }
  }
  CpAsyncWait<0>();

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
        if (p.splits == 1) {
          float* o = a.out + static_cast<int64_t>(row) * a.out_row_stride;
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            if (col + e < p.num_probes) {
              o[col + e] = Activate(p.activation, acc[mt][nt][2 * h + e] + __ldg(p.bias + col + e));
            }
          }
        } else {
          float* o =
              p.partial + (static_cast<int64_t>(split) * p.partial_rows + row) * p.partial_ld + col;
          __stcg(reinterpret_cast<float2*>(o),
                 make_float2(acc[mt][nt][2 * h], acc[mt][nt][2 * h + 1]));
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
      Activate(p.activation, sum + __ldg(p.bias + probe));
}

// ------------------------------------------------------------------------------------------
// gather_gemm helpers.

// Grid chunk_rows / 8, block 256 = 8 warps, one row per warp: staging[r] = x[rows[row_begin+r]]
// for the rows below num_rows (the others are left as they are: the epilogue never reads them).
template <typename T>
__global__ void __launch_bounds__(256) GatherRowsKernel(const __grid_constant__ GatherParams p) {
  constexpr int kVec = Elem<T>::kVec;
  const ProbeScoreDeviceArgs a = *p.args;
  const int local = blockIdx.x * 8 + threadIdx.x / 32;
  const int row = p.row_begin + local;
  const int lane = threadIdx.x % 32;
  if (local >= p.chunk_rows || row >= a.num_rows) return;
  const T* src =
      static_cast<const T*>(a.x) + static_cast<int64_t>(__ldg(p.rows + row)) * a.x_row_stride;
  T* dst = static_cast<T*>(p.staging) + static_cast<int64_t>(local) * p.hidden;
  const bool vec_ok = RowsAre16ByteAligned<T>(a) && p.hidden % kVec == 0;
  if (vec_ok) {
    const int n = p.hidden / kVec;
    int c = lane;
    for (; c + 96 < n; c += 128) {  // 4 loads in flight per lane
      uint4 v[4];
#pragma unroll
      for (int u = 0; u < 4; ++u) v[u] = LdStream16(src + (c + 32 * u) * kVec);
#pragma unroll
      for (int u = 0; u < 4; ++u) reinterpret_cast<uint4*>(dst)[c + 32 * u] = v[u];
    }
    for (; c < n; c += 32) reinterpret_cast<uint4*>(dst)[c] = LdStream16(src + c * kVec);
  } else {
    for (int h = lane; h < p.hidden; h += 32) dst[h] = src[h];
  }
}

// Grid ceil(chunk_rows * P / kThreads), block kThreads: out = act(c + bias) for the rows below
// num_rows.
template <int kThreads>
__global__ void __launch_bounds__(kThreads)
    GemmEpilogueKernel(const __grid_constant__ EpilogueParams p) {
  const ProbeScoreDeviceArgs a = *p.args;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * kThreads + threadIdx.x;
  const int local = static_cast<int>(idx / p.num_probes);
  const int probe = static_cast<int>(idx % p.num_probes);
  const int row = p.row_begin + local;
  if (local >= p.chunk_rows || row >= a.num_rows) return;
  a.out[static_cast<int64_t>(row) * a.out_row_stride + probe] =
      Activate(p.activation,
               __ldcg(p.c + static_cast<int64_t>(local) * p.ldc + probe) + __ldg(p.bias + probe));
}

}  // namespace probesidecar::kernels::probe_score_detail
