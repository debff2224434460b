// Element types shared by kernels, their CPU references and the server. Plain C++ (also
// compiled by nvcc): no gRPC, protobuf or absl.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define PS_HOST_DEVICE __host__ __device__
#else
#define PS_HOST_DEVICE
#endif

namespace probesidecar::common {

enum class DType : int32_t { kFloat32 = 0, kFloat16 = 1, kBFloat16 = 2 };

inline constexpr int kNumDTypes = 3;

// Bytes per element.
PS_HOST_DEVICE constexpr int DTypeSize(DType dtype) { return dtype == DType::kFloat32 ? 4 : 2; }

// Short names used in benchmarks, metrics and logs: "fp32", "fp16", "bf16".
inline const char* DTypeName(DType dtype) {
  switch (dtype) {
    case DType::kFloat32:
      return "fp32";
    case DType::kFloat16:
      return "fp16";
    case DType::kBFloat16:
      return "bf16";
  }
  return "unknown";
}

inline float BitsToFloat(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, sizeof(f));
  return f;
}

inline uint32_t FloatToBits(float f) {
  uint32_t bits;
  std::memcpy(&bits, &f, sizeof(bits));
  return bits;
}

inline float Bf16ToFloat(uint16_t bits) { return BitsToFloat(static_cast<uint32_t>(bits) << 16); }

// Round to nearest even; NaN stays NaN.
inline uint16_t FloatToBf16(float f) {
  uint32_t bits = FloatToBits(f);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((bits >> 16) | 0x40u);
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

// IEEE binary16 to float, subnormals included.
inline float HalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return BitsToFloat(sign | 0x7f800000u | (mantissa << 13));
  if (exponent == 0) {
    if (mantissa == 0) return BitsToFloat(sign);
    // Subnormal: value = mantissa * 2^-24.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign ? -magnitude : magnitude;
  }
  return BitsToFloat(sign | ((exponent + 112u) << 23) | (mantissa << 13));
}

// Float to IEEE binary16, round to nearest even, overflow to infinity.
inline uint16_t FloatToHalf(float f) {
  const uint32_t bits = FloatToBits(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);  // NaN
  if (abs_bits >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520: inf
  if (abs_bits < 0x38800000u) {
    // Result is subnormal (or zero): scale so that one unit is 2^-24 and round.
    const float magnitude = BitsToFloat(abs_bits) * 16777216.0f;  // * 2^24
    const float rounded = __builtin_nearbyintf(magnitude);       // ties to even
    return static_cast<uint16_t>(sign | static_cast<uint16_t>(rounded));
  }
  uint32_t half = ((abs_bits - 0x38000000u) >> 13);  // rebias exponent 127 -> 15
  const uint32_t rest = abs_bits & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (half & 1u))) ++half;
  return static_cast<uint16_t>(sign | half);
}

// One element of a tensor of the given dtype, as float.
inline float LoadAsFloat(const void* base, DType dtype, int64_t index) {
  switch (dtype) {
    case DType::kFloat32:
      return static_cast<const float*>(base)[index];
    case DType::kFloat16:
      return HalfToFloat(static_cast<const uint16_t*>(base)[index]);
    case DType::kBFloat16:
      return Bf16ToFloat(static_cast<const uint16_t*>(base)[index]);
  }
  return 0.0f;
}

}  // namespace probesidecar::common
