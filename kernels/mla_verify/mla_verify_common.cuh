// Shared by the MLA verify kernels and not by other kernels (those are in kernels/blocks): launch
// arguments, shuffle helpers, the cursor that walks a block's range of the flattened batch (the
// range setup, both tile kernels), where a finished request's rows go, and the combine's store.
// Each tile kernel writes its finished rows itself: the two hold O in different fragment layouts,
// and a shared writer would change the register allocation of the sm_90a kernel, which runs at
// the 255-register limit (about 870 instructions of its main loop differ in SASS).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/blocks/online_softmax.cuh"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/mla_verify/mla_verify_plan.h"

namespace probesidecar::kernels::mla {

// kBlockN, kSmemStride, kSStride: mla_verify_plan.h (the planner sizes tiles from them).
inline constexpr int kChunksPerRow = kMlaHeadDimQk / 8;  // 16-byte chunks per 576-wide row

// Everything a launch needs, passed by value as a __grid_constant__ parameter.
struct KernelArgs {
  MlaVerifyParams p;
  const int32_t* plan = nullptr;  // device plan (split mode), see mla_verify_plan.h
  // Non-null: the sm_90a attention kernel plans in block (PlanInBlock; no plan kernel ran), and
  // block (0, 0) stores its plan here (the workspace's plan) for the combine after it.
  int32_t* plan_store = nullptr;
  float* partial_out = nullptr;   // [slots * rows, 512]
  float* partial_lse = nullptr;   // [slots * rows], log2 domain
  float scale_log2 = 0.0f;        // softmax_scale * log2(e)
};

// ---------------------------------------------------------------------------------------------
// PTX helpers.

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
// of the plan's prefix; `plan`: the workspace's, or the block's own). Returns false for a block
// with nothing to do.
__device__ __forceinline__ bool SplitRange(const KernelArgs& args, const int32_t* plan,
                                           int32_t part, int32_t* u0, int32_t* u1,
                                           RequestCursor* cur) {
  const int32_t* cum = plan + kPlanCum;
  const int32_t per = plan[0];
  const int32_t total = plan[1];
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

// Where the rows of finished request r (units [begin, end) of the flattened batch, `per` units a
// range) go from range `part`: straight to out / lse (false), or (true) to partial slot *slot,
// when the request spans several ranges.
__device__ __forceinline__ bool PartialSlot(const KernelArgs& args, const int32_t* plan,
                                            int32_t per, int32_t r, int32_t begin, int32_t end,
                                            int32_t part, int64_t* slot) {
  if (NumSplits(begin, end, per) < 2) return false;
  const int32_t* slot_base = plan + kPlanCum + args.p.batch + 1;
  *slot = slot_base[r] + (part - FirstPart(begin, per));
  return true;
}

// The plan of a batch of at most kBlockPlanMaxBatch requests over `num_parts` ranges, as the plan
// kernel makes it, into `plan` (shared, PlanInts(kBlockPlanMaxBatch) entries) by the block's
// first warp, one request a lane; block (0, 0) also stores it to args.plan_store. Every thread
// calls it after the grid-dependency wait (the lengths are read); it ends with __syncthreads.
__device__ __forceinline__ void MakeBlockPlan(const KernelArgs& args, int32_t num_parts,
                                              int32_t* plan) {
  const int32_t batch = args.p.batch;
  if (threadIdx.x < 32) {
    const int lane = static_cast<int>(threadIdx.x);
    const bool is_request = lane < batch;
    const int32_t units = is_request ? UnitsOf(args.p.cache_seqlens[lane]) : 0;
    int32_t cum_end = units;  // inclusive prefix of the units
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, cum_end, d);
      if (lane >= d) cum_end += y;
    }
    const int32_t cum_begin = cum_end - units;
    const int32_t total = __shfl_sync(0xffffffffu, cum_end, 31);
    const int32_t per = UnitsPerPart(total, num_parts);
    int32_t splits = is_request ? NumSplits(cum_begin, cum_end, per) : 0;
    if (splits < 2) splits = 0;
    int32_t slots_end = splits, listed_end = splits > 0 ? 1 : 0;  // inclusive prefixes
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
      const int32_t y = __shfl_up_sync(0xffffffffu, slots_end, d);
      const int32_t z = __shfl_up_sync(0xffffffffu, listed_end, d);
      if (lane >= d) {
        slots_end += y;
        listed_end += z;
      }
    }
    const int32_t listed = __shfl_sync(0xffffffffu, listed_end, 31);
    int32_t* const out[2] = {plan, args.plan_store};
    const int copies = blockIdx.x == 0 && blockIdx.y == 0 ? 2 : 1;
    for (int c = 0; c < copies; ++c) {
      int32_t* q = out[c];
      if (is_request) {
        q[kPlanCum + lane] = cum_begin;
        q[kPlanCum + batch + 1 + lane] = splits > 0 ? slots_end - splits : -1;
        if (splits > 0) q[kPlanCum + 2 * batch + 1 + listed_end - 1] = lane;
      }
      if (lane == 0) {
        q[kPlanCum + batch] = total;
        q[0] = per;
        q[1] = total;
        q[2] = num_parts;
        q[3] = batch;
        q[4] = listed;
      }
    }
  }
  __syncthreads();
}

// Four float32 values times `scale` as bf16 to dst (8-byte aligned).
__device__ __forceinline__ void StoreBf16x4(__nv_bfloat16* dst, float4 v, float scale) {
  const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x * scale, v.y * scale);
  const __nv_bfloat162 hi = __floats2bfloat162_rn(v.z * scale, v.w * scale);
  uint2 packed;
  packed.x = *reinterpret_cast<const uint32_t*>(&lo);
  packed.y = *reinterpret_cast<const uint32_t*>(&hi);
  *reinterpret_cast<uint2*>(dst) = packed;
}

}  // namespace probesidecar::kernels::mla
