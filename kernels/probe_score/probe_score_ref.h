// The float64 reference of probe scoring: the tests' oracle, never production code (the server's
// CPU backend runs ScoreProbesCpu). It takes the CPU scorer's params so that a test states a
// problem once and hands it to both; it reads the inputs only (out and out_row_stride are not
// read). Plain C++.
#pragma once

#include "kernels/probe_score/probe_score_cpu.h"

namespace probesidecar::kernels {

// out [R, P] double, contiguous: products and sums in float64, then bias and activation. With
// `magnitude` non-null, magnitude [R, P] = sum_h |x[rows[r], h] * W[p, h]| + |b[p]| (in float64):
// the scale of the rounding errors any fp32 evaluation of that score can make
// (probe_score_compare.h). Honours params.precision: for fast on 16-bit activations W is the
// file's weights rounded to x_dtype here (params.rounded_weight is never read and the rounding is
// its own, so that a wrong cache or rounding cannot agree with itself); otherwise the file's
// weights as they are.
void ProbeScoreRefF64(const ProbeScoreCpuParams& params, double* out, double* magnitude = nullptr);

}  // namespace probesidecar::kernels
