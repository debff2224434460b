// The tests' check of probe scores against the float64 reference (probe_score_ref.h): every
// element within a bound derived from how the score is computed, and the relative L2 error of the
// whole block. Header-only plain C++, shared by the CPU and GPU tests.
//
// Why this bound. Every path multiplies operands that are exact in fp32 and adds in fp32:
//  - bf16 x bf16 products need at most 16 significant bits and fp16 x fp16 at most 22: exact in
//    fp32's 24. The operand type's own roundoff (2^-8, 2^-11) therefore never enters as long as
//    the kernel multiplies the numbers the reference multiplies (the tests draw W in the
//    activations' dtype); where a kernel rounds W or x first, that rounding's unit roundoff u_op
//    adds u_op * sum_h |x_h w_h| (|w - fl(w)| <= u_op |w|).
//  - fp32 x fp32 products are exact inside an FMA (fused_cuda, cuBLAS SGEMM), or rounded once.
// What remains is the fp32 sum of n = H + 1 terms (the bias too) in whatever order the path uses
// (per-lane chains, shuffle trees, mma blocks, split-K partials, cuBLAS's own). For any order the
// error is at most ~ n * u * sum |terms| with u = 2^-24 (u per addition, each partial sum bounded
// by sum |terms|). c = 4 on top covers tensor cores that truncate instead of rounding (2u per
// addition) and align a block of products to the largest before adding (at most doubling that
// again); CUDA-core FMA chains need c = 1. So, with M = sum_h |x_h w_h| + |b| from the reference:
//   |out - ref| <= (u_op + c * n * u) * M + floor                      (no activation)
//   |out - ref| <= that / 4 + 8u                                       (sigmoid)
// because the sigmoid is 1/4-Lipschitz and its fp32 evaluation (expf within 2 ulp, one add, one
// divide) adds a few u to a value in (0, 1). NaN or infinity is always over the bound.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_activation.h"

namespace probesidecar::kernels {

// Unit roundoff of a dtype: half the distance from 1 to the next number.
inline double UnitRoundoff(common::DType dtype) {
  switch (dtype) {
    case common::DType::kFloat32:
      return std::ldexp(1.0, -24);
    case common::DType::kFloat16:
      return std::ldexp(1.0, -11);
    case common::DType::kBFloat16:
      return std::ldexp(1.0, -8);
  }
  return 1.0;
}

struct ScoreErrorModel {
  double operand_u = 0.0;  // u_op: a rounding of W or x the reference did not see (0: none)
  double accumulation_u = std::ldexp(1.0, -24);  // u: fp32 sums
  double order_factor = 4.0;                     // c
  double floor = 1e-30;                          // absolute, for scores whose every term underflows
};

// The largest |out - ref| a correct evaluation can show, for magnitude M (see above).
inline double ScoreErrorBound(const ScoreErrorModel& model, double magnitude, int32_t hidden,
                              Activation activation) {
  const double terms = static_cast<double>(hidden) + 1.0;
  const double z_bound =
      (model.operand_u + model.order_factor * terms * model.accumulation_u) * magnitude +
      model.floor;
  return activation == Activation::kSigmoid ? z_bound / 4.0 + 8.0 * model.accumulation_u : z_bound;
}

struct ScoreMismatch {
  int32_t row = -1, probe = -1;
  double got = 0.0, want = 0.0, bound = 0.0;
};

struct ScoreComparison {
  int64_t checked = 0;
  int64_t over_bound = 0;    // elements not within their bound (NaN and infinities included)
  int64_t non_finite = 0;    // of those, NaN or infinite
  double worst_ratio = 0.0;  // max |got - want| / bound over the finite elements
  double rel_l2 = 0.0;       // ||got - want|| / ||want|| over the finite elements
  ScoreMismatch first;       // the first element (row-major) over its bound, if any
  bool ok() const { return over_bound == 0; }
};

// Compares got [R, got_row_stride] (the first P of each row) with want and magnitude [R, P]
// (contiguous, from ProbeScoreRefF64).
inline ScoreComparison CompareScores(const ScoreErrorModel& model, const float* got,
                                     int64_t got_row_stride, const double* want,
                                     const double* magnitude, int32_t num_rows, int32_t num_probes,
                                     int32_t hidden, Activation activation) {
  ScoreComparison c;
  double num = 0.0, den = 0.0;
  for (int32_t r = 0; r < num_rows; ++r) {
    for (int32_t p = 0; p < num_probes; ++p) {
      const int64_t i = static_cast<int64_t>(r) * num_probes + p;
      const double g = got[static_cast<int64_t>(r) * got_row_stride + p];
      const double bound = ScoreErrorBound(model, magnitude[i], hidden, activation);
      const double err = std::fabs(g - want[i]);
      ++c.checked;
      if (std::isfinite(g)) {
        num += (g - want[i]) * (g - want[i]);
        den += want[i] * want[i];
        if (err / bound > c.worst_ratio) c.worst_ratio = err / bound;
      } else {
        ++c.non_finite;
      }
      if (!(err <= bound)) {  // written so that NaN fails
        if (c.over_bound++ == 0) c.first = ScoreMismatch{r, p, g, want[i], bound};
      }
    }
  }
  c.rel_l2 = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  return c;
}

inline std::string DescribeComparison(const ScoreComparison& c) {
  char buf[320];
  int n = std::snprintf(buf, sizeof(buf),
                        "%lld of %lld elements over their bound (%lld not finite); worst "
                        "|err|/bound %.3g; rel L2 %.3e",
                        static_cast<long long>(c.over_bound), static_cast<long long>(c.checked),
                        static_cast<long long>(c.non_finite), c.worst_ratio, c.rel_l2);
  if (c.over_bound > 0 && n > 0 && n < static_cast<int>(sizeof(buf))) {
    std::snprintf(buf + n, sizeof(buf) - n,
                  "; first at row %d probe %d: got %.9g, want %.9g, bound %.3g", c.first.row,
                  c.first.probe, c.first.got, c.first.want, c.first.bound);
  }
  return buf;
}

}  // namespace probesidecar::kernels
