// The CPU scorer: probe scoring for the server's CPU backend (inline tensors, no GPU). Plain C++:
// no CUDA, gRPC, protobuf or absl.
#pragma once

#include <cstdint>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_activation.h"
#include "kernels/probe_score/probe_score_precision.h"

namespace probesidecar::kernels {

struct ProbeScoreCpuParams {
  const void* x = nullptr;  // [T, x_row_stride] x_dtype; row t starts at element t * x_row_stride
  common::DType x_dtype = common::DType::kFloat32;
  int64_t x_row_stride = 0;       // elements, >= hidden
  const int32_t* rows = nullptr;  // [R], each in [0, T) (checked by the caller)
  int32_t num_rows = 0;           // R
  const float* weight = nullptr;  // [P, H] float32, contiguous: the file's weights
  const float* bias = nullptr;    // [P]
  int32_t hidden = 0;             // H
  int32_t num_probes = 0;         // P
  Activation activation = Activation::kNone;
  float* out = nullptr;        // [R, out_row_stride] float32
  int64_t out_row_stride = 0;  // elements, >= num_probes
  // exact: `weight` as it is. fast on 16-bit activations: `weight` rounded to x_dtype, the
  // numbers the GPU's tensor-core paths multiply (UsesRoundedWeights); on float32 activations
  // fast is exact.
  ProbePrecision precision = ProbePrecision::kExact;
  // Optional, read only when UsesRoundedWeights: RoundProbeWeights of `weight` to x_dtype, made
  // once per probe set by the caller. Null: ScoreProbesCpu rounds them on each call (P * H
  // conversions, as many as one row's multiply-adds).
  const float* rounded_weight = nullptr;
};

// Whether scoring `x_dtype` activations at `precision` multiplies rounded weights.
inline bool UsesRoundedWeights(ProbePrecision precision, common::DType x_dtype) {
  return precision == ProbePrecision::kFast && x_dtype != common::DType::kFloat32;
}

// out[i] = weight[i] rounded to the nearest `dtype` value (ties to even) and back to float32: the
// 8 significand bits of bf16 or the 11 of fp16. float32: a copy.
void RoundProbeWeights(const float* weight, int64_t count, common::DType dtype, float* out);

// Scores output rows [row_begin, row_end): fp32 products (of the weights `precision` names)
// accumulated in fp32, then bias and activation. Callers split [0, R) across threads; ranges do not
// share output.
void ScoreProbesCpu(const ProbeScoreCpuParams& params, int32_t row_begin, int32_t row_end);

}  // namespace probesidecar::kernels
