// Host-side launch helpers shared by the kernel families. Included by .cu files only (the launch
// needs the kernel's device symbol).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/blocks/launch.h"

namespace probesidecar::kernels::blocks {

// Launches `kernel` as a programmatic dependent of the kernel before it on `stream`
// (cudaLaunchAttributeProgrammaticStreamSerialization): it may be scheduled once every block of
// that kernel has called cudaTriggerProgrammaticLaunchCompletion (or finished), and it must call
// cudaGridDependencySynchronize before reading anything that kernel writes. Its launch then
// overlaps the other's tail instead of following it; graph capture keeps the edge as a
// programmatic one. Where the kernel's code has no grid-dependency instructions (compiled for a
// target before sm_90, ProgrammaticLaunchUsable) it is launched in plain stream order instead.
// Returns the launch status.
template <typename... KernelParams, typename... Args>
cudaError_t LaunchProgrammaticDependent(void (*kernel)(KernelParams...), dim3 grid, dim3 block,
                                        size_t dynamic_smem_bytes, cudaStream_t stream,
                                        Args&&... args) {
  cudaLaunchConfig_t config{};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = dynamic_smem_bytes;
  config.stream = stream;
  cudaLaunchAttribute attribute{};
  attribute.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attribute.val.programmaticStreamSerializationAllowed = 1;
  const bool programmatic = ProgrammaticLaunchUsable(reinterpret_cast<const void*>(kernel));
  config.attrs = programmatic ? &attribute : nullptr;
  config.numAttrs = programmatic ? 1 : 0;
  return cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
}

}  // namespace probesidecar::kernels::blocks
