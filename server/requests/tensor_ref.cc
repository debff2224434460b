#include "server/requests/tensor_ref.h"

#include <optional>
#include <string>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "proto/dtype_mapping.h"

namespace probesidecar::server {

absl::StatusOr<common::DType> FloatDType(v1::DType dtype, absl::string_view what) {
  if (const std::optional<common::DType> known = DTypeFromProto(dtype)) return *known;
  return absl::InvalidArgumentError(absl::StrCat(
      what, ": dtype ",
      v1::DType_Name(dtype).empty() ? std::to_string(dtype) : v1::DType_Name(dtype),
      " is not supported here; expected DTYPE_BFLOAT16, DTYPE_FLOAT16 or DTYPE_FLOAT32"));
}

std::string ShapeForMessage(const google::protobuf::RepeatedField<int64_t>& shape) {
  constexpr int kListed = 8;
  if (shape.size() <= kListed) return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
  return absl::StrCat("[", absl::StrJoin(shape.begin(), shape.begin() + kListed, ", "), ", ... (",
                      shape.size(), " dimensions)]");
}

absl::StatusOr<uint64_t> ExtentBytes(int64_t rows, int64_t cols, int64_t row_stride,
                                     int element_size, absl::string_view what) {
  uint64_t last_row_start = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
  if (rows <= 0 || cols <= 0 || row_stride < cols ||
      __builtin_mul_overflow(static_cast<uint64_t>(rows - 1), static_cast<uint64_t>(row_stride),
                             &last_row_start) ||
      __builtin_add_overflow(last_row_start, static_cast<uint64_t>(cols), &elements) ||
      __builtin_mul_overflow(elements, static_cast<uint64_t>(element_size), &bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape [", rows, ", ", cols,
                                                   "] with row stride ", row_stride,
                                                   " does not describe a valid extent"));
  }
  return bytes;
}

namespace {

absl::Status NeedsBuffers(absl::string_view what) {
  return absl::FailedPreconditionError(
      absl::StrCat(what,
                   ": registered buffers need the CUDA backend; this server runs the CPU "
                   "backend (send inline data, or start it with --backend cuda on a GPU host)"));
}

}  // namespace

absl::StatusOr<BufferLease> LeaseBufferWindow(const v1::TensorRef& ref, absl::string_view what,
                                              BufferResolver* buffers, uint64_t session_id,
                                              uint64_t extent, absl::string_view element_name,
                                              int alignment) {
  if (buffers == nullptr) return NeedsBuffers(what);
  absl::StatusOr<BufferLease> lease =
      buffers->Acquire(ref.buffer().buffer_id(), ref.buffer().offset_bytes(), extent, session_id);
  if (!lease.ok()) {
    return absl::Status(lease.status().code(), absl::StrCat(what, ": ", lease.status().message()));
  }
  if (reinterpret_cast<uintptr_t>(lease->device_ptr) % alignment != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": offset ", ref.buffer().offset_bytes(), " leaves the tensor misaligned for ",
        element_name, " (", alignment, "-byte alignment)"));
  }
  return lease;
}

absl::Status ResolveOrderingEvents(uint64_t ready_id, uint64_t done_id, uint64_t session_id,
                                   BufferResolver* buffers, EventLease* ready, EventLease* done) {
  for (auto [id, what, lease] :
       {std::tuple(ready_id, "ready_event", ready), std::tuple(done_id, "done_event", done)}) {
    if (id == 0) continue;
    if (buffers == nullptr) {
      return absl::FailedPreconditionError(absl::StrCat(
          what, ": CUDA IPC events need the CUDA backend; this server runs the CPU backend"));
    }
    if (session_id == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat(what, ": events belong to a session; set session_id"));
    }
    absl::StatusOr<EventLease> event = buffers->AcquireEvent(id, session_id);
    if (!event.ok()) {
      return absl::Status(event.status().code(),
                          absl::StrCat(what, ": ", event.status().message()));
    }
    *lease = std::move(*event);
  }
  return absl::OkStatus();
}

absl::StatusOr<DeviceInt32Vector> ResolveDeviceInt32Vector(const v1::TensorRef& ref,
                                                           absl::string_view what,
                                                           BufferResolver* buffers,
                                                           uint64_t session_id, int64_t max_size) {
  if (ref.dtype() != v1::DTYPE_INT32) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": dtype must be DTYPE_INT32, got ",
                                                   v1::DType_Name(ref.dtype()).empty()
                                                       ? std::to_string(ref.dtype())
                                                       : v1::DType_Name(ref.dtype())));
  }
  if (ref.shape_size() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a 1-D shape [R], got ", ShapeForMessage(ref.shape())));
  }
  DeviceInt32Vector v;
  v.size = ref.shape(0);
  if (v.size <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": needs at least one row, got ", v.size));
  }
  if (v.size > max_size) {
    return absl::ResourceExhaustedError(absl::StrCat(
        what, ": ", v.size, " rows is over this server's limit of ", max_size, " (--max-rows)"));
  }
  if (ref.row_stride() != 0 && ref.row_stride() != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": must be contiguous (row_stride 0 or 1), got ", ref.row_stride()));
  }
  if (ref.location_case() != v1::TensorRef::kBuffer) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": must name a registered buffer (send host rows in `rows` instead)"));
  }
  absl::StatusOr<BufferLease> lease =
      LeaseBufferWindow(ref, what, buffers, session_id,
                        static_cast<uint64_t>(v.size) * sizeof(int32_t), "int32", sizeof(int32_t));
  if (!lease.ok()) return lease.status();
  v.device = std::move(*lease);
  return v;
}

absl::StatusOr<Tensor2D> ResolveTensor2D(const v1::TensorRef& ref, absl::string_view what,
                                         BufferResolver* buffers, uint64_t session_id) {
  Tensor2D t;
  absl::StatusOr<common::DType> dtype = FloatDType(ref.dtype(), what);
  if (!dtype.ok()) return dtype.status();
  t.dtype = *dtype;
  if (ref.shape_size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a 2-D shape, got ", ShapeForMessage(ref.shape())));
  }
  t.rows = ref.shape(0);
  t.cols = ref.shape(1);
  if (t.rows <= 0 || t.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dimensions must be positive, got [", t.rows, ", ", t.cols, "]"));
  }
  t.row_stride = ref.row_stride() == 0 ? t.cols : ref.row_stride();
  if (t.row_stride < t.cols) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": row_stride ", ref.row_stride(),
                                                   " is smaller than the row length ", t.cols));
  }
  const int size = common::DTypeSize(t.dtype);
  absl::StatusOr<uint64_t> extent = ExtentBytes(t.rows, t.cols, t.row_stride, size, what);
  if (!extent.ok()) return extent.status();

  switch (ref.location_case()) {
    case v1::TensorRef::kData: {
      const std::string& data = ref.data();
      // rows * row_stride * size, saturated: a stride near 2^62 wraps row_stride * size alone.
      uint64_t full = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(t.rows), static_cast<uint64_t>(t.row_stride),
                                 &full) ||
          __builtin_mul_overflow(full, static_cast<uint64_t>(size), &full)) {
        full = UINT64_MAX;
      }
      if (data.size() < *extent || data.size() > full || data.size() % size != 0) {
        const std::string needs = *extent == full ? absl::StrCat(*extent)
                                  : full == UINT64_MAX
                                      ? absl::StrCat("at least ", *extent)
                                      : absl::StrCat("between ", *extent, " and ", full);
        return absl::InvalidArgumentError(
            absl::StrCat(what, ": inline data holds ", data.size(), " bytes; shape [", t.rows, ", ",
                         t.cols, "] ", common::DTypeName(t.dtype), " with row stride ",
                         t.row_stride, " needs ", needs, " bytes"));
      }
      t.host = data.data();
      return t;
    }
    case v1::TensorRef::kBuffer: {
      absl::StatusOr<BufferLease> lease = LeaseBufferWindow(ref, what, buffers, session_id, *extent,
                                                            common::DTypeName(t.dtype), size);
      if (!lease.ok()) return lease.status();
      t.device = std::move(*lease);
      return t;
    }
    case v1::TensorRef::LOCATION_NOT_SET:
      break;
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, ": has neither inline data nor a buffer location"));
}

absl::StatusOr<std::optional<int>> OneDevice(std::initializer_list<DeviceUse> uses) {
  const DeviceUse* first = nullptr;
  for (const DeviceUse& use : uses) {
    if (!use.used) continue;
    if (first == nullptr) {
      first = &use;
    } else if (use.device != first->device) {
      return absl::InvalidArgumentError(
          absl::StrCat(first->what, " is on CUDA device ", first->device, " and ", use.what,
                       " on device ", use.device,
                       ": a request runs on one device, and every buffer and event it names must "
                       "be registered there"));
    }
  }
  if (first == nullptr) return std::nullopt;
  return first->device;
}

}  // namespace probesidecar::server
