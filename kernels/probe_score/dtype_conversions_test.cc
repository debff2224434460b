// Conversions of common/dtype.h that the kernels' weight upload and the CPU scorer rely on: every
// bf16 and fp16 pattern round-trips, rounding is to nearest even, subnormals and overflow.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>

#include "common/dtype.h"

namespace probesidecar::common {
namespace {

uint32_t Bits(float f) { return FloatToBits(f); }

TEST(DTypeTest, Bf16RoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Bf16ToFloat(static_cast<uint16_t>(b));
    const uint16_t back = FloatToBf16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(Bf16ToFloat(back))) << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

TEST(DTypeTest, Bf16RoundsToNearestEven) {
  // 1.0 = 0x3f80; halfway to 0x3f81 rounds down (even), halfway 0x3f81 -> 0x3f82 rounds up.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808000u)), 0x3f80);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f818000u)), 0x3f82);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f808001u)), 0x3f81);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x3f807fffu)), 0x3f80);
  // Overflow to infinity, infinities and NaN.
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x7f7fffffu)), 0x7f80);
  EXPECT_EQ(FloatToBf16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(FloatToBf16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(std::numeric_limits<float>::quiet_NaN()))));
  // A NaN whose payload sits only in the low 16 bits stays NaN (not infinity).
  EXPECT_TRUE(std::isnan(Bf16ToFloat(FloatToBf16(BitsToFloat(0x7f800001u)))));
  // Subnormals.
  EXPECT_EQ(Bits(Bf16ToFloat(0x0001)), 0x00010000u);
  EXPECT_EQ(FloatToBf16(BitsToFloat(0x00010000u)), 0x0001);
  EXPECT_EQ(FloatToBf16(-0.0f), 0x8000);
}

TEST(DTypeTest, HalfRoundTripsEveryPattern) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = HalfToFloat(static_cast<uint16_t>(b));
    const uint16_t back = FloatToHalf(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(back))) << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

TEST(DTypeTest, HalfSubnormalsTiesAndOverflow) {
  const float tiny = std::ldexp(1.0f, -24);  // smallest subnormal
  EXPECT_EQ(HalfToFloat(0x0001), tiny);
  EXPECT_EQ(HalfToFloat(0x03ff), std::ldexp(1023.0f, -24));
  EXPECT_EQ(HalfToFloat(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(FloatToHalf(tiny), 0x0001);
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -25)), 0x0000);         // tie -> even (0)
  EXPECT_EQ(FloatToHalf(std::ldexp(3.0f, -25)), 0x0002);         // 1.5 units -> 2
  EXPECT_EQ(FloatToHalf(std::ldexp(2047.0f, -25)), 0x0400);      // 1023.5 units -> normal
  EXPECT_EQ(FloatToHalf(-std::ldexp(1.0f, -26)), 0x8000);        // underflow keeps the sign
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie -> even
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(3.0f, -11)), 0x3c02);  // tie -> even (up)
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65519.0f), 0x7bff);
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(FloatToHalf(-std::numeric_limits<float>::infinity()), 0xfc00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::numeric_limits<float>::quiet_NaN()))));
  EXPECT_TRUE(std::isinf(HalfToFloat(0x7c00)));
}

TEST(DTypeTest, LoadAsFloatReadsEachDtype) {
  const float f[2] = {1.5f, -2.25f};
  const uint16_t h[2] = {FloatToHalf(1.5f), FloatToHalf(-2.25f)};
  const uint16_t b[2] = {FloatToBf16(1.5f), FloatToBf16(-2.25f)};
  EXPECT_EQ(LoadAsFloat(f, DType::kFloat32, 1), -2.25f);
  EXPECT_EQ(LoadAsFloat(h, DType::kFloat16, 1), -2.25f);
  EXPECT_EQ(LoadAsFloat(b, DType::kBFloat16, 1), -2.25f);
  EXPECT_STREQ(DTypeName(DType::kBFloat16), "bf16");
  EXPECT_EQ(DTypeSize(DType::kFloat32), 4);
  EXPECT_EQ(DTypeSize(DType::kFloat16), 2);
}

}  // namespace
}  // namespace probesidecar::common
