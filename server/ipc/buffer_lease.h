// A request's hold on a window of a registered IPC buffer (or on an IPC event), and the interface
// that hands them out
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

// Keeps a registered CUDA IPC event open while a request uses it.
struct EventLease {
  void* event = nullptr;  // the cudaEvent_t, opened in this process
  std::shared_ptr<void> hold;
  int device = 0;  // where it was opened
};

// Resolves a buffer location for `extent_bytes` bytes.
class BufferResolver {
 public:
  virtual ~BufferResolver() = default;
  // NOT_FOUND for unknown (or closing) buffers; PERMISSION_DENIED for a buffer of another
  // session than `session_id`; INVALID_ARGUMENT when offset + extent leaves the registered window.
  virtual absl::StatusOr<BufferLease> Acquire(uint64_t buffer_id, uint64_t offset_bytes,
                                              uint64_t extent_bytes, uint64_t session_id) = 0;
  // NOT_FOUND for unknown events; PERMISSION_DENIED for an event of another session.
  virtual absl::StatusOr<EventLease> AcquireEvent(uint64_t event_id, uint64_t session_id) = 0;
};

}  // namespace probesidecar::server
