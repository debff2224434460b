// Small kernels the tap's GPU test plays a decode loop with (tap_gpu_test_kernels.cu). Plain C++
// declarations: the test itself is compiled as C++.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace probesidecar::testing {

// Keeps `stream` busy for about `nanoseconds` (one thread): the writes that follow land late.
cudaError_t LaunchGpuDelay(int64_t nanoseconds, cudaStream_t stream);

// A graph-capturable "decode step": t = *step (read on the GPU), state = steps[t] (step_bytes
// bytes, a multiple of 4), *num_rows = counts[t], then *step = t + 1.
cudaError_t LaunchPlayStep(const void* steps, const int32_t* counts, int64_t* step, void* state,
                           int32_t* num_rows, int64_t step_bytes, cudaStream_t stream);

}  // namespace probesidecar::testing
