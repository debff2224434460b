#include "client/cpp/cuda_buffer.h"

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"

namespace probesidecar::client {
namespace {

absl::Status Cuda(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": ", cudaGetErrorString(error)));
}

}  // namespace

absl::StatusOr<v1::RegisterBufferResponse> RegisterDeviceMemory(Client& client,
                                                                const void* device_ptr,
                                                                uint64_t bytes,
                                                                const std::string& name,
                                                                uint64_t session_id) {
  cudaPointerAttributes attributes{};
  if (absl::Status s =
          Cuda(cudaPointerGetAttributes(&attributes, device_ptr), "cudaPointerGetAttributes");
      !s.ok()) {
    return s;
  }
  if (attributes.type != cudaMemoryTypeDevice) {
    return absl::InvalidArgumentError("RegisterDeviceMemory: not device memory");
  }
  // The allocation's base: IPC handles name whole allocations.
  void* entry = nullptr;
  cudaDriverEntryPointQueryResult found{};
  if (cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &entry, 12000, cudaEnableDefault,
                                       &found) != cudaSuccess ||
      found != cudaDriverEntryPointSuccess) {
    return absl::InternalError("cuMemGetAddressRange is not available");
  }
  CUdeviceptr base = 0;
  size_t size = 0;
  if (reinterpret_cast<PFN_cuMemGetAddressRange_v3020>(entry)(
          &base, &size, reinterpret_cast<CUdeviceptr>(device_ptr)) != CUDA_SUCCESS) {
    return absl::InternalError("cuMemGetAddressRange failed");
  }
  cudaIpcMemHandle_t handle;
  if (absl::Status s =
          Cuda(cudaIpcGetMemHandle(&handle, reinterpret_cast<void*>(base)), "cudaIpcGetMemHandle");
      !s.ok()) {
    return s;
  }
  v1::RegisterBufferRequest request;
  request.set_name(name);
  request.set_device_id(attributes.device);
  request.set_handle(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
  request.set_offset_bytes(reinterpret_cast<CUdeviceptr>(device_ptr) - base);
  request.set_byte_size(bytes);
  request.set_client_pid(getpid());
  request.set_session_id(session_id);
  return client.RegisterBuffer(request);
}

v1::TensorRef BufferTensor(v1::DType dtype, int64_t rows, int64_t cols, uint64_t buffer_id,
                           uint64_t offset_bytes, int64_t row_stride) {
  v1::TensorRef ref;
  ref.set_dtype(dtype);
  ref.add_shape(rows);
  ref.add_shape(cols);
  ref.set_row_stride(row_stride);
  ref.mutable_buffer()->set_buffer_id(buffer_id);
  ref.mutable_buffer()->set_offset_bytes(offset_bytes);
  return ref;
}

absl::StatusOr<IpcEvent> CreateIpcEvent(Client& client, uint64_t session_id,
                                        const std::string& name) {
  int device = 0;
  if (absl::Status s = Cuda(cudaGetDevice(&device), "cudaGetDevice"); !s.ok()) return s;
  IpcEvent out;
  if (absl::Status s =
          Cuda(cudaEventCreateWithFlags(&out.event, cudaEventInterprocess | cudaEventDisableTiming),
               "cudaEventCreateWithFlags");
      !s.ok()) {
    return s;
  }
  cudaIpcEventHandle_t handle;
  absl::Status status = Cuda(cudaIpcGetEventHandle(&handle, out.event), "cudaIpcGetEventHandle");
  if (status.ok()) {
    v1::RegisterEventRequest request;
    request.set_handle(std::string(reinterpret_cast<const char*>(&handle), sizeof(handle)));
    request.set_device_id(device);
    request.set_session_id(session_id);
    request.set_name(name);
    absl::StatusOr<uint64_t> id = client.RegisterEvent(request);
    if (id.ok()) {
      out.event_id = *id;
      return out;
    }
    status = id.status();
  }
  cudaEventDestroy(out.event);
  return status;
}

}  // namespace probesidecar::client
