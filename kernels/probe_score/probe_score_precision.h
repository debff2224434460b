// A probe set's precision: how its float32 weights meet 16-bit activations. Shared by the GPU
// kernels, the CPU scorer, the probe sets that carry it and the service that reports it. Plain
// C++ (also compiled by nvcc).
//
//   exact  the file's float32 weights and float32 math on every path. On tensor cores each weight
//          is split into three terms of the activations' 16-bit type whose sum is the float32
//          weight (bf16: hi + mid + lo, 8 + 8 + 8 significand bits; fp16: the same on weights
//          scaled by a power of two into fp16's range), so a row is multiplied three times and
//          every product is exact in the float32 accumulator.
//   fast   the weights rounded once to the activations' 16-bit type (tensor-core paths); a bf16
//          weight keeps 8 significant bits, so scores move by up to ~2^-9 of sum |x w|.
// float32 activations, and the CUDA-core path, always use the float32 weights.
#pragma once

#include <cstdint>
#include <cstring>

namespace probesidecar::kernels {

enum class ProbePrecision : int32_t { kExact = 0, kFast = 1 };

// What a load asks for: a precision, or the default for the set's shape.
enum class ProbePrecisionRequest : int32_t { kDefault = 0, kExact = 1, kFast = 2 };

// Probe counts up to this one default to exact: there the dispatcher runs fused_cuda, which
// multiplies the float32 weights anyway, so exact costs nothing. Above, the worst measured cost
// is 1.20x at P = 4 and 1.9-2.9x from P = 16 (at R = 8192; 6-43% at R <= 64): three weight terms
// per tensor-core tile (bench/results/probe_score.md, "Precision"), above the 5% a default may
// cost.
inline constexpr int32_t kExactByDefaultMaxProbes = 2;

inline ProbePrecision ResolveProbePrecision(ProbePrecisionRequest request, int32_t num_probes) {
  switch (request) {
    case ProbePrecisionRequest::kExact:
      return ProbePrecision::kExact;
    case ProbePrecisionRequest::kFast:
      return ProbePrecision::kFast;
    case ProbePrecisionRequest::kDefault:
      break;
  }
  return num_probes <= kExactByDefaultMaxProbes ? ProbePrecision::kExact : ProbePrecision::kFast;
}

// "exact", "fast" (flags, metrics labels, benchmark results).
inline const char* ProbePrecisionName(ProbePrecision precision) {
  return precision == ProbePrecision::kFast ? "fast" : "exact";
}

// Parses "default" (or "auto"), "exact" and "fast"; false for anything else.
inline bool ParseProbePrecisionRequest(const char* text, ProbePrecisionRequest* out) {
  if (std::strcmp(text, "default") == 0 || std::strcmp(text, "auto") == 0) {
    *out = ProbePrecisionRequest::kDefault;
  } else if (std::strcmp(text, "exact") == 0) {
    *out = ProbePrecisionRequest::kExact;
  } else if (std::strcmp(text, "fast") == 0) {
    *out = ProbePrecisionRequest::kFast;
  } else {
    return false;
  }
  return true;
}

}  // namespace probesidecar::kernels
