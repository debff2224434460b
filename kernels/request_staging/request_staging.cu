#include <cmath>

#include "kernels/blocks/grid_dependency.cuh"
#include "kernels/request_staging/request_staging.h"

namespace probesidecar::kernels {
namespace {

constexpr int kStageThreads = 256;

// Grid: one block of kStageThreads. Copies the argument block, stages and checks the rows, and
// counts the invalid ones (block reduction; one thread adds the count to the running total).
__global__ void __launch_bounds__(kStageThreads) StageRequestKernel(const StageRequestParams p) {
  __shared__ int invalid_count;
  if (threadIdx.x == 0) invalid_count = 0;
  __syncthreads();
  auto* args = static_cast<unsigned char*>(p.args_dst);
  for (int i = threadIdx.x; i < p.args_bytes; i += blockDim.x) args[i] = p.args[i];
  int invalid = 0;
  if (p.rows_dst != nullptr) {
    for (int r = threadIdx.x; r < p.bucket; r += blockDim.x) {
      int32_t row = 0;
      bool bad = false;
      if (r < p.num_rows) {
        const int32_t v = p.device_rows != nullptr ? p.device_rows[r] : p.inline_rows[r];
        bad = v < 0 || static_cast<int64_t>(v) >= p.num_tokens;
        row = bad ? 0 : v;
      }
      p.rows_dst[r] = row;
      if (p.invalid_dst != nullptr) p.invalid_dst[r] = bad ? 1 : 0;
      invalid += bad ? 1 : 0;
    }
  }
  if (invalid != 0) atomicAdd(&invalid_count, invalid);
  __syncthreads();
  if (threadIdx.x == 0 && p.invalid_counts != nullptr) {
    // Single writer per stream: launches on one stream run in order.
    p.invalid_counts[0] += static_cast<uint32_t>(invalid_count);
    p.invalid_counts[1] = static_cast<uint32_t>(invalid_count);
  }
}

// Grid: one block per bucket row, 128 threads across the columns.
__global__ void PoisonInvalidRowsKernel(const PoisonInvalidRowsParams p) {
  // The probe-outcome count after it (a programmatic dependent) may be scheduled now: it waits
  // for this grid before reading the scores.
  blocks::GridDependencyTrigger();
  const int r = blockIdx.x;
  const PoisonDescriptor d = *p.descriptor;
  if (r >= d.num_rows || p.invalid[r] == 0) return;
  float* row = d.out + static_cast<int64_t>(r) * d.out_row_stride;
  for (int c = threadIdx.x; c < p.num_columns; c += blockDim.x) row[c] = NAN;
}

bool Valid(const StageRequestParams& p) {
  return p.args_dst != nullptr && p.args_bytes >= 0 && p.args_bytes <= kMaxStagedArgsBytes &&
         p.num_rows >= 0 && p.num_rows <= p.bucket &&
         (p.rows_dst == nullptr || p.device_rows != nullptr || p.num_rows <= kMaxInlineRows);
}

}  // namespace

cudaError_t LaunchStageRequest(const StageRequestParams& params, cudaStream_t stream) {
  if (!Valid(params)) return cudaErrorInvalidValue;
  StageRequestKernel<<<1, kStageThreads, 0, stream>>>(params);
  return cudaGetLastError();
}

cudaError_t StageRequestNodeParams(const StageRequestParams* params, void** pointer_storage,
                                   cudaKernelNodeParams* node) {
  if (params == nullptr || pointer_storage == nullptr || node == nullptr || !Valid(*params)) {
    return cudaErrorInvalidValue;
  }
  *node = cudaKernelNodeParams{};
  node->func = reinterpret_cast<void*>(&StageRequestKernel);
  node->gridDim = dim3(1);
  node->blockDim = dim3(kStageThreads);
  node->sharedMemBytes = 0;
  // kernelParams holds one pointer per kernel parameter.
  pointer_storage[0] = const_cast<StageRequestParams*>(params);
  node->kernelParams = pointer_storage;
  return cudaSuccess;
}

cudaError_t LaunchPoisonInvalidRows(const PoisonInvalidRowsParams& params, cudaStream_t stream) {
  if (params.descriptor == nullptr || params.invalid == nullptr || params.bucket <= 0 ||
      params.num_columns <= 0) {
    return cudaErrorInvalidValue;
  }
  PoisonInvalidRowsKernel<<<params.bucket, 128, 0, stream>>>(params);
  return cudaGetLastError();
}

}  // namespace probesidecar::kernels
