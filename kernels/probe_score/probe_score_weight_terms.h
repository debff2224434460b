// Exact precision's weight terms: a float32 weight as the sum of three 16-bit numbers, so that
// tensor cores (16-bit operands, fp32 accumulation) multiply by the float32 weight exactly. Plain
// C++: the weight upload uses it, the CPU tests check it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "common/dtype.h"

namespace probesidecar::kernels {

// The exact terms of one 16-bit type: hi + mid + lo == v (each rounded from the remainder the
// previous ones leave, which is exact in float32). 8 + 8 + 8 significand bits cover bf16's
// float32; fp16's 11 + 11 + 11 cover it too, on weights pre-scaled into fp16's range.
template <uint16_t (*Round)(float), float (*Widen)(uint16_t)>
inline void SplitTerms(float v, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  *hi = Round(v);
  const float r1 = v - Widen(*hi);
  *mid = Round(r1);
  *lo = Round(r1 - Widen(*mid));
}

// The power of two that brings the largest |weight| into [2^13, 2^14): fp16 terms then keep
// their significand bits for everything above ~2^-24 of it.
inline float HalfTermScale(const float* weight, int64_t count) {
  float max_abs = 0.0f;
  for (int64_t i = 0; i < count; ++i) max_abs = std::max(max_abs, std::fabs(weight[i]));
  if (max_abs == 0.0f || !std::isfinite(max_abs)) return 1.0f;
  int exponent = 0;
  std::frexp(max_abs, &exponent);  // max_abs = m * 2^exponent, m in [0.5, 1)
  return std::ldexp(1.0f, std::clamp(14 - exponent, -100, 100));
}

inline void SplitBf16Terms(float v, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  SplitTerms<common::FloatToBf16, common::Bf16ToFloat>(v, hi, mid, lo);
}
inline void SplitHalfTerms(float v, uint16_t* hi, uint16_t* mid, uint16_t* lo) {
  SplitTerms<common::FloatToHalf, common::HalfToFloat>(v, hi, mid, lo);
}

}  // namespace probesidecar::kernels
