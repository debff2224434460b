// The build's coverage of a device: a kernel compiled like every other kernel of the build (the
// project's CMAKE_CUDA_ARCHITECTURES), so the runtime has an image for it exactly when it has one
// for the others.
#include <cuda_runtime.h>

#include "kernels/blocks/device_support.h"

#ifndef PROBESIDECAR_CUDA_TARGETS
#error "PROBESIDECAR_CUDA_TARGETS: set by kernels/blocks/CMakeLists.txt"
#endif

namespace probesidecar::kernels {
namespace {

// Grid: 1 block; block: 1 thread. Never launched: only looked up.
__global__ void CoverageProbeKernel(int* out) {
  if (out != nullptr) *out = 0;
}

}  // namespace

const char* CudaBuildTargets() { return PROBESIDECAR_CUDA_TARGETS; }

bool Sm90aKernelsBuilt() { return PROBESIDECAR_HAVE_SM90A != 0; }

cudaError_t CheckDeviceCovered(int device) {
  int current = 0;
  cudaError_t err = cudaGetDevice(&current);
  if (err != cudaSuccess) return err;
  if (current != device && (err = cudaSetDevice(device)) != cudaSuccess) return err;
  cudaFuncAttributes attr{};
  err = cudaFuncGetAttributes(&attr, CoverageProbeKernel);
  if (err == cudaErrorInvalidDeviceFunction) err = cudaErrorNoKernelImageForDevice;
  if (current != device) {
    const cudaError_t back = cudaSetDevice(current);
    if (err == cudaSuccess) err = back;
  }
  return err;
}

cudaError_t ReadDeviceLimits(int device, DeviceLimits* limits) {
  int32_t smem_per_sm = 0, optin = 0, reserved = 0;
  const struct {
    cudaDeviceAttr attribute;
    int32_t* value;
  } reads[] = {
      {cudaDevAttrComputeCapabilityMajor, &limits->cc_major},
      {cudaDevAttrComputeCapabilityMinor, &limits->cc_minor},
      {cudaDevAttrMultiProcessorCount, &limits->num_sms},
      {cudaDevAttrMaxSharedMemoryPerMultiprocessor, &smem_per_sm},
      {cudaDevAttrMaxSharedMemoryPerBlockOptin, &optin},
      {cudaDevAttrReservedSharedMemoryPerBlock, &reserved},
      {cudaDevAttrMaxThreadsPerMultiProcessor, &limits->max_threads_per_sm},
      {cudaDevAttrMaxRegistersPerMultiprocessor, &limits->regs_per_sm},
  };
  for (const auto& read : reads) {
    int v = 0;
    const cudaError_t err = cudaDeviceGetAttribute(&v, read.attribute, device);
    if (err != cudaSuccess) return err;
    *read.value = v;
  }
  limits->smem_per_sm = smem_per_sm;
  limits->smem_per_block_optin = optin;
  limits->reserved_smem_per_block = reserved;
  return cudaSuccess;
}

}  // namespace probesidecar::kernels
