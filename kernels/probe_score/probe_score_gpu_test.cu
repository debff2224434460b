// GPU tests of probe scoring: every path against a float64 reference on fresh random inputs
// (never zeros), with strided / unaligned activations, duplicate and boundary rows, partial row
// buckets and NaN-poisoned outputs; CUDA-graph capture and replay with rewritten arguments.
//
// Without a CUDA device (or with one the sm_90 build cannot run on) the binary prints
// "SKIPPED: ..." and exits 77, which CTest reports as skipped.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "kernels/probe_score/probe_score.h"
#include "kernels/probe_score/probe_score_internal.h"
#include "kernels/probe_score/probe_score_ref.h"

namespace probesidecar::kernels {
namespace {

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
// outside the rows' [0, H) shows up in the result.
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
// computes out[row ty][probe tx] of its 32 x 32 tile, stepping over H in 32-wide tiles of x and
// W staged in shared memory; products and sums in float64.
__global__ void RefF64Kernel(const void* x, int dtype, int64_t stride, const int32_t* rows,
                             int32_t R, const float* w, const float* bias, int32_t P, int32_t H,
                             int activation, double* out) {
  __shared__ float xs[32][33];
  __shared__ float ws[32][33];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int r0 = blockIdx.y * 32, p0 = blockIdx.x * 32;
  const bool load_row = r0 + ty < R;
  const int64_t xbase = load_row ? static_cast<int64_t>(rows[r0 + ty]) * stride : 0;
  double acc = 0.0;
  for (int h0 = 0; h0 < H; h0 += 32) {
    xs[ty][tx] = (load_row && h0 + tx < H) ? LoadF(x, dtype, xbase + h0 + tx) : 0.0f;
    ws[ty][tx] =
        (p0 + ty < P && h0 + tx < H) ? w[static_cast<int64_t>(p0 + ty) * H + h0 + tx] : 0.0f;
    __syncthreads();
#pragma unroll 8
    for (int k = 0; k < 32; ++k) acc += static_cast<double>(xs[ty][k]) * ws[tx][k];
    __syncthreads();
  }
  const int r = r0 + ty, p = p0 + tx;
  if (r < R && p < P) {
    acc += bias[p];
    if (activation == static_cast<int>(Activation::kSigmoid)) acc = 1.0 / (1.0 + exp(-acc));
    out[static_cast<int64_t>(r) * P + p] = acc;
  }
}

void Poison(float* p, int64_t n, cudaStream_t stream) {
  FillBits<<<1024, 256, 0, stream>>>(reinterpret_cast<uint32_t*>(p), n, kPoisonBits);
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

// Weights drawn in the activation dtype's precision, so that every path and the reference see
// the same numbers.
HostWeights MakeWeights(int32_t P, int32_t H, common::DType dtype, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  HostWeights hw;
  hw.w.resize(static_cast<size_t>(P) * H);
  hw.b.resize(P);
  const float scale = 2.0f / std::sqrt(static_cast<float>(H));
  for (auto& v : hw.w) v = RoundTo(dtype, u(rng) * scale);
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
};

std::string CaseName(const Case& c) {
  char buf[200];
  std::snprintf(buf, sizeof(buf), "%s R=%d (max %d) H=%d P=%d layout=%s out+%lld %s",
                common::DTypeName(c.dtype), c.R, c.max_rows, c.H, c.P, kLayouts[c.layout].name,
                static_cast<long long>(c.out_extra),
                c.act == Activation::kSigmoid ? "sigmoid" : "none");
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
          static_cast<void*>(ref_d_)}) {
      if (p != nullptr) cudaFree(p);
    }
    x_ = nullptr;
    rows_d_ = nullptr;
    args_d_ = nullptr;
    out_ = nullptr;
    w_ref_d_ = nullptr;
    b_ref_d_ = nullptr;
    ref_d_ = nullptr;
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
    if (c.R > 0) {
      CUDA_ASSERT(cudaMalloc(&ref_d_, ref_.size() * sizeof(double)));
      const dim3 grid((c.P + 31) / 32, (c.R + 31) / 32);
      RefF64Kernel<<<grid, dim3(32, 32)>>>(x_rows_, static_cast<int>(c.dtype), stride_, rows_d_,
                                           c.R, w_ref_d_, b_ref_d_, c.P, c.H,
                                           static_cast<int>(c.act), ref_d_);
      CUDA_ASSERT(cudaGetLastError());
      CUDA_ASSERT(
          cudaMemcpy(ref_.data(), ref_d_, ref_.size() * sizeof(double), cudaMemcpyDeviceToHost));
      CheckDeviceRefAgainstCpu(hw);
    }
  }

  // ProbeScoreRefF64 on up to 4 sampled rows (first, last, two in between) must agree with the
  // device reference to float64 rounding.
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
    ProbeScoreRefParams rp;
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
    std::vector<double> cpu(local.size() * c_.P);
    ProbeScoreRefF64(rp, cpu.data());
    for (size_t i = 0; i < sample.size(); ++i) {
      for (int p = 0; p < c_.P; ++p) {
        const double a = cpu[i * c_.P + p], b = ref_[static_cast<size_t>(sample[i]) * c_.P + p];
        ASSERT_NEAR(a, b, 1e-9 * (1.0 + std::fabs(a))) << "device reference row " << sample[i];
      }
    }
  }

  ProbeScoreParams Params(const ProbeWeights* w) const {
    ProbeScoreParams p;
    p.x_dtype = c_.dtype;
    p.args = args_d_;
    p.rows = rows_d_;
    p.max_rows = c_.max_rows;
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
    double rel_err = 0.0;
    int64_t nan_or_unwritten = 0;
    int64_t tail_touched = 0;
  };

  // Relative L2 error over the R x P block; counts unwritten/NaN elements and touched poison.
  Check Compare(const std::vector<float>& got, int32_t num_rows) const {
    Check ck;
    double num = 0.0, den = 0.0;
    for (int64_t r = 0; r < c_.max_rows; ++r) {
      for (int64_t j = 0; j < out_stride_; ++j) {
        const float v = got[r * out_stride_ + j];
        uint32_t bits;
        std::memcpy(&bits, &v, 4);
        if (r < num_rows && j < c_.P) {
          if (!std::isfinite(v)) {
            ++ck.nan_or_unwritten;
            continue;
          }
          const double ref = ref_[r * c_.P + j];
          num += (v - ref) * (v - ref);
          den += ref * ref;
        } else if (bits != kPoisonBits) {
          ++ck.tail_touched;
        }
      }
    }
    ck.rel_err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
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
  std::vector<double> ref_;
};

// ---------------------------------------------------------------------------------------------
// Fixture: one workspace for the whole binary, weights cached per (dtype, P, H).

class ProbeScoreGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ProbeScoreWorkspaceConfig cfg;
    cfg.max_rows = kWsMaxRows;
    cfg.max_hidden = 8192;
    cfg.max_probes = 1024;
    ws_status_ = CreateProbeScoreWorkspace(cfg, &ws_);
  }
  static void TearDownTestSuite() {
    for (auto& [key, w] : weights_) DestroyProbeWeights(&w.second);
    weights_.clear();
    DestroyProbeScoreWorkspace(ws_);
    ws_ = nullptr;
  }

  void SetUp() override {
    ASSERT_EQ(ws_status_, cudaSuccess) << cudaGetErrorString(ws_status_);
    CUDA_ASSERT(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }

  // Weights for (dtype precision, P, H), created once.
  static const std::pair<HostWeights, ProbeWeights>* Weights(common::DType dtype, int32_t P, int32_t H) {
    const auto key = std::make_tuple(static_cast<int>(dtype), P, H);
    auto it = weights_.find(key);
    if (it != weights_.end()) return &it->second;
    // Keep the cache small: the big weight sets are only used by consecutive cases.
    if (weights_.size() > 8) {
      for (auto& [k, w] : weights_) DestroyProbeWeights(&w.second);
      weights_.clear();
    }
    std::pair<HostWeights, ProbeWeights> entry;
    entry.first = MakeWeights(P, H, dtype, 1000003ull * P + 7919ull * H + static_cast<int>(dtype));
    if (CreateProbeWeights(entry.first.w.data(), entry.first.b.data(), P, H, &entry.second) !=
        cudaSuccess) {
      return nullptr;
    }
    return &weights_.emplace(key, std::move(entry)).first->second;
  }

  static ProbeScoreWorkspace* ws_;
  static cudaError_t ws_status_;
  static std::map<std::tuple<int, int32_t, int32_t>, std::pair<HostWeights, ProbeWeights>> weights_;
  cudaStream_t stream_ = nullptr;
};

ProbeScoreWorkspace* ProbeScoreGpuTest::ws_ = nullptr;
cudaError_t ProbeScoreGpuTest::ws_status_ = cudaErrorUnknown;
std::map<std::tuple<int, int32_t, int32_t>, std::pair<HostWeights, ProbeWeights>>
    ProbeScoreGpuTest::weights_;

double Tolerance(common::DType dtype, ProbeScorePath path) {
  if (dtype == common::DType::kFloat32) return 1e-5;  // no tensor-core path runs fp32
  (void)path;
  return 1e-3;
}

struct Worst {
  double err = 0.0;
  std::string where;
};

// Runs every supported path on every case; prints the worst error per (dtype, path).
void RunCases(ProbeScoreWorkspace* ws, cudaStream_t stream, const std::vector<Case>& cases,
              std::map<std::string, Worst>* worst,
              const std::pair<HostWeights, ProbeWeights>* (*weights)(common::DType, int32_t, int32_t)) {
  for (const Case& c : cases) {
    SCOPED_TRACE(CaseName(c));
    const auto* w = weights(c.dtype, c.P, c.H);
    ASSERT_NE(w, nullptr);
    Problem prob;
    prob.Setup(c, w->first);
    if (::testing::Test::HasFatalFailure()) return;
    for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
      const auto path = static_cast<ProbeScorePath>(pi);
      if (!ProbeScorePathSupports(path, c.dtype, c.P, c.H)) continue;
      SCOPED_TRACE(ProbeScorePathName(path));
      Poison(prob.out(), prob.out_elems(), stream);
      CUDA_ASSERT(cudaGetLastError());
      CUDA_ASSERT(LaunchProbeScore(prob.Params(&w->second), path, ws, stream));
      CUDA_ASSERT(cudaStreamSynchronize(stream));
      const auto ck = prob.Compare(prob.Download(), c.R);
      EXPECT_EQ(ck.nan_or_unwritten, 0);
      EXPECT_EQ(ck.tail_touched, 0);
      EXPECT_LE(ck.rel_err, Tolerance(c.dtype, path));
      const std::string key = std::string(common::DTypeName(c.dtype)) + " " + ProbeScorePathName(path);
      Worst& wst = (*worst)[key];
      if (ck.rel_err >= wst.err) {
        wst.err = ck.rel_err;
        wst.where = CaseName(c);
      }
    }
  }
}

void PrintWorst(const std::map<std::string, Worst>& worst) {
  for (const auto& [key, w] : worst) {
    std::printf("[worst] %-22s rel_err %.3e  at %s\n", key.c_str(), w.err, w.where.c_str());
  }
}

// Every value of every axis for bf16 (the full cross product), the big corners for all dtypes.
std::vector<Case> SweepCases(common::DType dtype) {
  const int32_t Rs[] = {1, 7, 64, 1000, 8192};
  const int32_t Hs[] = {2048, 4096, 5120, 8192};
  const int32_t Ps[] = {1, 3, 16, 128, 1024};
  std::vector<Case> cases;
  uint64_t n = static_cast<uint64_t>(dtype) * 100000;
  for (int32_t H : Hs) {
    for (int32_t P : Ps) {
      for (int32_t R : Rs) {
        ++n;
        const bool full = dtype == common::DType::kBFloat16;
        // fp16 / fp32: every R for P in {1, 16, 1024} at H 4096 / 8192, and one R per other pair.
        const bool corner = (H == 4096 || H == 8192) && (P == 1 || P == 16 || P == 1024);
        const bool diagonal = (R == Rs[(n / 7) % 5]);
        if (!full && !corner && !diagonal) continue;
        Case c;
        c.dtype = dtype;
        c.R = R;
        c.H = H;
        c.P = P;
        // Every other case runs with a larger row bucket: the rows past R must stay poisoned.
        c.max_rows = (n % 2 == 0) ? R : std::min<int32_t>(R + 5, kWsMaxRows);
        c.layout = static_cast<int>(n % kNumLayouts);
        c.out_extra = (n % 3 == 0) ? 3 : 0;
        c.act = (n % 4 == 1) ? Activation::kSigmoid : Activation::kNone;
        c.seed = n * 0x51ed27ull + 17;
        cases.push_back(c);
      }
    }
  }
  return cases;
}

// Odd hidden sizes: fused_cuda's scalar tails, fused_tc's zero-filled K tail (H % 8 == 0, not
// a multiple of 64), gather_gemm with unaligned staging rows.
TEST_F(ProbeScoreGpuTest, OddHiddenSizes) {
  std::vector<Case> cases;
  uint64_t n = 900;
  for (common::DType dtype : {common::DType::kBFloat16, common::DType::kFloat16, common::DType::kFloat32}) {
    for (int32_t H : {1, 5, 40, 1000, 1029}) {
      for (int32_t P : {1, 16, 130}) {
        ++n;
        cases.push_back(Case{dtype, static_cast<int32_t>(1 + n % 97), H, P,
                             static_cast<int32_t>(1 + n % 97 + n % 3),
                             static_cast<int>(n % kNumLayouts), static_cast<int64_t>(n % 2),
                             n % 2 ? Activation::kSigmoid : Activation::kNone, n});
      }
    }
  }
  std::map<std::string, Worst> worst;
  RunCases(ws_, stream_, cases, &worst, &Weights);
  PrintWorst(worst);
}

// Forced split counts and tile configurations: the split-K fix-up with many splits, every tile
// configuration at shapes the dispatcher would not give it.
TEST_F(ProbeScoreGpuTest, ForcedConfigsAndSplits) {
  std::map<std::string, Worst> worst;
  const std::vector<Case> cases = {
      {common::DType::kBFloat16, 300, 4096, 200, 320, 2, 0, Activation::kNone, 11},
      {common::DType::kFloat16, 1000, 2048, 16, 1000, 0, 1, Activation::kSigmoid, 12},
      {common::DType::kBFloat16, 7, 5120, 1024, 64, 3, 0, Activation::kNone, 13},
      {common::DType::kFloat32, 129, 4096, 40, 130, 1, 0, Activation::kNone, 14},
      // K tails inside a 256-wide tile (configs with BK 128 / 256) and a single short K tile.
      {common::DType::kBFloat16, 50, 1000, 16, 64, 3, 0, Activation::kNone, 15},
      {common::DType::kFloat16, 33, 40, 3, 40, 0, 1, Activation::kSigmoid, 16},
  };
  for (int config = 0; config < probe_score_detail::kNumTcConfigs; ++config) {
    for (int splits : {1, 3, 16}) {
      ProbeScoreTuning t;
      t.tc_config = config;
      t.splits = splits;
      t.gather_chunk_rows = 64 * splits;
      SetProbeScoreTuning(ws_, t);
      RunCases(ws_, stream_, cases, &worst, &Weights);
    }
  }
  SetProbeScoreTuning(ws_, ProbeScoreTuning{});
  PrintWorst(worst);
}

// num_rows == 0: nothing is written.
TEST_F(ProbeScoreGpuTest, ZeroRowsWritesNothing) {
  const Case c{common::DType::kBFloat16, 0, 4096, 16, 64, 0, 0, Activation::kNone, 5};
  const auto* w = Weights(c.dtype, c.P, c.H);
  ASSERT_NE(w, nullptr);
  Problem prob;
  prob.Setup(c, w->first);
  ASSERT_FALSE(HasFatalFailure());
  for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
    const auto path = static_cast<ProbeScorePath>(pi);
    Poison(prob.out(), prob.out_elems(), stream_);
    CUDA_ASSERT(LaunchProbeScore(prob.Params(&w->second), path, ws_, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    const auto ck = prob.Compare(prob.Download(), 0);
    EXPECT_EQ(ck.tail_touched, 0) << ProbeScorePathName(path);
  }
}

TEST_F(ProbeScoreGpuTest, RejectsUnsupported) {
  const auto* w = Weights(common::DType::kFloat32, 16, 4096);
  ASSERT_NE(w, nullptr);
  ProbeScoreParams p;
  p.x_dtype = common::DType::kFloat32;
  p.args = reinterpret_cast<const ProbeScoreDeviceArgs*>(16);  // never dereferenced
  p.rows = reinterpret_cast<const int32_t*>(16);
  p.max_rows = 64;
  p.weights = &w->second;
  EXPECT_EQ(LaunchProbeScore(p, ProbeScorePath::kFusedTensorCore, ws_, stream_),
            cudaErrorInvalidValue);
  p.max_rows = kWsMaxRows + 1;
  EXPECT_EQ(LaunchProbeScore(p, ProbeScorePath::kFusedCuda, ws_, stream_), cudaErrorInvalidValue);
  p.max_rows = 64;
  p.weights = nullptr;
  EXPECT_EQ(LaunchProbeScore(p, ProbeScorePath::kFusedCuda, ws_, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The server's flow: the graph copies args + rows from pinned host memory, then scores. Replay
// equals eager bit for bit; after rewriting the pinned args (another activation buffer, fewer
// rows, other row indices) a replay gives the new correct answer and leaves the tail poisoned.
TEST_F(ProbeScoreGpuTest, GraphCaptureAndReplayWithNewArgs) {
  for (common::DType dtype : {common::DType::kBFloat16, common::DType::kFloat32}) {
    for (int32_t P : {16, 128}) {
      for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
        const auto path = static_cast<ProbeScorePath>(pi);
        if (!ProbeScorePathSupports(path, dtype, P, 4096)) continue;
        SCOPED_TRACE(std::string(common::DTypeName(dtype)) + " P=" + std::to_string(P) + " " +
                     ProbeScorePathName(path));
        const int32_t max_rows = 1024;
        const Case a{dtype, 1000, 4096, P, max_rows, 0, 0, Activation::kSigmoid, 77};
        const Case b{dtype, 517, 4096, P, max_rows, 3, 0, Activation::kSigmoid, 78};
        const auto* w = Weights(dtype, P, 4096);
        ASSERT_NE(w, nullptr);
        Problem pa, pb;
        pa.Setup(a, w->first);
        ASSERT_FALSE(HasFatalFailure());
        pb.Setup(b, w->first);
        ASSERT_FALSE(HasFatalFailure());
        // Both problems write into pa's output buffer (same out stride).
        ProbeScoreDeviceArgs args_b = pb.args();
        args_b.out = pa.out();

        // Pinned staging, like the server's.
        ProbeScoreDeviceArgs* pinned_args = nullptr;
        int32_t* pinned_rows = nullptr;
        CUDA_ASSERT(cudaMallocHost(&pinned_args, sizeof(ProbeScoreDeviceArgs)));
        CUDA_ASSERT(cudaMallocHost(&pinned_rows, max_rows * sizeof(int32_t)));
        *pinned_args = pa.args();
        std::memcpy(pinned_rows, pa.rows().data(), max_rows * sizeof(int32_t));

        // Eager.
        Poison(pa.out(), pa.out_elems(), stream_);
        CUDA_ASSERT(cudaMemcpyAsync(pa.args_d(), pinned_args, sizeof(ProbeScoreDeviceArgs),
                                    cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(cudaMemcpyAsync(pa.rows_d(), pinned_rows, max_rows * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(LaunchProbeScore(pa.Params(&w->second), path, ws_, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const std::vector<float> eager = pa.Download();
        const auto ck_eager = pa.Compare(eager, a.R);
        EXPECT_EQ(ck_eager.nan_or_unwritten, 0);
        EXPECT_LE(ck_eager.rel_err, Tolerance(dtype, path));

        // Capture: copies + launch.
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        CUDA_ASSERT(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        CUDA_ASSERT(cudaMemcpyAsync(pa.args_d(), pinned_args, sizeof(ProbeScoreDeviceArgs),
                                    cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(cudaMemcpyAsync(pa.rows_d(), pinned_rows, max_rows * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
        const cudaError_t launch = LaunchProbeScore(pa.Params(&w->second), path, ws_, stream_);
        const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
        CUDA_ASSERT(launch);
        CUDA_ASSERT(end);
        CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));

        // Replay == eager, bit for bit.
        Poison(pa.out(), pa.out_elems(), stream_);
        CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const std::vector<float> replay = pa.Download();
        EXPECT_EQ(std::memcmp(replay.data(), eager.data(), eager.size() * sizeof(float)), 0);

        // New request through the same graph.
        *pinned_args = args_b;
        std::memcpy(pinned_rows, pb.rows().data(), max_rows * sizeof(int32_t));
        Poison(pa.out(), pa.out_elems(), stream_);
        CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const auto ck_b = pb.Compare(pa.Download(), b.R);
        EXPECT_EQ(ck_b.nan_or_unwritten, 0);
        EXPECT_EQ(ck_b.tail_touched, 0);
        EXPECT_LE(ck_b.rel_err, Tolerance(dtype, path));

        // Back to the first request: the same bits as the first replay.
        *pinned_args = pa.args();
        std::memcpy(pinned_rows, pa.rows().data(), max_rows * sizeof(int32_t));
        Poison(pa.out(), pa.out_elems(), stream_);
        CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const std::vector<float> again = pa.Download();
        EXPECT_EQ(std::memcmp(again.data(), eager.data(), eager.size() * sizeof(float)), 0);

        cudaGraphExecDestroy(exec);
        cudaGraphDestroy(graph);
        cudaFreeHost(pinned_args);
        cudaFreeHost(pinned_rows);
      }
    }
  }
}

// The sweeps last: they take most of the time.
TEST_F(ProbeScoreGpuTest, AllPathsBf16FullSweep) {
  std::map<std::string, Worst> worst;
  RunCases(ws_, stream_, SweepCases(common::DType::kBFloat16), &worst, &Weights);
  PrintWorst(worst);
}

TEST_F(ProbeScoreGpuTest, AllPathsFp16Sweep) {
  std::map<std::string, Worst> worst;
  RunCases(ws_, stream_, SweepCases(common::DType::kFloat16), &worst, &Weights);
  PrintWorst(worst);
}

TEST_F(ProbeScoreGpuTest, AllPathsFp32Sweep) {
  std::map<std::string, Worst> worst;
  RunCases(ws_, stream_, SweepCases(common::DType::kFloat32), &worst, &Weights);
  PrintWorst(worst);
}

}  // namespace
}  // namespace probesidecar::kernels

int main(int argc, char** argv) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA device (%s)\n",
                err != cudaSuccess ? cudaGetErrorString(err) : "device count 0");
    return 77;
  }
  cudaDeviceProp prop{};
  if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess || prop.major != 9) {
    std::printf("SKIPPED: no CUDA device this sm_90 build can run on (found %s, sm_%d%d)\n",
                prop.name, prop.major, prop.minor);
    return 77;
  }
  std::printf("device: %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
