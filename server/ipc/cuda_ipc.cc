#include "server/ipc/cuda_ipc.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/observability/log.h"

namespace probesidecar::server {
namespace {

// cuMemGetAddressRange through the runtime's driver entry point: the binary needs no link-time
// libcuda, so it still starts (on the CPU backend) where no driver is installed.
PFN_cuMemGetAddressRange_v3020 AddressRangeFn() {
  static PFN_cuMemGetAddressRange_v3020 fn = [] {
    void* ptr = nullptr;
    cudaDriverEntryPointQueryResult found{};
    if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &ptr, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      return static_cast<PFN_cuMemGetAddressRange_v3020>(nullptr);
    }
    return reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(ptr);
  }();
  return fn;
}

}  // namespace

absl::StatusOr<IpcOpener::Mapping> CudaIpcOpener::Open(const IpcHandleBytes& handle, int device) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  }
  cudaIpcMemHandle_t ipc;
  static_assert(sizeof(ipc) == kIpcHandleBytes);
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  void* base = nullptr;
  const cudaError_t e = cudaIpcOpenMemHandle(&base, ipc, cudaIpcMemLazyEnablePeerAccess);
  if (e != cudaSuccess) {
    cudaGetLastError();  // not sticky: clear it so that the next call does not see it
    return absl::InvalidArgumentError(absl::StrCat(
        "handle: cudaIpcOpenMemHandle failed (", cudaGetErrorName(e), ": ", cudaGetErrorString(e),
        "); is the allocating process alive, on this host, and was the handle made by "
        "cudaIpcGetMemHandle for a cudaMalloc allocation on device ",
        device, "?"));
  }
  // With peer access an allocation of another device opens too (mapped over NVLink or PCIe): a
  // request would then read across devices. Where the memory lives decides.
  cudaPointerAttributes attributes{};
  if (cudaError_t e = cudaPointerGetAttributes(&attributes, base); e != cudaSuccess) {
    cudaGetLastError();
    cudaIpcCloseMemHandle(base);
    return absl::InternalError(absl::StrCat(
        "cudaPointerGetAttributes on an opened IPC allocation: ", cudaGetErrorString(e)));
  }
  if (attributes.device != device) {
    cudaIpcCloseMemHandle(base);
    return absl::InvalidArgumentError(
        absl::StrCat("device_id: the handle's allocation is on CUDA device ", attributes.device,
                     ", not device ", device,
                     " (device_id names the device the memory is on, as the server "
                     "numbers its devices)"));
  }
  Mapping mapping;
  mapping.base = base;
  CUdeviceptr range_base = 0;
  size_t range_size = 0;
  PFN_cuMemGetAddressRange_v3020 address_range = AddressRangeFn();
  if (address_range == nullptr ||
      address_range(&range_base, &range_size, reinterpret_cast<CUdeviceptr>(base)) !=
          CUDA_SUCCESS) {
    cudaIpcCloseMemHandle(base);
    return absl::InternalError("cuMemGetAddressRange failed on an opened IPC allocation");
  }
  // The opened pointer is the allocation's base; the size is the real allocation's.
  mapping.size = range_size - (reinterpret_cast<CUdeviceptr>(base) - range_base);
  return mapping;
}

void CudaIpcOpener::Close(void* base, int device) {
  cudaSetDevice(device);
  if (cudaError_t e = cudaIpcCloseMemHandle(base); e != cudaSuccess) {
    LogError("cudaIpcCloseMemHandle: %s", cudaGetErrorString(e));
  }
}

absl::StatusOr<void*> CudaIpcOpener::OpenEvent(const IpcHandleBytes& handle, int device) {
  if (cudaError_t e = cudaSetDevice(device); e != cudaSuccess) {
    return absl::InternalError(absl::StrCat("cudaSetDevice: ", cudaGetErrorString(e)));
  }
  cudaIpcEventHandle_t ipc;
  static_assert(sizeof(ipc) == kIpcHandleBytes);
  std::memcpy(&ipc, handle.data(), sizeof(ipc));
  cudaEvent_t event = nullptr;
  if (cudaError_t e = cudaIpcOpenEventHandle(&event, ipc); e != cudaSuccess) {
    cudaGetLastError();  // not sticky
    return absl::InvalidArgumentError(absl::StrCat(
        "handle: cudaIpcOpenEventHandle failed (", cudaGetErrorName(e), ": ", cudaGetErrorString(e),
        "); was the event created with cudaEventInterprocess | cudaEventDisableTiming on device ",
        device, " by a process that is still alive on this host?"));
  }
  return static_cast<void*>(event);
}

void CudaIpcOpener::CloseEvent(void* event, int device) {
  cudaSetDevice(device);
  if (cudaError_t e = cudaEventDestroy(static_cast<cudaEvent_t>(event)); e != cudaSuccess) {
    LogError("cudaEventDestroy (IPC event): %s", cudaGetErrorString(e));
  }
}

}  // namespace probesidecar::server
