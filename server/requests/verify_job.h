// A Verify request after validation: every tensor's dtype, shape, stride, extent and alignment
// checked (overflow-safe) against its buffer window or inline bytes, the inline page table and
// lengths checked entry by entry, the events resolved. What only the GPU can check (tables and
// lengths in device buffers) is checked there (kernels/verify_support).
#pragma once

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "kernels/mla_verify/mla_verify_limits.h"
#include "probesidecar/v1/verify.pb.h"
#include "server/ipc/buffer_lease.h"
#include "server/requests/request_lifetime.h"

namespace probesidecar::server {

struct VerifyLimits {
  int32_t max_batch = kernels::kMlaMaxBatch;  // what a Verify workspace is made for
};

// An int32 tensor that is either inline (validated here) or in a registered buffer.
struct Int32Tensor {
  const int32_t* host = nullptr;  // inline: points into the request
  BufferLease device;             // else
  int64_t batch_stride = 0;       // elements (block_table)
  bool on_device() const { return device.device_ptr != nullptr; }
};

struct VerifyJob {
  int32_t batch = 0, s_q = 0, h_q = 0;
  float softmax_scale = 0;
  BufferLease q;  // [b, s_q, h_q, 576] bf16, inner dims dense
  int64_t q_batch_stride = 0;
  BufferLease kv_cache;  // [num_pages, 64, 576] bf16
  int64_t kv_page_stride = 0;
  int32_t num_pages = 0;
  Int32Tensor block_table;  // [b, max_pages]
  int32_t max_pages = 0;
  Int32Tensor cache_seqlens;  // [b]
  BufferLease out;            // [b, s_q, h_q, 512] bf16 (not in shadow mode)
  int64_t out_batch_stride = 0;
  BufferLease lse;  // optional [b, h_q, s_q] fp32 (not in shadow mode)
  int64_t lse_batch_stride = 0;
  // Shadow mode: compare with the caller's output instead of writing anything.
  bool shadow = false;
  BufferLease compare_to;  // [b, s_q, h_q, 512] bf16
  int64_t compare_batch_stride = 0;
  float atol = 0, rtol = 0;
  EventLease ready, done;
  // Until when the request is worth running (checked by the executor before it runs).
  RequestLifetime lifetime;
  // The CUDA device of its buffers and events (all on one: Verify always reads device buffers).
  int device = 0;
};

// Two kernels that round to bf16 (and run P.V on bf16 tensor cores) differ by a few bf16 ulps:
// an ulp is 2^-7 of values in [1, 2), and 2^-8 relative.
inline constexpr float kDefaultShadowAtol = 1.0f / 64;
inline constexpr float kDefaultShadowRtol = 1.0f / 64;

// INVALID_ARGUMENT for every mismatched shape, dtype, stride, alignment, table entry past the
// cache, length past the table or below s_q; NOT_FOUND (buffers, events), PERMISSION_DENIED
// (another session's event), RESOURCE_EXHAUSTED (batch past the limit), FAILED_PRECONDITION
// (no buffers on this backend).
absl::StatusOr<VerifyJob> PrepareVerifyJob(const v1::VerifyRequest& request,
                                           BufferResolver* buffers, const VerifyLimits& limits);

}  // namespace probesidecar::server
