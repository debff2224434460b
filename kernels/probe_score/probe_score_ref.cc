#include "kernels/probe_score/probe_score_ref.h"

#include <cmath>
#include <vector>

namespace probesidecar::kernels {
namespace {

// Rounded here rather than with RoundProbeWeights, so that the oracle does not share the
// scorer's code.
float RoundTo(common::DType dtype, float w) {
  if (dtype == common::DType::kBFloat16) return common::Bf16ToFloat(common::FloatToBf16(w));
  if (dtype == common::DType::kFloat16) return common::HalfToFloat(common::FloatToHalf(w));
  return w;
}

}  // namespace

void ProbeScoreRefF64(const ProbeScoreCpuParams& p, double* out, double* magnitude) {
  const float* weight = p.weight;
  std::vector<float> rounded;
  if (UsesRoundedWeights(p.precision, p.x_dtype)) {
    rounded.resize(static_cast<size_t>(p.num_probes) * p.hidden);
    for (size_t i = 0; i < rounded.size(); ++i) rounded[i] = RoundTo(p.x_dtype, p.weight[i]);
    weight = rounded.data();
  }
  for (int32_t r = 0; r < p.num_rows; ++r) {
    const int64_t base = static_cast<int64_t>(p.rows[r]) * p.x_row_stride;
    for (int32_t j = 0; j < p.num_probes; ++j) {
      const float* w = weight + static_cast<int64_t>(j) * p.hidden;
      double acc = 0.0, abs_acc = 0.0;
      for (int32_t h = 0; h < p.hidden; ++h) {
        const double term =
            static_cast<double>(common::LoadAsFloat(p.x, p.x_dtype, base + h)) * w[h];
        acc += term;
        abs_acc += std::fabs(term);
      }
      acc += p.bias[j];
      if (p.activation == Activation::kSigmoid) acc = 1.0 / (1.0 + std::exp(-acc));
      const int64_t i = static_cast<int64_t>(r) * p.num_probes + j;
      out[i] = acc;
      if (magnitude != nullptr) magnitude[i] = abs_acc + std::fabs(static_cast<double>(p.bias[j]));
    }
  }
}

}  // namespace probesidecar::kernels
