#include <cmath>

#include "kernels/verify_support/verify_support.h"

namespace probesidecar::kernels {
namespace {

constexpr int kPageSize = 64;
constexpr int kDimV = 512;

// Grid: one block (128 threads) per request.
__global__ void CheckVerifyInputsKernel(const VerifyInputCheckParams p) {
  const int i = blockIdx.x;
  const int32_t length = p.cache_seqlens[i];
  __shared__ int bad;
  if (threadIdx.x == 0) {
    bad = length < p.s_q || length < 1 ||
          static_cast<int64_t>(length) > static_cast<int64_t>(p.max_pages) * kPageSize;
  }
  __syncthreads();
  if (!bad) {
    const int32_t pages = (length + kPageSize - 1) / kPageSize;
    const int32_t* row = p.block_table + static_cast<int64_t>(i) * p.table_batch_stride;
    bool mine = false;
    for (int32_t k = threadIdx.x; k < pages; k += blockDim.x) {
      const int32_t page = row[k];
      mine |= page < 0 || page >= p.num_pages;
    }
    if (mine) bad = 1;  // benign race: every writer writes 1
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    p.safe_seqlens[i] = bad ? 0 : length;
    p.invalid[i] = bad ? 1 : 0;
  }
}

// Grid: one block of 256 threads: counts the flags (after the check kernel, same stream).
__global__ void CountInvalidKernel(const uint8_t* invalid, int32_t batch, uint32_t* counts) {
  __shared__ int total;
  if (threadIdx.x == 0) total = 0;
  __syncthreads();
  int mine = 0;
  for (int i = threadIdx.x; i < batch; i += blockDim.x) mine += invalid[i];
  if (mine != 0) atomicAdd(&total, mine);
  __syncthreads();
  if (threadIdx.x == 0) {
    counts[0] += static_cast<uint32_t>(total);
    counts[1] = static_cast<uint32_t>(total);
  }
}

// Grid: one block (256 threads) per request.
__global__ void PoisonVerifyKernel(const VerifyPoisonParams p) {
  const int i = blockIdx.x;
  if (p.invalid[i] == 0) return;
  const __nv_bfloat16 nan = __float2bfloat16(NAN);
  for (int row = 0; row < p.s_q * p.h_q; ++row) {
    const int j = row / p.h_q, h = row % p.h_q;
    __nv_bfloat16* o =
        p.out + i * p.out_batch_stride + j * p.out_token_stride + h * p.out_head_stride;
    for (int d = threadIdx.x; d < kDimV; d += blockDim.x) o[d] = nan;
    if (p.lse != nullptr && threadIdx.x == 0) {
      p.lse[i * p.lse_batch_stride + h * p.lse_head_stride + j] = NAN;
    }
  }
}

__device__ void Merge(VerifyCompareResult& into, const VerifyCompareResult& r) {
  into.max_abs_error = fmax(into.max_abs_error, r.max_abs_error);
  into.sum_sq_diff += r.sum_sq_diff;
  into.sum_sq_ref += r.sum_sq_ref;
  into.compared += r.compared;
  into.mismatched += r.mismatched;
}

__device__ VerifyCompareResult WarpReduce(VerifyCompareResult r) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    VerifyCompareResult o;
    o.max_abs_error = __shfl_down_sync(0xffffffffu, r.max_abs_error, offset);
    o.sum_sq_diff = __shfl_down_sync(0xffffffffu, r.sum_sq_diff, offset);
    o.sum_sq_ref = __shfl_down_sync(0xffffffffu, r.sum_sq_ref, offset);
    o.compared = __shfl_down_sync(0xffffffffu, r.compared, offset);
    o.mismatched = __shfl_down_sync(0xffffffffu, r.mismatched, offset);
    Merge(r, o);
  }
  return r;
}

constexpr int kCompareThreads = 256;

// Grid: kVerifyCompareBlocks blocks of 256 threads; each warp takes whole 512-element rows
// (grid-stride), each lane 16 elements; the block's sum goes to partials[blockIdx.x].
__global__ void __launch_bounds__(kCompareThreads) CompareKernel(const VerifyCompareParams p) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int64_t rows = static_cast<int64_t>(p.batch) * p.s_q * p.h_q;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kCompareThreads / 32);
  VerifyCompareResult acc;
  for (int64_t row = blockIdx.x * (kCompareThreads / 32) + warp; row < rows; row += warps) {
    const int64_t i = row / (p.s_q * p.h_q);
    const int j = static_cast<int>((row / p.h_q) % p.s_q), h = static_cast<int>(row % p.h_q);
    const __nv_bfloat16* a =
        p.a + i * p.a_batch_stride + j * p.a_token_stride + h * p.a_head_stride;
    const __nv_bfloat16* b =
        p.b + i * p.b_batch_stride + j * p.b_token_stride + h * p.b_head_stride;
    for (int d = lane; d < kDimV; d += 32) {
      const double x = __bfloat162float(a[d]), y = __bfloat162float(b[d]);
      const double diff = fabs(x - y);
      const bool finite = isfinite(x) && isfinite(y);
      acc.compared += 1;
      if (!finite || diff > p.atol + p.rtol * fabs(y)) acc.mismatched += 1;
      if (finite) {
        acc.max_abs_error = fmax(acc.max_abs_error, diff);
        acc.sum_sq_diff += diff * diff;
        acc.sum_sq_ref += y * y;
      }
    }
  }
  acc = WarpReduce(acc);
  __shared__ VerifyCompareResult per_warp[kCompareThreads / 32];
  if (lane == 0) per_warp[warp] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    VerifyCompareResult block;
    for (int w = 0; w < kCompareThreads / 32; ++w) Merge(block, per_warp[w]);
    p.partials[blockIdx.x] = block;
  }
}

// Grid: one thread: sums the partials in block order (the same figures on every run).
__global__ void FinishCompareKernel(const VerifyCompareResult* partials, int blocks,
                                    VerifyCompareResult* result) {
  VerifyCompareResult total;
  for (int k = 0; k < blocks; ++k) Merge(total, partials[k]);
  *result = total;
}

}  // namespace

cudaError_t LaunchCheckVerifyInputs(const VerifyInputCheckParams& p, cudaStream_t stream) {
  if (p.cache_seqlens == nullptr || p.block_table == nullptr || p.safe_seqlens == nullptr ||
      p.invalid == nullptr || p.invalid_counts == nullptr || p.batch < 1 || p.s_q < 1 ||
      p.max_pages < 1 || p.table_batch_stride < p.max_pages || p.num_pages < 0) {
    return cudaErrorInvalidValue;
  }
  CheckVerifyInputsKernel<<<p.batch, 128, 0, stream>>>(p);
  CountInvalidKernel<<<1, 256, 0, stream>>>(p.invalid, p.batch, p.invalid_counts);
  return cudaGetLastError();
}

cudaError_t LaunchPoisonInvalidVerifyRequests(const VerifyPoisonParams& p, cudaStream_t stream) {
  if (p.invalid == nullptr || p.out == nullptr || p.batch < 1 || p.s_q < 1 || p.h_q < 1) {
    return cudaErrorInvalidValue;
  }
  PoisonVerifyKernel<<<p.batch, 256, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t LaunchVerifyCompare(const VerifyCompareParams& p, cudaStream_t stream) {
  if (p.a == nullptr || p.b == nullptr || p.partials == nullptr || p.result == nullptr ||
      p.batch < 1 || p.s_q < 1 || p.h_q < 1 || !(p.atol >= 0) || !(p.rtol >= 0)) {
    return cudaErrorInvalidValue;
  }
  CompareKernel<<<kVerifyCompareBlocks, kCompareThreads, 0, stream>>>(p);
  FinishCompareKernel<<<1, 1, 0, stream>>>(p.partials, kVerifyCompareBlocks, p.result);
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels
