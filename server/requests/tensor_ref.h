// Validation of the TensorRefs in requests: dtype, shape, stride and extent, before anything
// reads a byte.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/dtype.h"
#include "probesidecar/v1/tensor.pb.h"
#include "server/ipc/buffer_lease.h"

namespace probesidecar::server {

// One buffer or event a request uses, for OneDevice: `used` false for what it does not name.
struct DeviceUse {
  const char* what;  // "activations", "output", "ready_event", ...
  bool used;
  int device;
};

// The one device every used buffer and event of a request is on (a request runs on one device);
// nullopt when it uses none. INVALID_ARGUMENT naming the first two that differ.
absl::StatusOr<std::optional<int>> OneDevice(std::initializer_list<DeviceUse> uses);

// A validated 2-D tensor: either host bytes (inline) or a leased device window.
struct Tensor2D {
  common::DType dtype = common::DType::kFloat32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t row_stride = 0;  // elements
  const void* host = nullptr;
  BufferLease device;  // device.device_ptr != nullptr for buffer tensors
  bool on_device() const { return device.device_ptr != nullptr; }
};

// bf16/fp16/fp32, else INVALID_ARGUMENT naming `what`.
absl::StatusOr<common::DType> FloatDType(v1::DType dtype, absl::string_view what);

// A request's shape for a message, "[2, 1, 16, 576]": past 8 dimensions the rest are counted, not
// listed, so that a hostile shape cannot grow the message (and the response's metadata).
std::string ShapeForMessage(const google::protobuf::RepeatedField<int64_t>& shape);

// Bytes from the first element to one past the last: ((rows - 1) * row_stride + cols) * size.
// INVALID_ARGUMENT on overflow.
absl::StatusOr<uint64_t> ExtentBytes(int64_t rows, int64_t cols, int64_t row_stride,
                                     int element_size, absl::string_view what);

// Validates a 2-D floating-point TensorRef. Inline data must hold between the extent and
// rows * row_stride elements; a buffer location is resolved through `buffers` (nullptr: the
// backend has no IPC, FAILED_PRECONDITION) for the request's `session_id` (a buffer is usable
// only by its session). `what` names the field in messages.
absl::StatusOr<Tensor2D> ResolveTensor2D(const v1::TensorRef& ref, absl::string_view what,
                                         BufferResolver* buffers, uint64_t session_id);

// Leases `extent` bytes of the buffer `ref` names and checks that its first byte is
// `alignment`-aligned (the message names `element_name`). FAILED_PRECONDITION without buffers.
absl::StatusOr<BufferLease> LeaseBufferWindow(const v1::TensorRef& ref, absl::string_view what,
                                              BufferResolver* buffers, uint64_t session_id,
                                              uint64_t extent, absl::string_view element_name,
                                              int alignment);

// A validated int32 vector [n] in a registered buffer (row indices written on the device).
struct DeviceInt32Vector {
  int64_t size = 0;
  BufferLease device;
};

// Validates an int32 [n] TensorRef that must live in a registered buffer (1 <= n <= max_size;
// contiguous; 4-byte aligned). INVALID_ARGUMENT, RESOURCE_EXHAUSTED past max_size, NOT_FOUND for
// unknown buffers, FAILED_PRECONDITION without buffers.
absl::StatusOr<DeviceInt32Vector> ResolveDeviceInt32Vector(const v1::TensorRef& ref,
                                                           absl::string_view what,
                                                           BufferResolver* buffers,
                                                           uint64_t session_id, int64_t max_size);

// The GPU-side ordering events a request names (0 = not named), leased from `buffers`: both must
// belong to `session_id`. INVALID_ARGUMENT without a session, NOT_FOUND, PERMISSION_DENIED,
// FAILED_PRECONDITION without buffers.
absl::Status ResolveOrderingEvents(uint64_t ready_id, uint64_t done_id, uint64_t session_id,
                                   BufferResolver* buffers, EventLease* ready, EventLease* done);

}  // namespace probesidecar::server
