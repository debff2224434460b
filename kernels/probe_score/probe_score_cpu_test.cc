// The CPU scorer (the server's CPU backend) against the float64 reference: every element within
// its bound (probe_score_compare.h), the relative L2 error within 1e-5, the output gap untouched.
#include "kernels/probe_score/probe_score_cpu.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

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

}  // namespace
}  // namespace probesidecar::kernels::probe_score_test
