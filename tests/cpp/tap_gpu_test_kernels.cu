#include "tests/cpp/tap_gpu_test_kernels.h"

namespace probesidecar::testing {
namespace {

// One thread.
__global__ void GpuDelayKernel(int64_t nanoseconds) {
  for (int64_t slept = 0; slept < nanoseconds; slept += 1000) __nanosleep(1000);
}

// Grid (blocks), 256 threads: every block reads t; the copy is in 4-byte words. The step counter
// is advanced by LaunchPlayStep's second kernel, after every block has read it.
__global__ void PlayStepKernel(const uint32_t* steps, const int32_t* counts, const int64_t* step,
                               uint32_t* state, int32_t* num_rows, int64_t words) {
  const int64_t t = *step;
  const uint32_t* src = steps + t * words;
  for (int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < words;
       i += int64_t{gridDim.x} * blockDim.x) {
    state[i] = src[i];
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) *num_rows = counts[t];
}

__global__ void AdvanceKernel(int64_t* step) { *step += 1; }

}  // namespace

cudaError_t LaunchGpuDelay(int64_t nanoseconds, cudaStream_t stream) {
  GpuDelayKernel<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

cudaError_t LaunchPlayStep(const void* steps, const int32_t* counts, int64_t* step, void* state,
                           int32_t* num_rows, int64_t step_bytes, cudaStream_t stream) {
  if (step_bytes % 4 != 0) return cudaErrorInvalidValue;
  const int64_t words = step_bytes / 4;
  const int blocks = static_cast<int>((words + 255) / 256 < 1024 ? (words + 255) / 256 : 1024);
  PlayStepKernel<<<blocks, 256, 0, stream>>>(static_cast<const uint32_t*>(steps), counts, step,
                                             static_cast<uint32_t*>(state), num_rows, words);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
  AdvanceKernel<<<1, 1, 0, stream>>>(step);
  return cudaGetLastError();
}

}  // namespace probesidecar::testing
