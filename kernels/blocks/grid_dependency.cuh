// Programmatic dependent launch, device side: the grid-dependency instructions exist from sm_90
// on. Code compiled for an earlier target (sm_80/86 machine code, or compute_80 PTX that the
// driver compiles for a later GPU) has neither; LaunchProgrammaticDependent (launch.cuh) then
// launches its dependents in plain stream order, so no wait is needed there.
#pragma once

#include <cuda_runtime.h>

namespace probesidecar::kernels::blocks {

// Waits until the grid this one depends on has completed and its writes are visible.
__device__ __forceinline__ void GridDependencyWait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaGridDependencySynchronize();
#endif
}

// Lets this grid's programmatic dependent be scheduled (it still waits for this grid's writes).
__device__ __forceinline__ void GridDependencyTrigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  cudaTriggerProgrammaticLaunchCompletion();
#endif
}

}  // namespace probesidecar::kernels::blocks
