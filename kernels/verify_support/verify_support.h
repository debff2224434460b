// What the Verify RPC needs around the MLA verify kernels (kernels/mla_verify), on the device:
//
// - Input checks for page tables and lengths that live in the caller's device memory (the
//   attention kernels trust them): a request whose length is below s_q or past its table, or
//   whose table names a page outside the cache, is recorded as invalid and given length 0 in a
//   sanitized copy of the lengths, so that the attention reads none of its pages; a poison kernel
//   then writes NaN into its outputs.
// - Shadow-mode comparison: our output against the caller's own, element by element, reduced to
//   max |a - b|, the relative L2 error and the count beyond a tolerance, without atomics (so the
//   figures are the same on every run).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <cstdint>

namespace probesidecar::kernels {

struct VerifyInputCheckParams {
  const int32_t* cache_seqlens = nullptr;  // [batch] the caller's lengths
  const int32_t* block_table = nullptr;    // [batch, table_batch_stride] the caller's page table
  int64_t table_batch_stride = 0;          // elements
  int32_t batch = 0;
  int32_t s_q = 0;
  int32_t max_pages = 0;            // pages per row of the table
  int32_t num_pages = 0;            // pages in the cache: valid entries are [0, num_pages)
  int32_t* safe_seqlens = nullptr;  // [batch] out: L, or 0 for an invalid request
  uint8_t* invalid = nullptr;       // [batch] out: 1 where the request is invalid
  // [2] out: [0] running total of invalid requests, [1] this launch's (host-mapped is fine: one
  // thread writes them; launches on a stream run in order).
  uint32_t* invalid_counts = nullptr;
};

// Grid: one block of 128 threads per request, over its pages; then the last block to finish
// counts (a second tiny kernel). cudaErrorInvalidValue for bad params.
cudaError_t LaunchCheckVerifyInputs(const VerifyInputCheckParams& params, cudaStream_t stream);

struct VerifyPoisonParams {
  const uint8_t* invalid = nullptr;  // [batch]
  int32_t batch = 0, s_q = 0, h_q = 0;
  __nv_bfloat16* out = nullptr;  // [batch, s_q, h_q, 512]
  int64_t out_batch_stride = 0, out_token_stride = 0, out_head_stride = 0;  // elements
  float* lse = nullptr;  // optional [batch, h_q, s_q]
  int64_t lse_batch_stride = 0, lse_head_stride = 0;
};

// Writes NaN into the outputs (and LSEs) of the requests flagged invalid. Grid: one block per
// request.
cudaError_t LaunchPoisonInvalidVerifyRequests(const VerifyPoisonParams& params,
                                              cudaStream_t stream);

// The comparison's result (written by one thread at the end).
struct VerifyCompareResult {
  double max_abs_error = 0;
  double sum_sq_diff = 0;   // sum (a - b)^2 over the finite pairs
  double sum_sq_ref = 0;    // sum b^2
  uint64_t compared = 0;    // elements
  uint64_t mismatched = 0;  // |a - b| > atol + rtol * |b|, or either not finite
};

struct VerifyCompareParams {
  const __nv_bfloat16* a = nullptr;  // ours [batch, s_q, h_q, 512]
  int64_t a_batch_stride = 0, a_token_stride = 0, a_head_stride = 0;
  const __nv_bfloat16* b = nullptr;  // the caller's (the reference) [batch, s_q, h_q, 512]
  int64_t b_batch_stride = 0, b_token_stride = 0, b_head_stride = 0;
  int32_t batch = 0, s_q = 0, h_q = 0;
  float atol = 0, rtol = 0;
  VerifyCompareResult* partials = nullptr;  // [kVerifyCompareBlocks] device scratch
  VerifyCompareResult* result = nullptr;    // [1] out (host-mapped is fine)
};
inline constexpr int kVerifyCompareBlocks = 264;

// Grid: kVerifyCompareBlocks blocks over the rows (one warp per 512-element row), then one block
// reduces the partials in a fixed order.
cudaError_t LaunchVerifyCompare(const VerifyCompareParams& params, cudaStream_t stream);

}  // namespace probesidecar::kernels
