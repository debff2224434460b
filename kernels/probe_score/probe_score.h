// Fused gather + linear-probe scoring on the GPU: the API the server calls.
//
//   scores[r, p] = act(sum_h x[rows[r], h] * W[p, h] + b[p])      x: [T, H], W: [P, H]
//
// The paths are the ProbeScorePath values (probe_score_plan.h); ChooseProbeScorePath picks one
// per shape. Use, per stream:
//   once        CreateProbeScoreWorkspace(config, stream) (reads the device facts, allocates every
//               buffer, binds its cuBLAS handle to the stream); CreateProbeWeights per probe set
//               (lays the weights out and encodes their tensor maps).
//   per graph   shape = {dtype, max_rows bucket, P, H, precision};
//   (capture)   resources = ProbeScoreWorkspaceResources(*workspace);
//               path = ChooseProbeScorePath(shape, resources.device);
//               PlanProbeScore(shape, path, resources, {}, &plan);
//               capture whatever writes the request's ProbeScoreDeviceArgs and rows into the
//               device memory the params name (the server's graph: the staging kernel of
//               kernels/request_staging, from its kernel-node parameters), then
//               LaunchProbeScore(plan, params, workspace, stream).
//   per request give the graph the request's arguments and rows (the server: it updates the
//               staging node's parameters) and replay it.
// LaunchProbeScore re-plans nothing, queries no device property, encodes no tensor map,
// configures no cuBLAS state and allocates nothing, so it can be captured. Everything a request
// changes (activation pointer and stride, output pointer and stride, row count, row indices) is
// read by the kernels from device memory the caller owns (ProbeScoreDeviceArgs and the row array),
// so one captured graph serves every request of its shape.
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_activation.h"
#include "kernels/probe_score/probe_score_params.h"
#include "kernels/probe_score/probe_score_plan.h"
#include "kernels/probe_score/probe_score_precision.h"

namespace probesidecar::kernels {

// Probe weights on the device, laid out once when a probe set is loaded.
struct ProbeWeights {
  int32_t num_probes = 0;  // P
  int32_t hidden = 0;      // H
  ProbePrecision precision = ProbePrecision::kExact;
  const float* bias = nullptr;  // [P]
  // One copy per activation dtype, in whatever layout that dtype's kernels read (indexed by
  // static_cast<int>(DType)): float32 [p_pad, h_pad]; for the 16-bit types, fast: the rounded
  // weights [p_pad, h_pad]; exact: kExactTerms planes [term, p_pad, h_pad] whose sum is the
  // float32 weight times term_scale[dtype]. Opaque to callers.
  const void* weight[common::kNumDTypes] = {nullptr, nullptr, nullptr};
  // The multiplier folded into the 16-bit terms (a power of two: fp16 exact terms are scaled into
  // fp16's range); the kernels multiply their sums by 1 / term_scale. 1 otherwise.
  float term_scale[common::kNumDTypes] = {1.0f, 1.0f, 1.0f};
  int64_t term_stride = 0;  // elements between term planes (p_pad * h_pad)
  // gather_wgmma's warp-specialised tile reads W by TMA, through the tensor map of the dtype's
  // plane (fast precision, 16-bit dtypes), encoded once by CreateProbeWeights;
  // weight_map_ready[dtype] says whether it is (not for exact precision, float32, or a driver
  // without the tensor-map encoder).
  CUtensorMap weight_map[common::kNumDTypes] = {};
  bool weight_map_ready[common::kNumDTypes] = {false, false, false};
  void* storage = nullptr;  // the single device allocation behind the pointers above
  size_t storage_bytes = 0;
};

// Terms a 16-bit weight plane holds: 3 for exact, 1 for fast.
inline int32_t WeightTerms(ProbePrecision precision) {
  return precision == ProbePrecision::kExact ? 3 : 1;
}

// Uploads weight [P, H] and bias [P] (host float32) in every dtype's layout for `precision`.
// Allocates and synchronises: call at load time only. On failure nothing stays allocated.
cudaError_t CreateProbeWeights(const float* weight, const float* bias, int32_t num_probes,
                               int32_t hidden, ProbePrecision precision, ProbeWeights* out);
cudaError_t DestroyProbeWeights(ProbeWeights* weights);

// Per-stream scratch, created once for one stream (allocates, reads the current device's facts and
// sets the kernels' attributes): a cuBLAS handle bound to that stream with its own scratch,
// split-K partials and counters, and the gather staging buffers. One stream's, so not
// thread-safe: LaunchProbeScore refuses any other stream.
struct ProbeScoreWorkspace;

cudaError_t CreateProbeScoreWorkspace(const ProbeScoreWorkspaceConfig& config, cudaStream_t stream,
                                      ProbeScoreWorkspace** out);
// Frees everything, also after an error; returns the first error met.
cudaError_t DestroyProbeScoreWorkspace(ProbeScoreWorkspace* workspace);

// What plans for this workspace are made from: the device facts and the buffer limits.
const ProbeScoreResources& ProbeScoreWorkspaceResources(const ProbeScoreWorkspace& workspace);

// The pointers a launch binds (the shape and dtype are the plan's).
struct ProbeScoreParams {
  const ProbeScoreDeviceArgs* args = nullptr;  // [1] device
  const int32_t* rows = nullptr;  // [plan max_rows] device; the first args->num_rows are used
  const ProbeWeights* weights = nullptr;  // host struct of device pointers, P and H = the plan's
  Activation activation = Activation::kNone;
};

// The run: enqueues the plan on `stream`, the workspace's (pointer math and launches only).
// Refuses before enqueuing anything, with
//   cudaErrorInvalidResourceHandle  a stream other than the workspace's;
//   cudaErrorInvalidValue           params that do not match the plan (weights of another P, H
//                                   or precision; missing pointers), a plan that does not fit the
//                                   workspace, or a plan whose launch is not that of its path (as
//                                   PlanProbeScore fills only the path's own);
//   cudaErrorInvalidDeviceFunction  a path the workspace's device cannot run;
// else returns the launch status (cudaGetLastError after each launch).
cudaError_t LaunchProbeScore(const ProbeScorePlan& plan, const ProbeScoreParams& params,
                             ProbeScoreWorkspace* workspace, cudaStream_t stream);

}  // namespace probesidecar::kernels
