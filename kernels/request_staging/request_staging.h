// Staging a request on the device from kernel parameters, so that a captured graph needs no
// host-to-device copy: its first node, the staging kernel, receives the request's argument block
// and row indices by value (updated per request with cudaGraphExecKernelNodeSetParams, which
// leaves launches already queued untouched) and writes them where the graph's other kernels read
// them. Row indices may instead come from a device buffer the caller wrote on its own stream;
// either way each is checked against [0, T) on the GPU: an invalid one is replaced by row 0 (so
// nothing reads out of bounds), flagged, and counted, and a later poison kernel writes NaN into
// that row's outputs.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace probesidecar::kernels {

// The argument block copied verbatim (the scoring kernels' own device-args struct, plus what
// the poison kernel reads), and the rows carried in the parameters: together under the 4 KB of
// classic kernel parameters.
inline constexpr int kMaxStagedArgsBytes = 128;
inline constexpr int kMaxInlineRows = 928;

struct StageRequestParams {
  // Where to stage (the caller's device memory, fixed when the graph is captured).
  void* args_dst = nullptr;        // [kMaxStagedArgsBytes] bytes
  int32_t* rows_dst = nullptr;     // [bucket]; nullptr: rows are not staged
  uint8_t* invalid_dst = nullptr;  // [bucket] 1 where the row was out of range; may be nullptr
  // [2] counts of invalid rows: [0] running total, [1] this request's. Host-mapped memory is fine
  // (one thread writes them, launches on a stream run in order); may be nullptr.
  uint32_t* invalid_counts = nullptr;
  // The request.
  const int32_t* device_rows = nullptr;  // [num_rows] on the device; nullptr: inline_rows
  int64_t num_tokens = 0;                // T: valid rows are [0, T)
  int32_t num_rows = 0;                  // R <= bucket (and <= kMaxInlineRows when inline)
  int32_t bucket = 0;                    // rows_dst[R, bucket) are set to 0
  int32_t args_bytes = 0;                // <= kMaxStagedArgsBytes
  int32_t pad_ = 0;
  alignas(16) unsigned char args[kMaxStagedArgsBytes] = {};
  int32_t inline_rows[kMaxInlineRows] = {};
};

// One block stages everything; enqueue it on `stream` (or capture it). cudaErrorInvalidValue for
// params out of range.
cudaError_t LaunchStageRequest(const StageRequestParams& params, cudaStream_t stream);

// The kernel-node parameters of that launch, for cudaGraphExecKernelNodeSetParams:
// `node->kernelParams` is `pointer_storage`, which is set to point at `params`; both must stay
// alive until that call returns (it copies the values).
cudaError_t StageRequestNodeParams(const StageRequestParams* params, void** pointer_storage,
                                   cudaKernelNodeParams* node);

// What the poison kernel reads per request (staged by the staging kernel with the arguments).
struct PoisonDescriptor {
  float* out = nullptr;        // [R, out_row_stride] float32 scores
  int64_t out_row_stride = 0;  // elements
  int32_t num_rows = 0;        // R
  int32_t pad_ = 0;
};

struct PoisonInvalidRowsParams {
  const PoisonDescriptor* descriptor = nullptr;  // device
  const uint8_t* invalid = nullptr;              // [bucket] device
  int32_t bucket = 0;                            // launch shape
  int32_t num_columns = 0;                       // P: columns of each row written with NaN
};

// Writes NaN into every output row flagged invalid (grid: one block per bucket row).
cudaError_t LaunchPoisonInvalidRows(const PoisonInvalidRowsParams& params, cudaStream_t stream);

}  // namespace probesidecar::kernels
