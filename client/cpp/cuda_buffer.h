// Registering this process's CUDA device memory with a sidecar (CUDA IPC).
#pragma once

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

// A TensorRef to a 2-D tensor inside a registered buffer.
v1::TensorRef BufferTensor(v1::DType dtype, int64_t rows, int64_t cols, uint64_t buffer_id,
                           uint64_t offset_bytes = 0, int64_t row_stride = 0);

}  // namespace probesidecar::client
