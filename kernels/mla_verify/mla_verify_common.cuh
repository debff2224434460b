// Shared by the MLA verify tile kernels (portable and sm_90a): launch arguments, cp.async,
// ldmatrix, mma.sync and shuffle helpers, and the cursor that walks a block's range of the
// flattened batch.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_plan.h"

namespace probesidecar::kernels::mla {

inline constexpr int kBlockN = 32;             // keys per pipeline stage
inline constexpr int kSmemStride = 584;        // bf16 per shared row: 576 + 8 (rows 16 B apart
                                               // in bank space: ldmatrix is conflict free)
inline constexpr int kChunksPerRow = kMlaHeadDimQk / 8;  // 16-byte chunks per 576-wide row
inline constexpr int kSStride = kBlockN + 8;   // floats per row of the score exchange buffer
inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kLn2 = 0.6931471805599453f;

// Everything a launch needs, passed by value as a __grid_constant__ parameter.
struct KernelArgs {
  MlaVerifyParams p;
  const int32_t* plan = nullptr;  // device plan (split mode), see mla_verify_plan.h
  float* partial_out = nullptr;   // [slots * rows, 512]
  float* partial_lse = nullptr;   // [slots * rows], log2 domain
  float scale_log2 = 0.0f;        // softmax_scale * log2(e)
};

// ---------------------------------------------------------------------------------------------
// PTX helpers.

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte asynchronous copy; src_bytes = 0 fills the destination with zeros without reading.
// The "memory" clobbers keep the compiler from moving ordinary shared-memory accesses across the
// copy, its commit and its wait (the data the wait makes visible is read by plain loads after it).
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(src_bytes)
               : "memory");
}
__device__ __forceinline__ void CpAsyncCommit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}
template <int kN>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(kN) : "memory");
}

__device__ __forceinline__ void LdMatrixX4(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                           uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t addr, uint32_t& r0, uint32_t& r1,
                                                uint32_t& r2, uint32_t& r3) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
               : "r"(addr));
}

// c += a * b, m16n8k16, bf16 operands, float32 accumulators.
__device__ __forceinline__ void Mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Barrier among the 128 threads of one row group (ids 1..4; 0 is __syncthreads).
__device__ __forceinline__ void RowGroupBarrier(int rg) {
  asm volatile("bar.sync %0, 128;\n" ::"r"(rg + 1));
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

__device__ __forceinline__ float QuadMax(float v) {
  v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
  return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
__device__ __forceinline__ float QuadSum(float v) {
  v += __shfl_xor_sync(0xffffffffu, v, 1);
  return v + __shfl_xor_sync(0xffffffffu, v, 2);
}

// Walks the units of a block's range request by request. In split mode the request boundaries
// come from the plan's prefix; in baseline mode the range is one whole request.
struct RequestCursor {
  const int32_t* cum;  // null in baseline mode
  int32_t r;           // current request
  int32_t begin, end;  // its units [begin, end) in the flattened batch
  int32_t len;         // its length
  const int32_t* table;

  __device__ __forceinline__ void Load(const MlaVerifyParams& p) {
    len = p.cache_seqlens[r];
    table = p.block_table + r * p.block_table_batch_stride;
  }
  __device__ __forceinline__ void Advance(const MlaVerifyParams& p, int32_t u) {
    if (cum == nullptr) return;
    while (u >= end) {
      ++r;
      begin = end;
      end = cum[r + 1];
      Load(p);
    }
  }
};

// The range of units of split-mode block `part` and the request it starts in (a binary search
// of the plan's prefix). Returns false for a block with nothing to do.
__device__ __forceinline__ bool SplitRange(const KernelArgs& args, int32_t part, int32_t* u0,
                                           int32_t* u1, RequestCursor* cur) {
  const int32_t* cum = args.plan + kPlanCum;
  const int32_t per = args.plan[0];
  const int32_t total = args.plan[1];
  *u0 = part * per;
  if (*u0 >= total) return false;
  *u1 = min(total, *u0 + per);
  int32_t lo = 0, hi = args.p.batch - 1;  // the last request with cum[r] <= u0
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) >> 1;
    if (cum[mid] <= *u0) lo = mid; else hi = mid - 1;
  }
  *cur = {cum, lo, cum[lo], cum[lo + 1], 0, nullptr};
  cur->Load(args.p);
  return true;
}

// Where a finished request's rows go: straight to out / lse, or to partial slot `slot`.
__device__ __forceinline__ bool PartialSlot(const KernelArgs& args, const RequestCursor& cur,
                                            int32_t part, int64_t* slot) {
  const int32_t per = args.plan[0];
  if (NumSplits(cur.begin, cur.end, per) < 2) return false;
  const int32_t* slot_base = args.plan + kPlanCum + args.p.batch + 1;
  *slot = slot_base[cur.r] + (part - FirstPart(cur.begin, per));
  return true;
}

}  // namespace probesidecar::kernels::mla
