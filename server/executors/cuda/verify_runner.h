// Verify (MLA verify attention) on one stream slot's stream: a captured graph per set of buffers
// and shapes — device-side checks of the page table and lengths, the split-KV plan and run
// (kernels/mla_verify), poisoning of invalid requests, and in shadow mode the comparison with the
// caller's output — replayed per request. In a decode loop the buffers are the same every step,
// and the lengths and tables are read on the device, so one graph serves every step.
//
// Its memory (the MLA workspace, ~35 MB on an H200, and the shadow scratch) is allocated on the
// first Verify, so probe-only deployments do not pay for it.
#pragma once

#include <cuda_runtime_api.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <tuple>

#include "absl/status/status.h"
#include "kernels/mla_verify/mla_verify.h"
#include "kernels/verify_support/verify_support.h"
#include "server/executors/cuda/lru_cache.h"
#include "server/executors/cuda/staging_buffer.h"
#include "server/executors/cuda/stream_slot.h"
#include "server/executors/executor.h"
#include "server/requests/verify_job.h"

namespace probesidecar::server {

class VerifyRunner {
 public:
  // Runs on `slot`'s stream (and waits for the GPU through it: StreamSlot::FinishOnGpu).
  // `device_bytes` counts the device memory the runner holds (shared with the executor).
  VerifyRunner(StreamSlot* slot, std::atomic<int64_t>* device_bytes, size_t graph_cache_entries);
  ~VerifyRunner();
  VerifyRunner(const VerifyRunner&) = delete;
  VerifyRunner& operator=(const VerifyRunner&) = delete;

  // Runs `job` and waits for the GPU (the slot's worker thread, on an idle slot), until the job's
  // deadline or its caller going away at most (then its buffers stay held until the GPU is done).
  absl::Status Run(const VerifyJob& job, VerifyResult* result);

  // Requests whose device page tables or lengths were out of range so far (any thread).
  uint64_t invalid_requests() const;

 private:
  // Everything a graph bakes in.
  struct GraphKey {
    int32_t batch, s_q, h_q;
    kernels::MlaVerifyPath path;
    uint32_t scale_bits, atol_bits, rtol_bits;
    const void *q, *kv, *table, *lengths, *out, *lse, *compare;
    int64_t q_stride, kv_stride, table_stride, out_stride, lse_stride, compare_stride;
    int32_t num_pages, max_pages;
    auto Tie() const {
      return std::tie(batch, s_q, h_q, path, scale_bits, atol_bits, rtol_bits, q, kv, table,
                      lengths, out, lse, compare, q_stride, kv_stride, table_stride, out_stride,
                      lse_stride, compare_stride, num_pages, max_pages);
    }
    bool operator<(const GraphKey& other) const { return Tie() < other.Tie(); }
  };
  struct Graph {
    cudaGraphExec_t exec = nullptr;
  };

  absl::Status EnsureInit();
  // Copies inline tables and lengths to the device (before the graph, on the stream).
  absl::Status StageInlineTables(const VerifyJob& job);
  absl::StatusOr<cudaGraphExec_t> Capture(const GraphKey& key, const VerifyJob& job);
  // Grows a buffer whose device address graphs hold: growing drops them.
  cudaError_t ReserveForGraphs(StagingBuffer& buffer, size_t bytes);

  StreamSlot* const slot_;
  const int device_;
  const cudaStream_t stream_;
  std::atomic<int64_t>* const device_bytes_;
  kernels::MlaVerifyWorkspace* workspace_ = nullptr;
  int32_t* safe_lengths_ = nullptr;  // [max_batch] sanitized lengths
  uint8_t* invalid_ = nullptr;       // [max_batch]
  uint32_t* h_counts_ = nullptr;     // mapped [2]: invalid requests so far, in the last launch
  uint32_t* d_counts_ = nullptr;     // its device address
  kernels::VerifyCompareResult* partials_ = nullptr;  // [kVerifyCompareBlocks]
  kernels::VerifyCompareResult* h_result_ = nullptr;  // mapped
  kernels::VerifyCompareResult* d_result_ = nullptr;  // its device address
  StagingBuffer scratch_;            // shadow mode: our output [b, s_q, h_q, 512] bf16, dense
  StagingBuffer h_table_, d_table_;  // inline tables and lengths, staged
  LruCache<GraphKey, Graph> graphs_;
};

}  // namespace probesidecar::server
