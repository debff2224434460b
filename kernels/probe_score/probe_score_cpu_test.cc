// CPU-only tests (run in CI, no GPU): the reference against float64, dtype conversions, and the
// dispatcher's decisions.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score.h"
#include "kernels/probe_score/probe_score_ref.h"

namespace probesidecar::kernels {
namespace {

// ---------------------------------------------------------------------------------------------
// Reference vs float64.

struct RefCase {
  common::DType dtype;
  int32_t T, R, H, P;
  int64_t stride;
  Activation act;
};

void FillRow(std::vector<uint8_t>* buf, common::DType dtype, int64_t n, std::mt19937_64* rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  buf->resize(n * common::DTypeSize(dtype));
  for (int64_t i = 0; i < n; ++i) {
    const float v = u(*rng);
    if (dtype == common::DType::kFloat32) {
      std::memcpy(buf->data() + 4 * i, &v, 4);
    } else {
      const uint16_t h = dtype == common::DType::kFloat16 ? common::FloatToHalf(v) : common::FloatToBf16(v);
      std::memcpy(buf->data() + 2 * i, &h, 2);
    }
  }
}

TEST(ProbeScoreRefTest, MatchesFloat64OnRandomData) {
  const RefCase cases[] = {
      {common::DType::kFloat32, 50, 20, 257, 5, 257, Activation::kNone},
      {common::DType::kFloat32, 40, 33, 1024, 3, 1031, Activation::kSigmoid},
      {common::DType::kFloat16, 30, 17, 999, 7, 1001, Activation::kNone},
      {common::DType::kFloat16, 64, 64, 2048, 2, 2048, Activation::kSigmoid},
      {common::DType::kBFloat16, 25, 40, 513, 9, 520, Activation::kNone},
      {common::DType::kBFloat16, 9, 12, 4096, 1, 4097, Activation::kSigmoid},
  };
  uint64_t seed = 1;
  for (const RefCase& c : cases) {
    SCOPED_TRACE(std::string(common::DTypeName(c.dtype)) + " H=" + std::to_string(c.H));
    std::mt19937_64 rng(seed++);
    std::vector<uint8_t> x;
    FillRow(&x, c.dtype, c.T * c.stride, &rng);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    std::vector<float> w(static_cast<size_t>(c.P) * c.H), b(c.P);
    for (auto& v : w) v = u(rng);
    for (auto& v : b) v = u(rng);
    // Random rows with a duplicate and both boundaries.
    std::vector<int32_t> rows(c.R);
    for (auto& r : rows) r = static_cast<int32_t>(rng() % c.T);
    rows[0] = 0;
    rows[1] = rows[2];
    rows[c.R - 1] = c.T - 1;

    ProbeScoreRefParams p;
    p.x = x.data();
    p.x_dtype = c.dtype;
    p.x_row_stride = c.stride;
    p.rows = rows.data();
    p.num_rows = c.R;
    p.weight = w.data();
    p.bias = b.data();
    p.hidden = c.H;
    p.num_probes = c.P;
    p.activation = c.act;
    const int64_t out_stride = c.P + 2;
    std::vector<float> out(static_cast<size_t>(c.R) * out_stride,
                           std::numeric_limits<float>::quiet_NaN());
    p.out = out.data();
    p.out_row_stride = out_stride;
    // Split the rows the way the CPU backend's threads do.
    ProbeScoreRef(p, 0, c.R / 3);
    ProbeScoreRef(p, c.R / 3, c.R);
    std::vector<double> ref(static_cast<size_t>(c.R) * c.P);
    ProbeScoreRefF64(p, ref.data());

    double num = 0.0, den = 0.0;
    for (int32_t r = 0; r < c.R; ++r) {
      for (int32_t j = 0; j < c.P; ++j) {
        const float v = out[r * out_stride + j];
        ASSERT_TRUE(std::isfinite(v)) << "row " << r << " probe " << j;
        const double d = v - ref[r * c.P + j];
        num += d * d;
        den += ref[r * c.P + j] * ref[r * c.P + j];
      }
      // The gap between P and the row stride stays untouched.
      EXPECT_TRUE(std::isnan(out[r * out_stride + c.P]));
    }
    EXPECT_LE(std::sqrt(num / den), 1e-5);
  }
}

TEST(ProbeScoreRefTest, DuplicateRowsGiveIdenticalScores) {
  std::mt19937_64 rng(9);
  std::vector<uint8_t> x;
  FillRow(&x, common::DType::kBFloat16, 8 * 300, &rng);
  std::vector<float> w(4 * 300, 0.25f), b(4, 0.5f);
  const std::vector<int32_t> rows = {3, 3, 7, 3};
  std::vector<float> out(4 * 4);
  ProbeScoreRefParams p;
  p.x = x.data();
  p.x_dtype = common::DType::kBFloat16;
  p.x_row_stride = 300;
  p.rows = rows.data();
  p.num_rows = 4;
  p.weight = w.data();
  p.bias = b.data();
  p.hidden = 300;
  p.num_probes = 4;
  p.out = out.data();
  p.out_row_stride = 4;
  ProbeScoreRef(p, 0, 4);
  for (int j = 0; j < 4; ++j) {
    EXPECT_EQ(out[0 * 4 + j], out[1 * 4 + j]);
    EXPECT_EQ(out[0 * 4 + j], out[3 * 4 + j]);
  }
}

// ---------------------------------------------------------------------------------------------
// dtype conversions.

uint32_t Bits(float f) { return common::FloatToBits(f); }

TEST(DTypeTest, Bf16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = common::Bf16ToFloat(static_cast<uint16_t>(b));
    const uint16_t back = common::FloatToBf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(common::Bf16ToFloat(back))) << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  // 1.0 = 0x3f80; halfway to 0x3f81 rounds down (even), halfway 0x3f81 -> 0x3f82 rounds up.
  EXPECT_EQ(common::FloatToBf16(common::BitsToFloat(0x3f808000u)), 0x3f80);
  EXPECT_EQ(common::FloatToBf16(common::BitsToFloat(0x3f818000u)), 0x3f82);
  EXPECT_EQ(common::FloatToBf16(common::BitsToFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(common::FloatToBf16(common::BitsToFloat(0x3f807fffu)), 0x3f80);
  // Overflow to infinity, infinities and NaN.
  EXPECT_EQ(common::FloatToBf16(common::BitsToFloat(0x7f7fffffu)), 0x7f80);
  EXPECT_EQ(common::FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(common::FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(common::Bf16ToFloat(common::FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low 16 bits stays NaN (not infinity).
  EXPECT_TRUE(std::isnan(common::Bf16ToFloat(common::FloatToBf16(common::BitsToFloat(0x7f800001u)))));
  // Subnormals.
  EXPECT_EQ(Bits(common::Bf16ToFloat(0x0001)), 0x00010000u);
  EXPECT_EQ(common::FloatToBf16(common::BitsToFloat(0x00010000u)), 0x0001);
  EXPECT_EQ(common::FloatToBf16(-0.0f), 0x8000);
}

TEST(DTypeTest, HalfRoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = common::HalfToFloat(static_cast<uint16_t>(b));
    const uint16_t back = common::FloatToHalf(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(common::HalfToFloat(back))) << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

TEST(DTypeTest, HalfSubnormalsTiesAndOverflow) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest subnormal
  EXPECT_EQ(common::HalfToFloat(0x0001), tiny);
  EXPECT_EQ(common::HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(common::HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(common::FloatToHalf(tiny), 0x0001);
  EXPECT_EQ(common::FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);         // tie -> even (0)
  EXPECT_EQ(common::FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units -> 2
  EXPECT_EQ(common::FloatToHalf(std::ldexp(2047.0f, -25)), 0x0400);      // 1023.5 units -> normal
  EXPECT_EQ(common::FloatToHalf(-std::ldexp(1.0f, -26)), 0x8000);        // underflow keeps the sign
  EXPECT_EQ(common::FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(common::FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(common::FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(common::FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(common::FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(common::FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(common::FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(common::HalfToFloat(common::FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(common::HalfToFloat(0x7c00)));
}

TEST(DTypeTest, LoadAsFloatReadsEachDtype) {
  const float f[2] = {1.5f, -2.25f};
  const uint16_t h[2] = {common::FloatToHalf(1.5f), common::FloatToHalf(-2.25f)};
  const uint16_t b[2] = {common::FloatToBf16(1.5f), common::FloatToBf16(-2.25f)};
  EXPECT_EQ(common::LoadAsFloat(f, common::DType::kFloat32, 1), -2.25f);
  EXPECT_EQ(common::LoadAsFloat(h, common::DType::kFloat16, 1), -2.25f);
  EXPECT_EQ(common::LoadAsFloat(b, common::DType::kBFloat16, 1), -2.25f);
  EXPECT_STREQ(common::DTypeName(common::DType::kBFloat16), "bf16");
  EXPECT_EQ(common::DTypeSize(common::DType::kFloat32), 4);
  EXPECT_EQ(common::DTypeSize(common::DType::kFloat16), 2);
}

// ---------------------------------------------------------------------------------------------
// Dispatcher.

TEST(ProbeScoreDispatchTest, NamesAreStable) {
  EXPECT_STREQ(ProbeScorePathName(ProbeScorePath::kFusedCuda), "fused_cuda");
  EXPECT_STREQ(ProbeScorePathName(ProbeScorePath::kFusedTensorCore), "fused_tc");
  EXPECT_STREQ(ProbeScorePathName(ProbeScorePath::kGatherGemm), "gather_gemm");
}

TEST(ProbeScoreDispatchTest, ChoosesASupportedPathEverywhere) {
  for (common::DType dtype : {common::DType::kFloat32, common::DType::kFloat16, common::DType::kBFloat16}) {
    for (int32_t R : {1, 7, 64, 256, 1000, 4096, 8192, 65536}) {
      for (int32_t P : {1, 2, 3, 16, 17, 64, 128, 512, 1024, 4096}) {
        for (int32_t H : {1, 7, 896, 2048, 4096, 5120, 8192, 12288}) {
          const ProbeScorePath path = ChooseProbeScorePath(R, P, H, dtype);
          EXPECT_TRUE(ProbeScorePathSupports(path, dtype, P, H))
              << common::DTypeName(dtype) << " R=" << R << " P=" << P << " H=" << H << " -> "
              << ProbeScorePathName(path);
          if (dtype == common::DType::kFloat32) EXPECT_NE(path, ProbeScorePath::kFusedTensorCore);
        }
      }
    }
  }
}

TEST(ProbeScoreDispatchTest, SupportRules) {
  EXPECT_FALSE(ProbeScorePathSupports(ProbeScorePath::kFusedTensorCore, common::DType::kFloat32, 16, 4096));
  EXPECT_FALSE(
      ProbeScorePathSupports(ProbeScorePath::kFusedTensorCore, common::DType::kBFloat16, 16, 4100));
  EXPECT_TRUE(ProbeScorePathSupports(ProbeScorePath::kFusedTensorCore, common::DType::kFloat16, 1, 4104));
  EXPECT_TRUE(ProbeScorePathSupports(ProbeScorePath::kFusedCuda, common::DType::kFloat32, 4096, 7));
  EXPECT_TRUE(ProbeScorePathSupports(ProbeScorePath::kGatherGemm, common::DType::kBFloat16, 1, 1));
  EXPECT_FALSE(ProbeScorePathSupports(ProbeScorePath::kFusedCuda, common::DType::kFloat32, 0, 4096));
}

// The measured shape of the decision (bench/results/probe_score.md): many probes over many
// rows never run on CUDA cores, and one probe never goes through a GEMM library call.
TEST(ProbeScoreDispatchTest, FollowsMeasuredCrossovers) {
  for (common::DType dtype : {common::DType::kFloat16, common::DType::kBFloat16}) {
    EXPECT_NE(ChooseProbeScorePath(8192, 1024, 4096, dtype), ProbeScorePath::kFusedCuda);
    EXPECT_NE(ChooseProbeScorePath(8192, 1, 4096, dtype), ProbeScorePath::kGatherGemm);
    EXPECT_NE(ChooseProbeScorePath(1, 1, 4096, dtype), ProbeScorePath::kGatherGemm);
  }
  EXPECT_EQ(ChooseProbeScorePath(8192, 1, 4096, common::DType::kFloat32), ProbeScorePath::kFusedCuda);
  EXPECT_EQ(ChooseProbeScorePath(8192, 1024, 4096, common::DType::kFloat32), ProbeScorePath::kGatherGemm);
}

}  // namespace
}  // namespace probesidecar::kernels
