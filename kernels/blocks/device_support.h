// What this build's machine code covers, and whether a device is among it: read once at start-up
// so that a GPU the build cannot run fails there, with its name and the build option, never at
// its first request.
#pragma once

#include <cuda_runtime_api.h>

#include "kernels/blocks/device_family.h"

namespace probesidecar::kernels {

// The build's CUDA targets as CMake was given them, e.g. "80-real 86-real 90-real 100-real
// 120-real 120-virtual +sm_90a" (the entries of CMAKE_CUDA_ARCHITECTURES, "+sm_90a" when the
// sm_90a kernels are built).
const char* CudaBuildTargets();

// Whether the sm_90a kernels (gather_wgmma, split_kv_sm90a) are in this build.
bool Sm90aKernelsBuilt();

// Whether the sm_90a kernels can run on a device of compute capability `cc_major`.`cc_minor`:
// 9.0 exactly (sm_90a machine code runs nowhere else), the kernels in this build, and `family`,
// when the planners are confined to one, allowing them.
inline bool Sm90aKernelsRunOn(int cc_major, int cc_minor, const DeviceFamily* family = nullptr) {
  return cc_major == 9 && cc_minor == 0 && Sm90aKernelsBuilt() &&
         (family == nullptr || family->sm90a);
}

// cudaSuccess when this build holds machine code or PTX the device can run (checked by asking the
// runtime for a kernel of this build: PTX is compiled for the device here, once);
// cudaErrorNoKernelImageForDevice when it does not; another error when the device cannot be used.
cudaError_t CheckDeviceCovered(int device);

// The device's limits (cudaDeviceGetAttribute).
cudaError_t ReadDeviceLimits(int device, DeviceLimits* limits);

}  // namespace probesidecar::kernels
