// Registering this process's CUDA device memory with a sidecar (CUDA IPC).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "client/cpp/client.h"

namespace probesidecar::client {

// Registers [device_ptr, device_ptr + bytes) of memory from cudaMalloc: finds the allocation it
// lies in, exports the allocation's cudaIpcMemHandle_t and registers the window at its offset.
// session_id: 0, or a Session's id (released when the session ends).
absl::StatusOr<v1::RegisterBufferResponse> RegisterDeviceMemory(Client& client,
                                                                const void* device_ptr,
                                                                uint64_t bytes,
                                                                const std::string& name,
                                                                uint64_t session_id = 0);

// Creates a CUDA event fit for sharing (cudaEventInterprocess | cudaEventDisableTiming) on the
// current device and registers it under `session_id` (required: events belong to a session).
// The caller owns the event (cudaEventDestroy it after the session ends or UnregisterEvent).
struct IpcEvent {
  cudaEvent_t event = nullptr;
  uint64_t event_id = 0;
};
absl::StatusOr<IpcEvent> CreateIpcEvent(Client& client, uint64_t session_id,
                                        const std::string& name = "");

// A TensorRef to a 2-D tensor inside a registered buffer.
v1::TensorRef BufferTensor(v1::DType dtype, int64_t rows, int64_t cols, uint64_t buffer_id,
                           uint64_t offset_bytes = 0, int64_t row_stride = 0);

}  // namespace probesidecar::client
