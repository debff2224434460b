// The plain parameter structs of probe scoring: what a request writes into device memory
// (ProbeScoreDeviceArgs), and what each kernel receives by value (`__grid_constant__ const`).
// Every pointer is commented with its shape; strides and extents are in elements. Plain C++: the
// host-side run fills the kernel structs from a plan, the kernels read them.
#pragma once

#include <cstdint>

namespace probesidecar::kernels {

// What changes per request, in device memory (written before each launch or graph replay by
// whatever precedes the kernels on the stream: in the server's graph, the staging kernel of
// kernels/request_staging). The kernels read it on the device, so one captured graph serves every
// request of its shape.
struct ProbeScoreDeviceArgs {
  const void* x = nullptr;     // [T, x_row_stride] activations of the plan's dtype
  int64_t x_row_stride = 0;    // elements between consecutive rows, >= H
  float* out = nullptr;        // [R, out_row_stride] float32 scores
  int64_t out_row_stride = 0;  // elements, >= P
  int32_t num_rows = 0;        // R, at most the plan's max_rows; rows past R are not touched
  int32_t pad_ = 0;
};

namespace probe_score_detail {

// fused_cuda (probe_score_fused_cuda.cuh).
struct FusedCudaParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // [1] device
  const int32_t* rows = nullptr;               // [max_rows]
  const float* weight = nullptr;               // [p_pad, w_row_stride] fp32, zero padded
  const float* bias = nullptr;                 // [P]
  float* partial = nullptr;     // [splits, max_rows, probe_tiles * kPT] fp32 (splits > 1 only)
  int32_t* counters = nullptr;  // [probe_tiles * row_groups], zero between launches
  int32_t max_rows = 0;
  int32_t hidden = 0;        // H
  int32_t num_probes = 0;    // P
  int32_t w_row_stride = 0;  // elements, multiple of kHiddenPad
  int32_t splits = 1;        // K splits (gridDim.y)
  int32_t k_per_split = 0;   // elements, a multiple of the chunk granularity (32 * vector)
  int32_t k_per_smem = 0;    // elements of W held in shared memory at once (same multiple)
  int32_t row_groups = 0;    // gridDim.x; block g handles row blocks g, g + row_groups, ...
  int32_t probe_tiles = 0;   // gridDim.z
  int32_t activation = 0;    // Activation
};

// fused_tc (probe_score_fused_tc.cuh) and gather_wgmma (probe_score_wgmma_sm90a.cuh).
struct TcParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // [1] device
  const int32_t* rows = nullptr;               // [max_rows]
  const void* weight = nullptr;  // [terms, p_pad, w_row_stride] bf16/fp16 (the activation dtype)
  int64_t term_stride = 0;       // elements between weight terms (exact precision: 3 terms)
  float acc_scale = 1.0f;        // multiplies the sums (1 / the terms' power-of-two scale)
  const float* bias = nullptr;   // [P]
  float* partial = nullptr;      // [splits, partial_rows, partial_ld] fp32 (splits > 1 only)
  int32_t partial_rows = 0;      // m_tiles * BM
  int32_t partial_ld = 0;        // n_tiles * BN, elements
  int32_t max_rows = 0;
  int32_t hidden = 0;        // H, a multiple of 8
  int32_t num_probes = 0;    // P
  int32_t w_row_stride = 0;  // elements, multiple of kHiddenPad
  int32_t w_rows = 0;        // rows of each W term (P padded to kProbePad); gather_wgmma only
  int32_t k_tiles = 0;       // ceil(H / BK)
  int32_t splits = 1;        // gridDim.z
  int32_t activation = 0;
};

// The split-K reduction of fused_tc: a second kernel, so the sum runs in split order on every
// SM at once (deterministic, no counters) instead of in one last-arriving CTA.
struct SplitKReduceParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // [1] device
  const float* partial = nullptr;              // [splits, partial_rows, partial_ld]
  const float* bias = nullptr;                 // [P]
  int32_t splits = 0;
  int32_t partial_rows = 0;
  int32_t partial_ld = 0;  // elements
  int32_t max_rows = 0;
  int32_t num_probes = 0;
  int32_t activation = 0;
};

// gather_gemm (probe_score_gather_gemm.cuh): the gather before cuBLAS ...
struct GatherParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // [1] device
  const int32_t* rows = nullptr;               // [max_rows]
  void* staging = nullptr;                     // [chunk_rows, hidden] x dtype, contiguous
  int32_t hidden = 0;
  int32_t row_begin = 0;  // first output row of this chunk
  int32_t chunk_rows = 0;
};

// ... and the bias / activation epilogue after it.
struct EpilogueParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // [1] device
  const float* c = nullptr;     // [chunk_rows, ldc] fp32, the GEMM result for rows row_begin..
  int32_t ldc = 0;              // elements
  const float* bias = nullptr;  // [P]
  int32_t num_probes = 0;
  int32_t row_begin = 0;
  int32_t chunk_rows = 0;
  int32_t activation = 0;
};

}  // namespace probe_score_detail
}  // namespace probesidecar::kernels
