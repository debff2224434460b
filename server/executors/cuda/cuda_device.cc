#include "server/executors/cuda/cuda_device.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "kernels/blocks/device_support.h"
#include "kernels/blocks/tensor_map.h"
#include "kernels/probe_score/probe_score.h"
#include "server/executors/cuda/cuda_executor.h"
#include "server/executors/cuda/cuda_status.h"
#include "server/executors/cuda/device_coverage.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

// Whether contexts on `device` are shared through an MPS control daemon, as the driver reports it
// (CU_DEVICE_ATTRIBUTE_MPS_ENABLED). Read through the runtime's driver entry points, so that the
// binary needs no link-time libcuda.
absl::StatusOr<bool> MpsEnabled(int device) {
  void* get_device = nullptr;
  void* get_attribute = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuDeviceGet", &get_device, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess ||
      cudaGetDriverEntryPointByVersion("cuDeviceGetAttribute", &get_attribute, 12000,
                                       cudaEnableDefault, &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    cudaGetLastError();
    return absl::UnavailableError("the driver does not expose cuDeviceGetAttribute");
  }
  CUdevice handle = 0;
  int enabled = 0;
  if (reinterpret_cast<PFN_cuDeviceGet_v2000>(get_device)(&handle, device) != CUDA_SUCCESS ||
      reinterpret_cast<PFN_cuDeviceGetAttribute_v2000>(get_attribute)(
          &enabled, CU_DEVICE_ATTRIBUTE_MPS_ENABLED, handle) != CUDA_SUCCESS) {
    return absl::UnavailableError("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED) failed");
  }
  return enabled != 0;
}

}  // namespace

absl::StatusOr<int> CudaDeviceCount() {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    cudaGetLastError();
    return absl::UnavailableError(absl::StrCat(
        "no usable CUDA device (cudaGetDeviceCount: ",
        e == cudaSuccess ? "0 devices"
                         : absl::StrCat(cudaGetErrorName(e), ": ", cudaGetErrorString(e)),
        ")"));
  }
  return count;
}

absl::StatusOr<CudaDeviceFacts> ReadCudaDevice(int device) {
  absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return count.status();
  if (device >= *count) {
    return absl::UnavailableError(absl::StrCat("CUDA device ", device, " is not there (", *count,
                                               " CUDA devices: 0 to ", *count - 1, ")"));
  }
  cudaDeviceProp prop{};
  PS_RETURN_IF_CUDA(cudaGetDeviceProperties(&prop, device));
  // A GPU this build holds no code for fails here, not at its first request (FAILED_PRECONDITION:
  // MakeExecutor does not fall back to the CPU backend for it).
  if (const cudaError_t covered = kernels::CheckDeviceCovered(device);
      covered != cudaSuccess) {
    cudaGetLastError();
    if (covered == cudaErrorNoKernelImageForDevice) {
      return absl::FailedPreconditionError(UncoveredDeviceMessage(
          device, prop.name, prop.major, prop.minor, kernels::CudaBuildTargets()));
    }
    return CudaStatus(covered, "a kernel of this build on the device");
  }
  // The sm_90a paths where both workspaces take them: the sm_90a kernels run here, and the
  // driver's tensor-map encoder is found.
  const bool sm90a = kernels::Sm90aKernelsRunOn(prop.major, prop.minor) &&
                     kernels::blocks::TensorMapEncoderAvailable();
  LogInfo("CUDA device %d: %s, compute capability %d.%d; build targets %s; kernel paths %s",
          device, prop.name, prop.major, prop.minor, kernels::CudaBuildTargets(),
          absl::StrJoin(KernelPathsFor(sm90a), ", ").c_str());
  absl::StatusOr<bool> mps = MpsEnabled(device);
  if (!mps.ok()) {
    LogWarning("cannot tell whether this context uses MPS (%s): assuming it does not",
               mps.status().message());
  } else if (*mps) {
    LogInfo(
        "CUDA device %d: this context is an MPS client: its kernels run beside the inference "
        "server's. MPS suits Verify on the decode loop's critical path; it can also slow the "
        "inference server's own step (measured +29%% on a graphed transformers step of 747 "
        "kernels): docs/mps.md says how to check yours",
        device);
  }
  if (!mps.ok() || !*mps) {
    LogInfo(
        "CUDA device %d: no MPS: the GPU time-slices between this context and the inference "
        "server's, one switch per request that runs here. Probe scoring through a tap that "
        "sends a window of 16+ decode steps per Score keeps the switches rare (docs/mps.md); "
        "ServerInfo.gpu_requests and the alert ProbeSidecarFrequentContextSwitches count them",
        device);
  }
  return CudaDeviceFacts{prop.name, absl::StrCat(prop.major, ".", prop.minor),
                         KernelPathsFor(sm90a), mps.value_or(false)};
}

}  // namespace probesidecar::server
