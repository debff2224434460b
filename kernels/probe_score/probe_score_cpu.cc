#include "kernels/probe_score/probe_score_cpu.h"

#include <cmath>
#include <vector>

namespace probesidecar::kernels {
namespace {

// Converts one activation row to float32 so that the dot products below are plain float loops.
void RowToFloat(const ProbeScoreCpuParams& p, int32_t row, float* dst) {
  const int64_t base = static_cast<int64_t>(row) * p.x_row_stride;
  switch (p.x_dtype) {
    case common::DType::kFloat32: {
      const float* src = static_cast<const float*>(p.x) + base;
      for (int32_t h = 0; h < p.hidden; ++h) dst[h] = src[h];
      break;
    }
    case common::DType::kFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(p.x) + base;
      for (int32_t h = 0; h < p.hidden; ++h) dst[h] = common::HalfToFloat(src[h]);
      break;
    }
    case common::DType::kBFloat16: {
      const uint16_t* src = static_cast<const uint16_t*>(p.x) + base;
      for (int32_t h = 0; h < p.hidden; ++h) dst[h] = common::Bf16ToFloat(src[h]);
      break;
    }
  }
}

float Activate(Activation activation, float v) {
  return activation == Activation::kSigmoid ? 1.0f / (1.0f + std::exp(-v)) : v;
}

// Eight independent partial sums let the compiler vectorize without reassociating one sum.
float Dot(const float* a, const float* b, int32_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int32_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (int j = 0; j < 8; ++j) acc[j] += a[i + j] * b[i + j];
  }
  float tail = 0.0f;
  for (; i < n; ++i) tail += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

}  // namespace

void RoundProbeWeights(const float* weight, int64_t count, common::DType dtype, float* out) {
  switch (dtype) {
    case common::DType::kFloat32:
      for (int64_t i = 0; i < count; ++i) out[i] = weight[i];
      break;
    case common::DType::kFloat16:
      for (int64_t i = 0; i < count; ++i)
        out[i] = common::HalfToFloat(common::FloatToHalf(weight[i]));
      break;
    case common::DType::kBFloat16:
      for (int64_t i = 0; i < count; ++i)
        out[i] = common::Bf16ToFloat(common::FloatToBf16(weight[i]));
      break;
  }
}

void ScoreProbesCpu(const ProbeScoreCpuParams& p, int32_t row_begin, int32_t row_end) {
  const float* weight = p.weight;
  std::vector<float> rounded;  // only when the caller did not round them once for the set
  if (UsesRoundedWeights(p.precision, p.x_dtype)) {
    if (p.rounded_weight != nullptr) {
      weight = p.rounded_weight;
    } else {
      rounded.resize(static_cast<size_t>(p.num_probes) * p.hidden);
      RoundProbeWeights(p.weight, static_cast<int64_t>(rounded.size()), p.x_dtype, rounded.data());
      weight = rounded.data();
    }
  }
  std::vector<float> x(static_cast<size_t>(p.hidden));
  for (int32_t r = row_begin; r < row_end; ++r) {
    RowToFloat(p, p.rows[r], x.data());
    float* out = p.out + static_cast<int64_t>(r) * p.out_row_stride;
    for (int32_t j = 0; j < p.num_probes; ++j) {
      const float* w = weight + static_cast<int64_t>(j) * p.hidden;
      out[j] = Activate(p.activation, Dot(x.data(), w, p.hidden) + p.bias[j]);
    }
  }
}

}  // namespace probesidecar::kernels
