#include "server/requests/verify_job.h"

#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>

#include "absl/strings/str_cat.h"
#include "server/requests/tensor_ref.h"

namespace probesidecar::server {
namespace {

constexpr int64_t kPageSize = kernels::kMlaPageSize;
constexpr int64_t kDimQk = kernels::kMlaHeadDimQk;
constexpr int64_t kDimV = kernels::kMlaHeadDimV;
constexpr int kMaxSq = kernels::kMlaMaxSq;

// The buffers as one request's session sees them.
struct Buffers {
  BufferResolver* resolver;
  uint64_t session_id;
};

std::string DTypeText(v1::DType dtype) {
  const std::string& name = v1::DType_Name(dtype);
  return name.empty() ? std::to_string(dtype) : name;
}

// A tensor's first-dimension stride (elements) with 0 meaning dense, checked against the dense
// size of the other dimensions (and against `multiple`, for 16-byte rows).
absl::StatusOr<int64_t> BatchStride(const v1::TensorRef& ref, absl::string_view what, int64_t dense,
                                    int64_t multiple) {
  const int64_t stride = ref.row_stride() == 0 ? dense : ref.row_stride();
  if (stride < dense) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": row_stride ", ref.row_stride(),
                                                   " is smaller than the ", dense,
                                                   " elements of one slice"));
  }
  if (stride % multiple != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, ": row_stride ", stride, " must be a multiple of ", multiple, " elements"));
  }
  return stride;
}

// Checks dtype and shape (`want` entries < 0 take whatever the request says) and returns the
// shape.
absl::Status CheckShape(const v1::TensorRef& ref, absl::string_view what, v1::DType dtype,
                        std::initializer_list<int64_t> want, absl::string_view layout) {
  if (ref.dtype() != dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype must be ", DTypeText(dtype), ", got ", DTypeText(ref.dtype())));
  }
  bool ok = ref.shape_size() == static_cast<int>(want.size());
  int i = 0;
  for (int64_t w : want) {
    if (!ok) break;
    ok = ref.shape(i) > 0 && (w < 0 || ref.shape(i) == w);
    ++i;
  }
  if (!ok) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": shape must be ", layout, ", got ", ShapeForMessage(ref.shape())));
  }
  return absl::OkStatus();
}

// Leases a device tensor [n, inner...] whose first dimension has `stride` elements.
absl::StatusOr<BufferLease> LeaseDevice(const v1::TensorRef& ref, absl::string_view what,
                                        const Buffers& buffers, int64_t inner, int64_t stride,
                                        int element_bytes, int alignment,
                                        absl::string_view element_name) {
  if (ref.location_case() != v1::TensorRef::kBuffer) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": must name a registered buffer"));
  }
  absl::StatusOr<uint64_t> extent = ExtentBytes(ref.shape(0), inner, stride, element_bytes, what);
  if (!extent.ok()) return extent.status();
  return LeaseBufferWindow(ref, what, buffers.resolver, buffers.session_id, *extent, element_name,
                           alignment);
}

// An int32 tensor [n, inner] (rank 1 when inner == 0), inline or in a buffer.
absl::StatusOr<Int32Tensor> ResolveInt32(const v1::TensorRef& ref, absl::string_view what,
                                         const Buffers& buffers, int64_t inner, int64_t stride) {
  const int64_t cols = inner == 0 ? 1 : inner;
  absl::StatusOr<uint64_t> extent = ExtentBytes(ref.shape(0), cols, stride, sizeof(int32_t), what);
  if (!extent.ok()) return extent.status();
  Int32Tensor t;
  t.batch_stride = stride;
  if (ref.location_case() == v1::TensorRef::kData) {
    if (ref.data().size() < *extent) {
      return absl::InvalidArgumentError(absl::StrCat(
          what, ": inline data holds ", ref.data().size(), " bytes; the shape needs ", *extent));
    }
    t.host = reinterpret_cast<const int32_t*>(ref.data().data());
    return t;
  }
  absl::StatusOr<BufferLease> lease =
      LeaseDevice(ref, what, buffers, cols, stride, sizeof(int32_t), sizeof(int32_t), "int32");
  if (!lease.ok()) return lease.status();
  t.device = std::move(*lease);
  return t;
}

// The inline page table and lengths, entry by entry. With lengths on the device, the page table
// (inline or not) is checked on the GPU against them (verify_support).
absl::Status CheckInlineTables(const VerifyJob& job) {
  if (job.cache_seqlens.on_device()) return absl::OkStatus();
  for (int32_t i = 0; i < job.batch; ++i) {
    int32_t length = 0;
    std::memcpy(&length, job.cache_seqlens.host + i, sizeof(length));
    if (length < job.s_q) {
      return absl::InvalidArgumentError(absl::StrCat("cache_seqlens[", i, "] = ", length,
                                                     " is smaller than s_q = ", job.s_q,
                                                     " (lengths include the new tokens)"));
    }
    if (static_cast<int64_t>(length) > int64_t{job.max_pages} * kPageSize) {
      return absl::InvalidArgumentError(absl::StrCat("cache_seqlens[", i, "] = ", length,
                                                     " is past its page table (", job.max_pages,
                                                     " pages of 64 tokens)"));
    }
    if (job.block_table.on_device()) continue;
    const int64_t pages = (length + kPageSize - 1) / kPageSize;
    for (int64_t k = 0; k < pages; ++k) {
      int32_t page = 0;
      std::memcpy(&page, job.block_table.host + i * job.block_table.batch_stride + k, sizeof(page));
      if (page < 0 || page >= job.num_pages) {
        return absl::InvalidArgumentError(absl::StrCat("block_table[", i, ", ", k, "] = ", page,
                                                       " is outside the cache's ", job.num_pages,
                                                       " pages"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<VerifyJob> PrepareVerifyJob(const v1::VerifyRequest& request,
                                           BufferResolver* buffers, const VerifyLimits& limits) {
  if (buffers == nullptr) {
    return absl::FailedPreconditionError(
        "Verify runs on registered CUDA buffers: it needs the CUDA backend (this server runs "
        "the CPU backend)");
  }
  VerifyJob job;
  const Buffers session_buffers{buffers, request.session_id()};
  const v1::TensorRef& q = request.q();
  if (absl::Status s =
          CheckShape(q, "q", v1::DTYPE_BFLOAT16, {-1, -1, -1, kDimQk}, "[b, s_q, h_q, 576]");
      !s.ok()) {
    return s;
  }
  if (q.shape(0) > limits.max_batch) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "q: batch ", q.shape(0), " is over this server's limit of ", limits.max_batch));
  }
  if (q.shape(1) > kMaxSq) {
    return absl::InvalidArgumentError(
        absl::StrCat("q: s_q = ", q.shape(1), " is over the limit of ", kMaxSq));
  }
  if (q.shape(2) != 16 && q.shape(2) != 32 && q.shape(2) != 64 && q.shape(2) != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("q: h_q = ", q.shape(2), " is not one of 16, 32, 64, 128"));
  }
  job.batch = static_cast<int32_t>(q.shape(0));
  job.s_q = static_cast<int32_t>(q.shape(1));
  job.h_q = static_cast<int32_t>(q.shape(2));
  const int64_t b = job.batch, s_q = job.s_q, h_q = job.h_q;
  if (!(request.softmax_scale() > 0) || !std::isfinite(request.softmax_scale())) {
    return absl::InvalidArgumentError(
        absl::StrCat("softmax_scale: must be positive and finite, got ", request.softmax_scale()));
  }
  job.softmax_scale = request.softmax_scale();

  const int64_t q_slice = s_q * h_q * kDimQk;
  absl::StatusOr<int64_t> stride = BatchStride(q, "q", q_slice, 8);
  if (!stride.ok()) return stride.status();
  job.q_batch_stride = *stride;
  absl::StatusOr<BufferLease> lease =
      LeaseDevice(q, "q", session_buffers, q_slice, job.q_batch_stride, 2, 16, "bf16 rows");
  if (!lease.ok()) return lease.status();
  job.q = std::move(*lease);

  const v1::TensorRef& kv = request.kv_cache();
  if (absl::Status s = CheckShape(kv, "kv_cache", v1::DTYPE_BFLOAT16, {-1, kPageSize, kDimQk},
                                  "[pages, 64, 576]");
      !s.ok()) {
    return s;
  }
  if (kv.shape(0) > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv_cache: ", kv.shape(0), " pages is too many"));
  }
  job.num_pages = static_cast<int32_t>(kv.shape(0));
  stride = BatchStride(kv, "kv_cache", kPageSize * kDimQk, 8);
  if (!stride.ok()) return stride.status();
  job.kv_page_stride = *stride;
  lease = LeaseDevice(kv, "kv_cache", session_buffers, kPageSize * kDimQk, job.kv_page_stride, 2,
                      16, "bf16 rows");
  if (!lease.ok()) return lease.status();
  job.kv_cache = std::move(*lease);

  const v1::TensorRef& table = request.block_table();
  if (absl::Status s = CheckShape(table, "block_table", v1::DTYPE_INT32, {b, -1},
                                  absl::StrCat("[b, max_pages] with b = ", b));
      !s.ok()) {
    return s;
  }
  if (table.shape(1) > INT32_MAX / kPageSize) {
    return absl::InvalidArgumentError(
        absl::StrCat("block_table: ", table.shape(1), " pages per request is too many"));
  }
  job.max_pages = static_cast<int32_t>(table.shape(1));
  stride = BatchStride(table, "block_table", job.max_pages, 1);
  if (!stride.ok()) return stride.status();
  absl::StatusOr<Int32Tensor> tensor =
      ResolveInt32(table, "block_table", session_buffers, job.max_pages, *stride);
  if (!tensor.ok()) return tensor.status();
  job.block_table = std::move(*tensor);

  const v1::TensorRef& lengths = request.cache_seqlens();
  if (absl::Status s = CheckShape(lengths, "cache_seqlens", v1::DTYPE_INT32, {b},
                                  absl::StrCat("[b] with b = ", b));
      !s.ok()) {
    return s;
  }
  if (lengths.row_stride() != 0 && lengths.row_stride() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cache_seqlens: must be contiguous (row_stride 0 or 1, not ", lengths.row_stride(), ")"));
  }
  tensor = ResolveInt32(lengths, "cache_seqlens", session_buffers, 0, 1);
  if (!tensor.ok()) return tensor.status();
  job.cache_seqlens = std::move(*tensor);
  if (absl::Status s = CheckInlineTables(job); !s.ok()) return s;

  const int64_t out_slice = s_q * h_q * kDimV;
  job.shadow = request.has_compare_to();
  if (job.shadow) {
    const v1::TensorRef& compare = request.compare_to();
    if (absl::Status s = CheckShape(compare, "compare_to", v1::DTYPE_BFLOAT16, {b, s_q, h_q, kDimV},
                                    "[b, s_q, h_q, 512] like q");
        !s.ok()) {
      return s;
    }
    stride = BatchStride(compare, "compare_to", out_slice, 8);
    if (!stride.ok()) return stride.status();
    job.compare_batch_stride = *stride;
    lease = LeaseDevice(compare, "compare_to", session_buffers, out_slice, job.compare_batch_stride,
                        2, 16, "bf16 rows");
    if (!lease.ok()) return lease.status();
    job.compare_to = std::move(*lease);
    job.atol = request.shadow_atol() == 0 ? kDefaultShadowAtol : request.shadow_atol();
    job.rtol = request.shadow_rtol() == 0 ? kDefaultShadowRtol : request.shadow_rtol();
    if (!(job.atol >= 0) || !(job.rtol >= 0) || !std::isfinite(job.atol) ||
        !std::isfinite(job.rtol)) {
      return absl::InvalidArgumentError("shadow_atol, shadow_rtol: must be finite and >= 0");
    }
  } else {
    if (!request.has_out()) {
      return absl::InvalidArgumentError("out: missing (required unless compare_to is set)");
    }
    const v1::TensorRef& out = request.out();
    if (absl::Status s = CheckShape(out, "out", v1::DTYPE_BFLOAT16, {b, s_q, h_q, kDimV},
                                    "[b, s_q, h_q, 512] like q");
        !s.ok()) {
      return s;
    }
    stride = BatchStride(out, "out", out_slice, 8);
    if (!stride.ok()) return stride.status();
    job.out_batch_stride = *stride;
    lease = LeaseDevice(out, "out", session_buffers, out_slice, job.out_batch_stride, 2, 16,
                        "bf16 rows");
    if (!lease.ok()) return lease.status();
    job.out = std::move(*lease);
    if (request.has_lse()) {
      const v1::TensorRef& lse = request.lse();
      if (absl::Status s =
              CheckShape(lse, "lse", v1::DTYPE_FLOAT32, {b, h_q, s_q}, "[b, h_q, s_q]");
          !s.ok()) {
        return s;
      }
      stride = BatchStride(lse, "lse", h_q * s_q, 1);
      if (!stride.ok()) return stride.status();
      job.lse_batch_stride = *stride;
      lease = LeaseDevice(lse, "lse", session_buffers, h_q * s_q, job.lse_batch_stride, 4, 4,
                          "float32");
      if (!lease.ok()) return lease.status();
      job.lse = std::move(*lease);
    }
  }

  if (absl::Status s = ResolveOrderingEvents(request.ready_event(), request.done_event(),
                                             request.session_id(), buffers, &job.ready, &job.done);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::optional<int>> device = OneDevice({
      {"q", job.q.device_ptr != nullptr, job.q.device},
      {"kv_cache", job.kv_cache.device_ptr != nullptr, job.kv_cache.device},
      {"block_table", job.block_table.on_device(), job.block_table.device.device},
      {"cache_seqlens", job.cache_seqlens.on_device(), job.cache_seqlens.device.device},
      {"out", job.out.device_ptr != nullptr, job.out.device},
      {"lse", job.lse.device_ptr != nullptr, job.lse.device},
      {"compare_to", job.compare_to.device_ptr != nullptr, job.compare_to.device},
      {"ready_event", job.ready.event != nullptr, job.ready.device},
      {"done_event", job.done.event != nullptr, job.done.device},
  });
  if (!device.ok()) return device.status();
  job.device = device->value_or(0);
  return job;
}

}  // namespace probesidecar::server
