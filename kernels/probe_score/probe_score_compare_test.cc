// The per-element comparison of probe_score_compare.h can fail: a correct CPU evaluation passes,
// and one planted wrong element, one NaN, or one error just past its bound fails it, also where
// the aggregate relative L2 error (the GPU test's only check before) stays far below 1e-3.
#include "kernels/probe_score/probe_score_compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "kernels/probe_score/probe_score_cpu.h"
#include "kernels/probe_score/probe_score_host_problem.h"

namespace probesidecar::kernels::probe_score_test {
namespace {

class CompareScoresTest : public ::testing::Test {
 protected:
  // bf16 activations, H = 1024, R x P = 256 x 64; scored by the CPU scorer.
  explicit CompareScoresTest(Activation act = Activation::kNone)
      : prob_({common::DType::kBFloat16, 300, 256, 1024, 64, 1024, act}, 77) {
    ScoreProbesCpu(prob_.params(), 0, prob_.shape().R);
  }

  ScoreComparison Compare(const std::vector<float>& out) const {
    const HostProblemShape& s = prob_.shape();
    return CompareScores(ScoreErrorModel{}, out.data(), prob_.out_stride(), prob_.ref().data(),
                         prob_.mag().data(), s.R, s.P, s.H, s.act);
  }

  double Bound(int32_t r, int32_t p) const {
    const HostProblemShape& s = prob_.shape();
    return ScoreErrorBound(ScoreErrorModel{}, prob_.mag()[r * s.P + p], s.H, s.act);
  }

  float& At(std::vector<float>& out, int32_t r, int32_t p) const {
    return out[r * prob_.out_stride() + p];
  }

  HostProblem prob_;
};

TEST_F(CompareScoresTest, CorrectScoresPass) {
  const ScoreComparison c = Compare(prob_.out());
  EXPECT_TRUE(c.ok()) << DescribeComparison(c);
  EXPECT_EQ(c.checked, 256 * 64);
  EXPECT_LT(c.worst_ratio, 0.1);  // a correct evaluation sits far inside the bound
}

// A gather bug: one score taken from the neighbouring row. The block's relative L2 error stays
// below the old 1e-3 criterion; the element is caught.
TEST_F(CompareScoresTest, OneWrongRowElementFails) {
  const int32_t r = 100, p = 7;
  std::vector<float> out = prob_.out();
  At(out, r, p) = At(out, r + 1, p);
  ASSERT_GT(std::fabs(prob_.ref()[(r + 1) * 64 + p] - prob_.ref()[r * 64 + p]), Bound(r, p));
  const ScoreComparison c = Compare(out);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.over_bound, 1);
  EXPECT_EQ(c.first.row, r);
  EXPECT_EQ(c.first.probe, p);
}

TEST_F(CompareScoresTest, ErrorOfTwiceTheBoundFailsWhereL2CannotSee) {
  const int32_t r = 31, p = 40;
  std::vector<float> out = prob_.out();
  At(out, r, p) = static_cast<float>(prob_.ref()[r * 64 + p] + 2.0 * Bound(r, p));
  const ScoreComparison c = Compare(out);
  EXPECT_LT(c.rel_l2, 1e-4);
  EXPECT_EQ(c.over_bound, 1);
}

TEST_F(CompareScoresTest, OneNaNFails) {
  std::vector<float> out = prob_.out();
  At(out, 255, 63) = std::numeric_limits<float>::quiet_NaN();
  const ScoreComparison c = Compare(out);
  EXPECT_FALSE(c.ok());
  EXPECT_EQ(c.over_bound, 1);
  EXPECT_EQ(c.non_finite, 1);
  EXPECT_EQ(c.first.row, 255);
}

TEST_F(CompareScoresTest, InfinityFails) {
  std::vector<float> out = prob_.out();
  At(out, 0, 0) = std::numeric_limits<float>::infinity();
  EXPECT_EQ(Compare(out).non_finite, 1);
  EXPECT_FALSE(Compare(out).ok());
}

// The bound is the formula's, not a looser one: just inside passes, just outside fails.
TEST_F(CompareScoresTest, BoundIsSharp) {
  const int32_t r = 5, p = 3;
  std::vector<float> out = prob_.out();
  const double want = prob_.ref()[r * 64 + p];
  At(out, r, p) = static_cast<float>(want + 0.9 * Bound(r, p));
  EXPECT_TRUE(Compare(out).ok());
  At(out, r, p) = static_cast<float>(want - 1.1 * Bound(r, p));
  EXPECT_FALSE(Compare(out).ok());
}

class CompareSigmoidScoresTest : public CompareScoresTest {
 protected:
  CompareSigmoidScoresTest() : CompareScoresTest(Activation::kSigmoid) {}
};

TEST_F(CompareSigmoidScoresTest, CorrectPassesWrongFails) {
  EXPECT_TRUE(Compare(prob_.out()).ok()) << DescribeComparison(Compare(prob_.out()));
  std::vector<float> out = prob_.out();
  At(out, 17, 9) = 1.0f - At(out, 17, 9);  // a flipped probability
  ASSERT_GT(std::fabs(1.0 - 2.0 * prob_.ref()[17 * 64 + 9]), Bound(17, 9));
  EXPECT_EQ(Compare(out).over_bound, 1);
}

TEST(ScoreErrorBoundTest, ScalesWithHiddenMagnitudeAndOperandRounding) {
  const ScoreErrorModel exact;
  const double b1 = ScoreErrorBound(exact, 10.0, 1024, Activation::kNone);
  EXPECT_NEAR(b1, 4.0 * 1025 * std::ldexp(1.0, -24) * 10.0, 1e-25);
  EXPECT_NEAR(ScoreErrorBound(exact, 20.0, 1024, Activation::kNone), 2 * b1, 1e-20);
  EXPECT_GT(ScoreErrorBound(exact, 10.0, 4096, Activation::kNone), 3.9 * b1);
  // W rounded to bf16 by the kernel but not by the reference: u_bf16 * M on top.
  ScoreErrorModel rounded;
  rounded.operand_u = UnitRoundoff(common::DType::kBFloat16);
  EXPECT_NEAR(ScoreErrorBound(rounded, 10.0, 1024, Activation::kNone) - b1,
              std::ldexp(1.0, -8) * 10.0, 1e-12);
  // Sigmoid: a quarter of the score's bound plus its own evaluation.
  EXPECT_NEAR(ScoreErrorBound(exact, 10.0, 1024, Activation::kSigmoid),
              b1 / 4 + 8 * std::ldexp(1.0, -24), 1e-20);
}

}  // namespace
}  // namespace probesidecar::kernels::probe_score_test
