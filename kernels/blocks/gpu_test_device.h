// For the GPU tests and kernel benchmarks (test code, header only): the device they run on, the
// build's coverage of it, and the family whose limits the planners are confined to.
//
//   PROBE_SIDECAR_LIMIT_TO_FAMILY=sm_86   plan as on an sm_86 GPU (kDeviceFamilies: its shared
//                                        memory and thread limits, no sm_90a paths) on the GPU
//                                        in hand, which then runs that family's tiles
//   PROBE_SIDECAR_EXPECT_SM90A=0|1        the tests assert that the sm_90a paths are (not)
//                                        dispatched: a run that expects them cannot pass without
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/env.h"
#include "kernels/blocks/device_family.h"
#include "kernels/blocks/device_support.h"

namespace probesidecar::kernels::gpu_test {

enum class DeviceCheck { kRun, kSkip, kFail };

// Prints the device, the build's targets and the family limits in force; kSkip (exit 77) only
// without any device, kFail when the build holds no code for it or the family is unknown.
inline DeviceCheck CheckTestDevice(const DeviceFamily** family) {
  *family = nullptr;
  int driver = 0, count = 0;
  const cudaError_t version = cudaDriverGetVersion(&driver);
  const cudaError_t err = cudaGetDeviceCount(&count);
  if ((version == cudaSuccess && driver == 0) || err == cudaErrorNoDevice ||
      (err == cudaSuccess && count == 0)) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                driver == 0 ? "no driver installed" : "device count 0");
    return DeviceCheck::kSkip;
  }
  if (err != cudaSuccess) {
    std::printf("FAILED: the CUDA runtime cannot count devices (driver %d): %s\n", driver,
                cudaGetErrorString(err));
    return DeviceCheck::kFail;
  }
  cudaDeviceProp prop{};
  if (const cudaError_t props = cudaGetDeviceProperties(&prop, 0); props != cudaSuccess) {
    std::printf("FAILED: cudaGetDeviceProperties: %s\n", cudaGetErrorString(props));
    return DeviceCheck::kFail;
  }
  if (const cudaError_t covered = CheckDeviceCovered(0); covered != cudaSuccess) {
    std::printf(
        "FAILED: %s (compute capability %d.%d) is not covered by this build (CUDA "
        "targets: %s): %s\n",
        prop.name, prop.major, prop.minor, CudaBuildTargets(), cudaGetErrorString(covered));
    return DeviceCheck::kFail;
  }
  std::printf("device: %s, compute capability %d.%d, %d SMs; build targets: %s\n", prop.name,
              prop.major, prop.minor, prop.multiProcessorCount, CudaBuildTargets());
  if (const char* name = ::probesidecar::common::ProjectEnv("LIMIT_TO_FAMILY");
      name != nullptr && *name) {
    *family = FindDeviceFamily(name);
    if (*family == nullptr) {
      std::printf("FAILED: PROBE_SIDECAR_LIMIT_TO_FAMILY=%s is no family of kDeviceFamilies\n",
                  name);
      return DeviceCheck::kFail;
    }
    std::printf(
        "planners confined to %s (%s): %lld bytes of shared memory per block, %lld per "
        "SM, %d threads per SM, sm_90a paths %s\n",
        (*family)->name, (*family)->gpus,
        static_cast<long long>((*family)->limits.smem_per_block_optin),
        static_cast<long long>((*family)->limits.smem_per_sm), (*family)->limits.max_threads_per_sm,
        (*family)->sm90a ? "allowed" : "off");
  }
  return DeviceCheck::kRun;
}

// PROBE_SIDECAR_EXPECT_SM90A: -1 when unset, else 0 or 1.
inline int ExpectedSm90a() {
  const char* v = ::probesidecar::common::ProjectEnv("EXPECT_SM90A");
  if (v == nullptr || *v == '\0') return -1;
  return std::strcmp(v, "0") == 0 ? 0 : 1;
}

}  // namespace probesidecar::kernels::gpu_test
