// The CPU scorer (the server's CPU backend) against the float64 reference: every element within
// its bound (probe_score_compare.h), the relative L2 error within 1e-5, the output gap untouched;
// each precision against float64 with the weights it promises (the file's, or rounded).
#include "kernels/probe_score/probe_score_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels/probe_score/probe_score_compare.h"
#include "kernels/probe_score/probe_score_host_problem.h"

namespace probesidecar::kernels::probe_score_test {
namespace {

TEST(ScoreProbesCpuTest, MatchesFloat64OnRandomData) {
  const HostProblemShape shapes[] = {
      {common::DType::kFloat32, 50, 20, 257, 5, 257, Activation::kNone},
      {common::DType::kFloat32, 40, 33, 1024, 3, 1031, Activation::kSigmoid},
      {common::DType::kFloat16, 30, 17, 999, 7, 1001, Activation::kNone},
      {common::DType::kFloat16, 64, 64, 2048, 2, 2048, Activation::kSigmoid},
      {common::DType::kBFloat16, 25, 40, 513, 9, 520, Activation::kNone},
      {common::DType::kBFloat16, 9, 12, 4096, 1, 4097, Activation::kSigmoid},
  };
  uint64_t seed = 1;
  for (const HostProblemShape& s : shapes) {
    SCOPED_TRACE(std::string(common::DTypeName(s.dtype)) + " H=" + std::to_string(s.H));
    HostProblem prob(s, seed++);
    // Split the rows the way the CPU backend's threads do.
    ScoreProbesCpu(prob.params(), 0, s.R / 3);
    ScoreProbesCpu(prob.params(), s.R / 3, s.R);
    const ScoreComparison c =
        CompareScores(ScoreErrorModel{}, prob.out().data(), prob.out_stride(), prob.ref().data(),
                      prob.mag().data(), s.R, s.P, s.H, s.act);
    EXPECT_TRUE(c.ok()) << DescribeComparison(c);
    EXPECT_LE(c.rel_l2, 1e-5);
    for (int32_t r = 0; r < s.R; ++r) {
      for (int64_t j = s.P; j < prob.out_stride(); ++j) {
        EXPECT_TRUE(std::isnan(prob.out()[r * prob.out_stride() + j])) << "gap touched, row " << r;
      }
    }
  }
}

TEST(ScoreProbesCpuTest, DuplicateRowsGiveIdenticalScores) {
  HostProblem prob({common::DType::kBFloat16, 8, 4, 300, 4, 300, Activation::kNone}, 9);
  prob.SetRows({3, 3, 7, 3});
  ScoreProbesCpu(prob.params(), 0, 4);
  const int64_t ld = prob.out_stride();
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(prob.out()[0 * ld + j], prob.out()[1 * ld + j]);
    EXPECT_EQ(prob.out()[0 * ld + j], prob.out()[3 * ld + j]);
  }
}

// Scores every row of `prob` at `precision` (optionally with the weights rounded once, as the CPU
// backend caches them) and returns the [R, P] block.
std::vector<float> ScoreAll(HostProblem& prob, ProbePrecision precision,
                            const float* rounded_weight = nullptr) {
  ProbeScoreCpuParams p = prob.params();
  p.precision = precision;
  p.rounded_weight = rounded_weight;
  const HostProblemShape& s = prob.shape();
  ScoreProbesCpu(p, 0, s.R / 2);
  ScoreProbesCpu(p, s.R / 2, s.R);
  std::vector<float> out(static_cast<size_t>(s.R) * s.P);
  for (int32_t r = 0; r < s.R; ++r) {
    for (int32_t j = 0; j < s.P; ++j) out[r * s.P + j] = prob.out()[r * prob.out_stride() + j];
  }
  return out;
}

struct Reference {
  std::vector<double> want, magnitude;
};

Reference RefAt(HostProblem& prob, ProbePrecision precision) {
  ProbeScoreCpuParams p = prob.params();
  p.precision = precision;
  const size_t n = static_cast<size_t>(p.num_rows) * p.num_probes;
  Reference ref{std::vector<double>(n), std::vector<double>(n)};
  ProbeScoreRefF64(p, ref.want.data(), ref.magnitude.data());
  return ref;
}

ScoreComparison Compare(const ScoreErrorModel& model, const std::vector<float>& got,
                        const Reference& ref, const HostProblemShape& s) {
  return CompareScores(model, got.data(), s.P, ref.want.data(), ref.magnitude.data(), s.R, s.P, s.H,
                       s.act);
}

// exact scores with the file's float32 weights; fast with the weights rounded to the 16-bit
// activations' type, which moves the scores measurably (the weights here are not representable
// in 16 bits: they are drawn as float32).
TEST(ScoreProbesCpuTest, PrecisionExactUsesTheFileWeightsFastTheRoundedOnes) {
  const HostProblemShape shapes[] = {
      {common::DType::kBFloat16, 40, 33, 1024, 20, 1030, Activation::kNone},
      {common::DType::kBFloat16, 16, 9, 4096, 3, 4096, Activation::kSigmoid},
      {common::DType::kFloat16, 30, 17, 999, 7, 1001, Activation::kNone},
  };
  uint64_t seed = 100;
  for (const HostProblemShape& s : shapes) {
    SCOPED_TRACE(std::string(common::DTypeName(s.dtype)) + " H=" + std::to_string(s.H));
    HostProblem prob(s, seed++);
    const Reference exact_ref = RefAt(prob, ProbePrecision::kExact);
    const Reference fast_ref = RefAt(prob, ProbePrecision::kFast);
    const std::vector<float> exact = ScoreAll(prob, ProbePrecision::kExact);
    const std::vector<float> fast = ScoreAll(prob, ProbePrecision::kFast);

    // Each within fp32 accumulation bounds of float64 with its own weights.
    ScoreComparison c = Compare(ScoreErrorModel{}, exact, exact_ref, s);
    EXPECT_TRUE(c.ok()) << "exact: " << DescribeComparison(c);
    c = Compare(ScoreErrorModel{}, fast, fast_ref, s);
    EXPECT_TRUE(c.ok()) << "fast: " << DescribeComparison(c);

    // fast is off the file's weights by the rounding (within u_op of the dtype), measurably: the
    // block's relative error is far above exact's (fp32 accumulation alone), and nearly every
    // score differs. (Per element, exact's bound c * H * 2^-24 * M is too loose to tell.)
    ScoreErrorModel rounded;
    rounded.operand_u = UnitRoundoff(s.dtype);
    c = Compare(rounded, fast, exact_ref, s);
    EXPECT_TRUE(c.ok()) << "fast against the file's weights, with u_op: " << DescribeComparison(c);
    const double exact_rel_l2 = Compare(ScoreErrorModel{}, exact, exact_ref, s).rel_l2;
    EXPECT_GT(c.rel_l2, UnitRoundoff(s.dtype) / 64) << DescribeComparison(c);
    EXPECT_GT(c.rel_l2, 100 * exact_rel_l2) << DescribeComparison(c);
    int64_t differ = 0;
    for (size_t i = 0; i < fast.size(); ++i) differ += fast[i] != exact[i];
    // (A saturated sigmoid can hide the difference.)
    if (s.act == Activation::kNone) {
      EXPECT_GT(differ, static_cast<int64_t>(fast.size()) * 9 / 10);
    }

    // The weights rounded once per set (the CPU backend's cache) give the same scores.
    std::vector<float> cached(static_cast<size_t>(s.P) * s.H);
    RoundProbeWeights(prob.params().weight, static_cast<int64_t>(cached.size()), s.dtype,
                      cached.data());
    EXPECT_EQ(ScoreAll(prob, ProbePrecision::kFast, cached.data()), fast);
    // ... and exact never reads them.
    EXPECT_EQ(ScoreAll(prob, ProbePrecision::kExact, cached.data()), exact);
  }
}

TEST(ScoreProbesCpuTest, PrecisionFastIsExactOnFloat32Activations) {
  HostProblem prob({common::DType::kFloat32, 20, 11, 777, 5, 780, Activation::kNone}, 7);
  EXPECT_EQ(ScoreAll(prob, ProbePrecision::kFast), ScoreAll(prob, ProbePrecision::kExact));
  const Reference exact_ref = RefAt(prob, ProbePrecision::kExact);
  const Reference fast_ref = RefAt(prob, ProbePrecision::kFast);
  EXPECT_EQ(fast_ref.want, exact_ref.want);
}

TEST(ScoreProbesCpuTest, RoundProbeWeightsKeepsTheDtypesSignificandBits) {
  // bf16's unit in the last place at 1 is 2^-7, fp16's 2^-10.
  const float w[] = {1.0f + 0x1p-8f, 1.0f + 0x1p-7f + 0x1p-8f, 1.0f + 0x1p-12f, -3.0f, 0.1f};
  float out[5];
  RoundProbeWeights(w, 5, common::DType::kBFloat16, out);
  EXPECT_EQ(out[0], 1.0f);            // a tie, to even (down)
  EXPECT_EQ(out[1], 1.0f + 0x1p-6f);  // a tie, to even (up)
  EXPECT_EQ(out[2], 1.0f);            // under half a unit
  EXPECT_EQ(out[3], -3.0f);
  EXPECT_EQ(out[4], common::Bf16ToFloat(common::FloatToBf16(0.1f)));
  EXPECT_NE(out[4], 0.1f);
  RoundProbeWeights(w, 5, common::DType::kFloat16, out);
  EXPECT_EQ(out[0], w[0]);  // representable in fp16
  EXPECT_EQ(out[1], w[1]);
  EXPECT_EQ(out[2], 1.0f);
  EXPECT_EQ(out[4], common::HalfToFloat(common::FloatToHalf(0.1f)));
  EXPECT_NE(out[4], 0.1f);
  RoundProbeWeights(w, 5, common::DType::kFloat32, out);
  EXPECT_EQ(out[4], 0.1f);
}

}  // namespace
}  // namespace probesidecar::kernels::probe_score_test
