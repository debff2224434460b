// A random probe-scoring problem in host memory for the CPU tests: activations of any dtype and
// row stride, random rows with a duplicate and both boundaries, weights, the CPU scorer's output
// (with a NaN-filled gap past P in every output row) and the float64 reference. Test code only.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score_cpu.h"
#include "kernels/probe_score/probe_score_ref.h"

namespace probesidecar::kernels::probe_score_test {

struct HostProblemShape {
  common::DType dtype = common::DType::kFloat32;
  int32_t T = 0, R = 0, H = 0, P = 0;
  int64_t stride = 0;  // activation row stride, elements, >= H
  Activation act = Activation::kNone;
};

class HostProblem {
 public:
  static constexpr int64_t kOutGap = 2;  // output elements past P in each row, left NaN

  HostProblem(const HostProblemShape& s, uint64_t seed) : s_(s) {
    std::mt19937_64 rng(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    const int64_t n = static_cast<int64_t>(s.T) * s.stride;
    x_.resize(n * common::DTypeSize(s.dtype));
    for (int64_t i = 0; i < n; ++i) {
      const float v = u(rng);
      if (s.dtype == common::DType::kFloat32) {
        std::memcpy(x_.data() + 4 * i, &v, 4);
      } else {
        const uint16_t h =
            s.dtype == common::DType::kFloat16 ? common::FloatToHalf(v) : common::FloatToBf16(v);
        std::memcpy(x_.data() + 2 * i, &h, 2);
      }
    }
    w_.resize(static_cast<size_t>(s.P) * s.H);
    b_.resize(s.P);
    for (auto& v : w_) v = u(rng);
    for (auto& v : b_) v = u(rng);
    rows_.resize(s.R);
    for (auto& r : rows_) r = static_cast<int32_t>(rng() % s.T);
    rows_[0] = 0;
    if (s.R >= 3) rows_[1] = rows_[2];
    rows_[s.R - 1] = s.T - 1;
    out_.assign(static_cast<size_t>(s.R) * out_stride(), std::numeric_limits<float>::quiet_NaN());
    ref_.resize(static_cast<size_t>(s.R) * s.P);
    mag_.resize(ref_.size());
    ProbeScoreRefF64(params(), ref_.data(), mag_.data());
  }

  int64_t out_stride() const { return s_.P + kOutGap; }

  ProbeScoreCpuParams params() {
    ProbeScoreCpuParams p;
    p.x = x_.data();
    p.x_dtype = s_.dtype;
    p.x_row_stride = s_.stride;
    p.rows = rows_.data();
    p.num_rows = s_.R;
    p.weight = w_.data();
    p.bias = b_.data();
    p.hidden = s_.H;
    p.num_probes = s_.P;
    p.activation = s_.act;
    p.out = out_.data();
    p.out_row_stride = out_stride();
    return p;
  }

  // Replaces the R rows and recomputes the reference.
  void SetRows(const std::vector<int32_t>& rows) {
    rows_ = rows;
    rows_.resize(s_.R, 0);
    ProbeScoreRefF64(params(), ref_.data(), mag_.data());
  }

  const HostProblemShape& shape() const { return s_; }
  std::vector<float>& out() { return out_; }               // [R, out_stride()]
  const std::vector<double>& ref() const { return ref_; }  // [R, P]
  const std::vector<double>& mag() const { return mag_; }  // [R, P]

 private:
  HostProblemShape s_;
  std::vector<uint8_t> x_;
  std::vector<float> w_, b_;
  std::vector<int32_t> rows_;
  std::vector<float> out_;
  std::vector<double> ref_, mag_;
};

}  // namespace probesidecar::kernels::probe_score_test
