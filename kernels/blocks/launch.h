// Host side of programmatic dependent launch, without device code (launch.cuh uses it).
#pragma once

#include <cuda_runtime_api.h>

namespace probesidecar::kernels::blocks {

// Whether `kernel`'s code on the current device was compiled from PTX 9.0 or later, so that it
// holds the grid-dependency wait (grid_dependency.cuh) a programmatic dependent relies on. Code
// for sm_80/86, or compute_80 PTX compiled by the driver for an sm_90 GPU, has none: such a
// kernel is launched in plain stream order. Read once per (kernel, device): the workspaces ask
// for their dependents when they are created, outside any stream capture.
bool ProgrammaticLaunchUsable(const void* kernel);

}  // namespace probesidecar::kernels::blocks
