// Exact precision's weight terms: three bf16 terms sum to the float32 weight exactly; three fp16
// terms of the scaled weight do too, down to fp16's subnormal step (2^-24 of a value scaled near
// 2^14, i.e. ~2^-38 of the largest weight).
#include "kernels/probe_score/probe_score_weight_terms.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace probesidecar::kernels {
namespace {

double SumBf16(uint16_t hi, uint16_t mid, uint16_t lo) {
  return static_cast<double>(common::Bf16ToFloat(hi)) + common::Bf16ToFloat(mid) +
         common::Bf16ToFloat(lo);
}
double SumHalf(uint16_t hi, uint16_t mid, uint16_t lo) {
  return static_cast<double>(common::HalfToFloat(hi)) + common::HalfToFloat(mid) +
         common::HalfToFloat(lo);
}

TEST(WeightTermsTest, Bf16TermsSumToTheFloat32Weight) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> expo(-60, 60);
  int rounded_away = 0;
  for (int i = 0; i < 200000; ++i) {
    const float v = std::ldexp(mant(rng), expo(rng));
    uint16_t hi, mid, lo;
    SplitBf16Terms(v, &hi, &mid, &lo);
    ASSERT_EQ(SumBf16(hi, mid, lo), static_cast<double>(v)) << v;
    // hi alone is the fast weight: it differs from v for almost every draw.
    if (common::Bf16ToFloat(hi) != v) ++rounded_away;
  }
  EXPECT_GT(rounded_away, 190000);
}

TEST(WeightTermsTest, HalfTermsOfScaledWeightsSumToThem) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> w(100000);
  for (float& v : w) v = u(rng) * 0.03f;  // probe weights are small: ~2/sqrt(H)
  const float scale = HalfTermScale(w.data(), static_cast<int64_t>(w.size()));
  float max_abs = 0.0f;
  for (float v : w) max_abs = std::max(max_abs, std::fabs(v));
  ASSERT_GE(max_abs * scale, 8192.0f);
  ASSERT_LT(max_abs * scale, 16384.0f);
  double worst = 0.0;
  for (float v : w) {
    const float s = v * scale;  // a power of two: exact
    uint16_t hi, mid, lo;
    SplitHalfTerms(s, &hi, &mid, &lo);
    worst = std::max(worst, std::fabs(SumHalf(hi, mid, lo) - static_cast<double>(s)));
  }
  EXPECT_LE(worst, std::ldexp(1.0, -24));
}

TEST(WeightTermsTest, HalfTermScaleOfDegenerateSetsIsOne) {
  const std::vector<float> zeros(10, 0.0f);
  EXPECT_EQ(HalfTermScale(zeros.data(), 10), 1.0f);
  const std::vector<float> nan = {1.0f, std::nanf("")};
  EXPECT_EQ(HalfTermScale(nan.data(), 2), std::ldexp(1.0f, 13));  // NaN is not the max
}

}  // namespace
}  // namespace probesidecar::kernels
