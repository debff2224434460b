// The GPU test's problem instances: random activations with NaN around every row, random rows
// with duplicates and both boundaries, weights, arguments, a NaN-poisoned output, and the float64
// reference (scores and error-bound magnitudes) computed on the device and spot-checked against
// ProbeScoreRefF64. Included only by probe_score_gpu_test.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score.h"
#include "kernels/probe_score/probe_score_compare.h"
#include "kernels/probe_score/probe_score_ref.h"

namespace probesidecar::kernels::probe_score_test {

#define CUDA_ASSERT(expr)                                                      \
  do {                                                                         \
    const cudaError_t err_ = (expr);                                           \
    ASSERT_EQ(err_, cudaSuccess) << #expr << ": " << cudaGetErrorString(err_); \
  } while (0)

constexpr uint32_t kPoisonBits = 0x7fc0dead;  // a quiet NaN with a payload no kernel produces
constexpr int32_t kWsMaxRows = 8200;

// ---------------------------------------------------------------------------------------------
// Device helpers.

__device__ uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// x buffer of `total` elements: element i belongs to row (i - offset) / stride, column
// (i - offset) % stride; columns >= H and elements before `offset` are NaN, so that any read
// outside the rows' [0, H) shows up in the result. Any grid (grid-stride loop).
__global__ void FillActivations(void* buf, int dtype, int64_t total, int64_t offset, int64_t stride,
                                int32_t hidden, uint64_t seed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t j = i - offset;
    const bool inside = j >= 0 && (j % stride) < hidden;
    const float v =
        inside ? static_cast<float>(
                     (Mix(seed ^ static_cast<uint64_t>(i)) >> 40) * (1.0 / 16777216.0) * 2.0 - 1.0)
               : __int_as_float(0x7fc00001);
    if (dtype == static_cast<int>(common::DType::kFloat32)) {
      static_cast<float*>(buf)[i] = v;
    } else if (dtype == static_cast<int>(common::DType::kFloat16)) {
      static_cast<__half*>(buf)[i] = __float2half_rn(v);
    } else {
      static_cast<__nv_bfloat16*>(buf)[i] = __float2bfloat16_rn(v);
    }
  }
}

// p[0, n) = bits. Any grid (grid-stride loop).
__global__ void FillBits(uint32_t* p, int64_t n, uint32_t bits) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    p[i] = bits;
  }
}

__device__ float LoadF(const void* x, int dtype, int64_t i) {
  if (dtype == static_cast<int>(common::DType::kFloat32)) return static_cast<const float*>(x)[i];
  if (dtype == static_cast<int>(common::DType::kFloat16)) {
    return __half2float(static_cast<const __half*>(x)[i]);
  }
  return __bfloat162float(static_cast<const __nv_bfloat16*>(x)[i]);
}

// Float64 reference on the device (for the large shapes; checked against ProbeScoreRefF64 on
// sampled rows of every case). Grid (ceil(P / 32), ceil(R / 32)), block 32 x 32: thread (tx, ty)
// computes out[row ty][probe tx] of its 32 x 32 tile, and magnitude = sum |x * w| + |b| (the scale
// of the error bound, probe_score_compare.h), stepping over H in 32-wide tiles of x and W staged
// in shared memory; products and sums in float64.
__global__ void RefF64Kernel(const void* x, int dtype, int64_t stride, const int32_t* rows,
                             int32_t R, const float* w, const float* bias, int32_t P, int32_t H,
                             int activation, double* out, double* magnitude) {
  __shared__ float xs[32][33];
  __shared__ float ws[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int r0 = blockIdx.y * 32, p0 = blockIdx.x * 32;
  const bool load_row = r0 + ty < R;
  const int64_t xbase = load_row ? static_cast<int64_t>(rows[r0 + ty]) * stride : 0;
  double acc = 0.0, abs_acc = 0.0;
  for (int h0 = 0; h0 < H; h0 += 32) {
    xs[ty][tx] = (load_row && h0 + tx < H) ? LoadF(x, dtype, xbase + h0 + tx) : 0.0f;
    ws[ty][tx] =
        (p0 + ty < P && h0 + tx < H) ? w[static_cast<int64_t>(p0 + ty) * H + h0 + tx] : 0.0f;
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < 32; ++k) {
      const double term = static_cast<double>(xs[ty][k]) * ws[tx][k];
      acc += term;
      abs_acc += fabs(term);
    }
    __syncthreads();
  }
  const int r = r0 + ty, p = p0 + tx;
  if (r < R && p < P) {
    acc += bias[p];
    if (activation == static_cast<int>(Activation::kSigmoid)) acc = 1.0 / (1.0 + exp(-acc));
    out[static_cast<int64_t>(r) * P + p] = acc;
    magnitude[static_cast<int64_t>(r) * P + p] = abs_acc + fabs(static_cast<double>(bias[p]));
  }
}

cudaError_t Poison(float* p, int64_t n, cudaStream_t stream) {
  FillBits<<<1024, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(p), n, kPoisonBits);
  return cudaGetLastError();
}

// ---------------------------------------------------------------------------------------------
// Host helpers.

float RoundTo(common::DType dtype, float v) {
  switch (dtype) {
    case common::DType::kFloat32:
      return v;
    case common::DType::kFloat16:
      return common::HalfToFloat(common::FloatToHalf(v));
    case common::DType::kBFloat16:
      return common::Bf16ToFloat(common::FloatToBf16(v));
  }
  return v;
}

struct HostWeights {
  std::vector<float> w, b;
};

// Weights drawn in the activation dtype's precision (`round`), so that every path and the
// reference see the same numbers; or full float32 weights, which exact precision must keep.
HostWeights MakeWeights(int32_t P, int32_t H, common::DType dtype, uint64_t seed,
                        bool round = true) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  HostWeights hw;
  hw.w.resize(static_cast<size_t>(P) * H);
  hw.b.resize(P);
  const float scale = 2.0f / std::sqrt(static_cast<float>(H));
  for (auto& v : hw.w) v = round ? RoundTo(dtype, u(rng) * scale) : u(rng) * scale;
  for (auto& v : hw.b) v = u(rng) * 0.5f;
  return hw;
}

struct Layout {
  int64_t stride_extra;  // elements past H in each row
  int64_t offset;        // elements before row 0
  const char* name;
};
constexpr Layout kLayouts[] = {
    {0, 0, "contiguous"},          {64, 0, "padded"},
    {1, 1, "odd stride+offset 1"}, {8, 3, "offset 3 (2-byte aligned)"},
    {8, 8, "stride+8 offset 8"},
};
constexpr int kNumLayouts = sizeof(kLayouts) / sizeof(kLayouts[0]);

struct Case {
  common::DType dtype;
  int32_t R, H, P;
  int32_t max_rows;
  int layout;
  int64_t out_extra;  // output row stride = P + out_extra
  Activation act;
  uint64_t seed;
  ProbePrecision precision = ProbePrecision::kFast;
};

std::string CaseName(const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s R=%d (max %d) H=%d P=%d layout=%s out+%lld %s",
                common::DTypeName(c.dtype), c.R, c.max_rows, c.H, c.P, kLayouts[c.layout].name,
                static_cast<long long>(c.out_extra),
                c.act == Activation::kSigmoid ? "sigmoid" : "none");
  if (c.precision == ProbePrecision::kExact) std::strncat(buf, " exact", sizeof(buf) - 1);
  return buf;
}

// One problem instance on the device: activations, rows, args, weights, output, reference.
class Problem {
 public:
  ~Problem() { Free(); }

  void Free() {
    for (void* p :
         {static_cast<void*>(x_), static_cast<void*>(rows_d_), static_cast<void*>(args_d_),
          static_cast<void*>(out_), static_cast<void*>(w_ref_d_), static_cast<void*>(b_ref_d_),
          static_cast<void*>(ref_d_), static_cast<void*>(mag_d_)}) {
      if (p != nullptr) EXPECT_EQ(cudaFree(p), cudaSuccess);
    }
    x_ = nullptr;
    rows_d_ = nullptr;
    args_d_ = nullptr;
    out_ = nullptr;
    w_ref_d_ = nullptr;
    b_ref_d_ = nullptr;
    ref_d_ = nullptr;
    mag_d_ = nullptr;
  }

  // Allocates and fills everything for case c (weights `w` are the device copies of hw).
  void Setup(const Case& c, const HostWeights& hw) {
    c_ = c;
    const Layout& l = kLayouts[c.layout];
    stride_ = c.H + l.stride_extra;
    T_ = std::max<int64_t>(c.R + 17, 64);
    total_ = l.offset + T_ * stride_ + 16;
    const int64_t elem = common::DTypeSize(c.dtype);
    CUDA_ASSERT(cudaMalloc(&x_, total_ * elem));
    FillActivations<<<2048, 256>>>(x_, static_cast<int>(c.dtype), total_, l.offset, stride_, c.H,
                                   c.seed);
    CUDA_ASSERT(cudaGetLastError());
    x_rows_ = static_cast<char*>(x_) + l.offset * elem;

    // Rows: random, with a duplicate pair and both boundary rows.
    std::mt19937 rng(static_cast<uint32_t>(c.seed * 7 + 1));
    rows_.resize(c.max_rows);
    for (auto& r : rows_) r = static_cast<int32_t>(rng() % T_);
    if (c.R >= 2) rows_[1] = rows_[0];
    if (c.R >= 3) rows_[c.R / 2] = 0;
    if (c.R >= 1) rows_[c.R - 1] = static_cast<int32_t>(T_ - 1);
    CUDA_ASSERT(cudaMalloc(&rows_d_, rows_.size() * sizeof(int32_t)));
    CUDA_ASSERT(
        cudaMemcpy(rows_d_, rows_.data(), rows_.size() * sizeof(int32_t), cudaMemcpyHostToDevice));

    out_stride_ = c.P + c.out_extra;
    out_elems_ = static_cast<int64_t>(c.max_rows) * out_stride_;
    CUDA_ASSERT(cudaMalloc(&out_, out_elems_ * sizeof(float)));
    args_.x = x_rows_;
    args_.x_row_stride = stride_;
    args_.out = out_;
    args_.out_row_stride = out_stride_;
    args_.num_rows = c.R;
    CUDA_ASSERT(cudaMalloc(&args_d_, sizeof(ProbeScoreDeviceArgs)));
    CUDA_ASSERT(cudaMemcpy(args_d_, &args_, sizeof(args_), cudaMemcpyHostToDevice));

    // Reference: float64 on the device, spot-checked against ProbeScoreRefF64 below.
    CUDA_ASSERT(cudaMalloc(&w_ref_d_, hw.w.size() * sizeof(float)));
    CUDA_ASSERT(cudaMalloc(&b_ref_d_, hw.b.size() * sizeof(float)));
    CUDA_ASSERT(
        cudaMemcpy(w_ref_d_, hw.w.data(), hw.w.size() * sizeof(float), cudaMemcpyHostToDevice));
    CUDA_ASSERT(
        cudaMemcpy(b_ref_d_, hw.b.data(), hw.b.size() * sizeof(float), cudaMemcpyHostToDevice));
    ref_.assign(static_cast<size_t>(c.R) * c.P, 0.0);
    mag_.assign(ref_.size(), 0.0);
    if (c.R > 0) {
      CUDA_ASSERT(cudaMalloc(&ref_d_, ref_.size() * sizeof(double)));
      CUDA_ASSERT(cudaMalloc(&mag_d_, mag_.size() * sizeof(double)));
      const dim3 grid((c.P + 31) / 32, (c.R + 31) / 32);
      RefF64Kernel<<<grid, dim3(32, 32)>>>(x_rows_, static_cast<int>(c.dtype), stride_, rows_d_,
                                           c.R, w_ref_d_, b_ref_d_, c.P, c.H,
                                           static_cast<int>(c.act), ref_d_, mag_d_);
      CUDA_ASSERT(cudaGetLastError());
      CUDA_ASSERT(
          cudaMemcpy(ref_.data(), ref_d_, ref_.size() * sizeof(double), cudaMemcpyDeviceToHost));
      CUDA_ASSERT(
          cudaMemcpy(mag_.data(), mag_d_, mag_.size() * sizeof(double), cudaMemcpyDeviceToHost));
      CheckDeviceRefAgainstCpu(hw);
    }
  }

  // ProbeScoreRefF64 on up to 4 sampled rows (first, last, two in between) must agree with the
  // device reference (scores and magnitudes) to float64 rounding.
  void CheckDeviceRefAgainstCpu(const HostWeights& hw) {
    std::vector<int32_t> sample = {0, c_.R - 1, c_.R / 2, c_.R / 3};
    std::sort(sample.begin(), sample.end());
    sample.erase(std::unique(sample.begin(), sample.end()), sample.end());
    const int64_t elem = common::DTypeSize(c_.dtype);
    std::vector<char> xs(sample.size() * c_.H * elem);
    for (size_t i = 0; i < sample.size(); ++i) {
      CUDA_ASSERT(cudaMemcpy(xs.data() + i * c_.H * elem,
                             static_cast<const char*>(x_rows_) +
                                 static_cast<int64_t>(rows_[sample[i]]) * stride_ * elem,
                             c_.H * elem, cudaMemcpyDeviceToHost));
    }
    std::vector<int32_t> local(sample.size());
    for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<int32_t>(i);
    ProbeScoreCpuParams rp;
    rp.x = xs.data();
    rp.x_dtype = c_.dtype;
    rp.x_row_stride = c_.H;
    rp.rows = local.data();
    rp.num_rows = static_cast<int32_t>(local.size());
    rp.weight = hw.w.data();
    rp.bias = hw.b.data();
    rp.hidden = c_.H;
    rp.num_probes = c_.P;
    rp.activation = c_.act;
    std::vector<double> cpu(local.size() * c_.P), cpu_mag(cpu.size());
    ProbeScoreRefF64(rp, cpu.data(), cpu_mag.data());
    for (size_t i = 0; i < sample.size(); ++i) {
      for (int p = 0; p < c_.P; ++p) {
        const size_t d = static_cast<size_t>(sample[i]) * c_.P + p;
        const double a = cpu[i * c_.P + p], m = cpu_mag[i * c_.P + p];
        ASSERT_NEAR(a, ref_[d], 1e-9 * (1.0 + std::fabs(a)))
            << "device reference row " << sample[i];
        ASSERT_NEAR(m, mag_[d], 1e-9 * (1.0 + m)) << "device magnitude row " << sample[i];
      }
    }
  }

  ProbeScoreShape Shape() const {
    return ProbeScoreShape{c_.dtype, c_.max_rows, c_.P, c_.H, c_.precision};
  }

  ProbeScoreParams Params(const ProbeWeights* w) const {
    ProbeScoreParams p;
    p.args = args_d_;
    p.rows = rows_d_;
    p.weights = w;
    p.activation = c_.act;
    return p;
  }

  // Output as float bits on the host.
  std::vector<float> Download() const {
    std::vector<float> h(out_elems_);
    EXPECT_EQ(cudaMemcpy(h.data(), out_, out_elems_ * sizeof(float), cudaMemcpyDeviceToHost),
              cudaSuccess);
    return h;
  }

  struct Check {
    ScoreComparison scores;    // the R x P block against the reference, element by element
    int64_t tail_touched = 0;  // poisoned elements outside it that changed
  };

  // Every element of the R x P block within its bound (probe_score_compare.h: operands exact in
  // the dtype, fp32 accumulation); everything else still the poison.
  // `model`: ScoreErrorModel{} unless the kernel rounded W (fast precision on full fp32 weights).
  Check Compare(const std::vector<float>& got, int32_t num_rows,
                const ScoreErrorModel& model = ScoreErrorModel{}) const {
    Check ck;
    ck.scores = CompareScores(model, got.data(), out_stride_, ref_.data(), mag_.data(), num_rows,
                              c_.P, c_.H, c_.act);
    for (int64_t r = 0; r < c_.max_rows; ++r) {
      for (int64_t j = 0; j < out_stride_; ++j) {
        if (r < num_rows && j < c_.P) continue;
        uint32_t bits;
        std::memcpy(&bits, &got[r * out_stride_ + j], 4);
        if (bits != kPoisonBits) ++ck.tail_touched;
      }
    }
    return ck;
  }

  float* out() const { return out_; }
  int64_t out_elems() const { return out_elems_; }
  ProbeScoreDeviceArgs* args_d() const { return args_d_; }
  int32_t* rows_d() const { return rows_d_; }
  const ProbeScoreDeviceArgs& args() const { return args_; }
  const std::vector<int32_t>& rows() const { return rows_; }

 private:
  Case c_{};
  void* x_ = nullptr;
  const void* x_rows_ = nullptr;
  int64_t stride_ = 0, T_ = 0, total_ = 0;
  std::vector<int32_t> rows_;
  int32_t* rows_d_ = nullptr;
  ProbeScoreDeviceArgs args_{};
  ProbeScoreDeviceArgs* args_d_ = nullptr;
  float* out_ = nullptr;
  int64_t out_stride_ = 0, out_elems_ = 0;
  float* w_ref_d_ = nullptr;
  float* b_ref_d_ = nullptr;
  double* ref_d_ = nullptr;
  double* mag_d_ = nullptr;
  std::vector<double> ref_;  // [R, P] scores
  std::vector<double> mag_;  // [R, P] sum |x * w| + |b|
};

}  // namespace probesidecar::kernels::probe_score_test
