// Parsing of the CUDA IPC memory handles that RegisterBuffer accepts. No CUDA calls here.
#pragma once

#include <array>
#include <cstdint>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace probesidecar::server {

// The 64 bytes of a cudaIpcMemHandle_t.
inline constexpr size_t kIpcHandleBytes = 64;
using IpcHandleBytes = std::array<char, kIpcHandleBytes>;

// Accepts a raw 64-byte cudaIpcMemHandle_t, or PyTorch's versioned storage handle: 66 bytes,
// byte 0 = version 2, byte 1 = 'c' (cudaMalloc'd block), then the 64-byte handle. Refuses
// PyTorch's expandable-segment handles (type 'e') with UNIMPLEMENTED and the fix, anything
// else with INVALID_ARGUMENT naming what is wrong.
absl::StatusOr<IpcHandleBytes> ParseIpcHandle(absl::string_view handle);

// A cudaIpcEventHandle_t: exactly 64 bytes, not all zero.
absl::StatusOr<IpcHandleBytes> ParseIpcEventHandle(absl::string_view handle);

}  // namespace probesidecar::server
