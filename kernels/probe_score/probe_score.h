// Fused gather + linear-probe scoring on the GPU.
//
//   scores[r, p] = act(sum_h x[rows[r], h] * W[p, h] + b[p])      x: [T, H], W: [P, H]
//
// Three paths (see ChooseProbeScorePath for when each runs). Every launch is graph-capturable:
// no allocation, no host synchronisation and no device-property query per call. Everything a
// request changes (activation pointer and stride, output pointer and stride, row count, row
// indices) is read by the kernels from device memory the caller owns, so one captured graph
// serves every request of its shape: the caller rewrites ProbeScoreDeviceArgs and the row
// array, then replays.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_ref.h"

namespace probesidecar::kernels {

enum class ProbeScorePath : int32_t {
  kFusedCuda = 0,        // CUDA cores; each selected row read once; few probes
  kFusedTensorCore = 1,  // gather fused into a tensor-core GEMM (bf16/fp16 only)
  kGatherGemm = 2,       // gather into an L2-resident staging chunk, then cuBLAS
};
inline constexpr int kNumProbeScorePaths = 3;

// "fused_cuda", "fused_tc", "gather_gemm" (the names used in metrics and benchmarks).
const char* ProbeScorePathName(ProbeScorePath path);

// Probe weights on the device, laid out once when a probe set is loaded.
struct ProbeWeights {
  int32_t num_probes = 0;  // P
  int32_t hidden = 0;      // H
  const float* bias = nullptr;  // [P]
  // One copy per activation dtype, in whatever layout that dtype's kernels read (indexed by
  // static_cast<int>(DType)). Opaque to callers.
  const void* weight[common::kNumDTypes] = {nullptr, nullptr, nullptr};
  void* storage = nullptr;  // the single device allocation behind the pointers above
  size_t storage_bytes = 0;
};

// Uploads weight [P, H] and bias [P] (host float32) in every layout. Allocates and
// synchronises: call at load time only. On failure nothing stays allocated.
cudaError_t CreateProbeWeights(const float* weight, const float* bias, int32_t num_probes,
                               int32_t hidden, ProbeWeights* out);
cudaError_t DestroyProbeWeights(ProbeWeights* weights);

// What changes per request, in device memory (written by the caller before each launch or graph
// replay, e.g. by cudaMemcpyAsync from pinned memory inside the same graph).
struct ProbeScoreDeviceArgs {
  const void* x = nullptr;   // [T, H] activations, x_dtype
  int64_t x_row_stride = 0;  // elements between consecutive rows, >= H
  float* out = nullptr;      // [R, P] float32
  int64_t out_row_stride = 0;  // elements, >= P
  int32_t num_rows = 0;      // R, at most the launch's max_rows; rows past R are not touched
  int32_t pad_ = 0;
};

// Per-worker scratch, created once (allocates): a cuBLAS handle with its own workspace and the
// gather staging buffer. Not thread-safe: one per stream.
struct ProbeScoreWorkspace;

struct ProbeScoreWorkspaceConfig {
  int32_t max_rows = 8192;     // the largest max_rows any launch with this workspace uses
  int32_t max_hidden = 8192;   // the largest H
  int32_t max_probes = 4096;   // the largest P
};

cudaError_t CreateProbeScoreWorkspace(const ProbeScoreWorkspaceConfig& config,
                                      ProbeScoreWorkspace** out);
void DestroyProbeScoreWorkspace(ProbeScoreWorkspace* workspace);

struct ProbeScoreParams {
  common::DType x_dtype = common::DType::kBFloat16;
  const ProbeScoreDeviceArgs* args = nullptr;  // device pointer
  const int32_t* rows = nullptr;  // [max_rows] device; the first args->num_rows are used
  int32_t max_rows = 0;           // launch shape: grids are sized for this many rows
  const ProbeWeights* weights = nullptr;  // host struct of device pointers
  Activation activation = Activation::kNone;
};

// The path for a shape, from crossovers measured on the H200 (bench/results/probe_score.md).
ProbeScorePath ChooseProbeScorePath(int32_t num_rows, int32_t num_probes, int32_t hidden,
                                    common::DType dtype);

// Whether `path` can run this dtype and shape (fused_tc needs bf16/fp16).
bool ProbeScorePathSupports(ProbeScorePath path, common::DType dtype, int32_t num_probes, int32_t hidden);

// Enqueues the scoring on `stream`. Requires params.max_rows <= the workspace's max_rows.
// Returns cudaErrorInvalidValue for unsupported combinations, else the launch status
// (cudaGetLastError after the last launch).
cudaError_t LaunchProbeScore(const ProbeScoreParams& params, ProbeScorePath path,
                             ProbeScoreWorkspace* workspace, cudaStream_t stream);

}  // namespace probesidecar::kernels
