// A request's hold on a window of a registered IPC buffer, and the interface that hands them out
// (implemented by the buffer registry; request validation resolves TensorRefs through it).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"

namespace probesidecar::server {

// Keeps a window of a registered IPC buffer open while a request uses it (releasing the last
// reference ends the use, and may complete a deferred unregister).
struct BufferLease {
  void* device_ptr = nullptr;  // the tensor's first byte on the device
  int device = 0;
  std::shared_ptr<void> hold;
};

// Resolves a buffer location for `extent_bytes` bytes.
class BufferResolver {
 public:
  virtual ~BufferResolver() = default;
  // NOT_FOUND for unknown (or closing) buffers; INVALID_ARGUMENT when offset + extent leaves
  // the registered window.
  virtual absl::StatusOr<BufferLease> Acquire(uint64_t buffer_id, uint64_t offset_bytes,
                                              uint64_t extent_bytes) = 0;
};

}  // namespace probesidecar::server
