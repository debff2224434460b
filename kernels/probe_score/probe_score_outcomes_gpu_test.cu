// The outcome count fused into the scoring kernels (OutcomeEpilogueParams): on every path, tile
// configuration and split count, the counters equal the host count of the scores the kernels
// wrote, word for word (the sums to float rounding), over two launches; the copy equals the scores
// bit for bit; rows flagged invalid are counted and copied as NaN; padding rows of a group are
// copied, not counted; the running non-finite total takes the request's. Scores' correctness is
// probe_score_gpu_test's.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "common/dtype.h"
#include "kernels/blocks/gpu_test_main.h"
#include "kernels/probe_outcomes/probe_outcomes.h"
#include "kernels/probe_score/probe_score.h"

namespace probesidecar::kernels {
namespace {

#define ASSERT_CUDA(call) ASSERT_EQ((call), cudaSuccess) << #call

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int kMaxRows = 1024, kMaxHidden = 4096, kMaxProbes = 1024;

uint32_t Bits(float v) {
  uint32_t bits = 0;
  std::memcpy(&bits, &v, sizeof(bits));
  return bits;
}

struct Case {
  common::DType dtype;
  int32_t rows, bucket, hidden, probes;
  Activation activation;
  int group_rows;     // > 1: group counts (every group's first rows count)
  bool invalid_rows;  // some rows flagged out of range
  uint32_t seed;
};

std::string Name(const Case& c, ProbeScorePath path, const ProbeScoreTuning& t) {
  return std::string(ProbeScorePathName(path)) + " " + common::DTypeName(c.dtype) +
         " R=" + std::to_string(c.rows) + "/" + std::to_string(c.bucket) +
         " H=" + std::to_string(c.hidden) + " P=" + std::to_string(c.probes) +
         " tc=" + std::to_string(t.tc_config) + " wgmma=" + std::to_string(t.wgmma_config) +
         " splits=" + std::to_string(t.splits) + " group=" + std::to_string(c.group_rows) +
         (c.invalid_rows ? " invalid" : "");
}

template <typename T>
T* DeviceCopy(const std::vector<T>& host) {
  T* d = nullptr;
  if (cudaMalloc(&d, sizeof(T) * std::max<size_t>(host.size(), 1)) != cudaSuccess) return nullptr;
  if (!host.empty() &&
      cudaMemcpy(d, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice) != cudaSuccess) {
    return nullptr;
  }
  return d;
}

class FusedOutcomeCountTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ProbeScoreWorkspaceConfig cfg;
    cfg.max_rows = kMaxRows;
    cfg.max_hidden = kMaxHidden;
    cfg.max_probes = kMaxProbes;
    status_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (status_ == cudaSuccess) status_ = CreateProbeScoreWorkspace(cfg, stream_, &ws_);
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(DestroyProbeScoreWorkspace(ws_), cudaSuccess);
    if (stream_ != nullptr) EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
  }
  void SetUp() override { ASSERT_EQ(status_, cudaSuccess) << cudaGetErrorString(status_); }
  void TearDown() override {
    for (void* p : allocations_) EXPECT_EQ(cudaFree(p), cudaSuccess);
    allocations_.clear();
  }
  template <typename T>
  T* Keep(T* p) {
    allocations_.push_back(p);
    return p;
  }

  // Scores case `c` on `path` planned with `t`, twice, and checks the counters, the copy and the
  // running total against the host count of what the kernels wrote.
  void Check(const Case& c, ProbeScorePath path, const ProbeScoreTuning& t) {
    SCOPED_TRACE(Name(c, path, t));
    const ProbeScoreShape shape{c.dtype, c.bucket, c.probes, c.hidden, ProbePrecision::kFast};
    const ProbeScoreResources& res = ProbeScoreWorkspaceResources(*ws_);
    if (!ProbeScorePathSupports(path, shape, res.device)) return;
    ProbeScorePlan plan;
    ASSERT_CUDA(PlanProbeScore(shape, path, res, t, &plan));
    std::mt19937 rng(c.seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);

    // Activations [T, H] of the dtype, weights and bias, rows.
    const int64_t tokens = c.bucket + 13;
    std::vector<float> xf(static_cast<size_t>(tokens) * c.hidden);
    for (auto& v : xf) v = u(rng);
    std::vector<uint16_t> x16(xf.size());
    for (size_t i = 0; i < xf.size(); ++i) {
      x16[i] = c.dtype == common::DType::kFloat16 ? common::FloatToHalf(xf[i])
                                                  : common::FloatToBf16(xf[i]);
    }
    void* x = c.dtype == common::DType::kFloat32 ? static_cast<void*>(Keep(DeviceCopy(xf)))
                                                 : static_cast<void*>(Keep(DeviceCopy(x16)));
    std::vector<float> w(static_cast<size_t>(c.probes) * c.hidden), b(c.probes);
    const float scale = 3.0f / std::sqrt(static_cast<float>(c.hidden));
    for (auto& v : w) v = u(rng) * scale;
    for (auto& v : b) v = u(rng);
    ProbeWeights weights;
    ASSERT_CUDA(CreateProbeWeights(w.data(), b.data(), c.probes, c.hidden, ProbePrecision::kFast,
                                   &weights));
    std::vector<int32_t> rows(c.bucket);
    for (auto& r : rows) r = static_cast<int32_t>(rng() % tokens);
    int32_t* rows_d = Keep(DeviceCopy(rows));

    // Outputs poisoned; the copy's buffer too.
    const size_t out_elems = static_cast<size_t>(c.bucket) * c.probes;
    const std::vector<float> poison(out_elems, kNaN);
    float* out = Keep(DeviceCopy(poison));
    float* copy = Keep(DeviceCopy(poison));
    ProbeScoreDeviceArgs args;
    args.x = x;
    args.x_row_stride = c.hidden;
    args.out = out;
    args.out_row_stride = c.probes;
    args.num_rows = c.rows;
    ProbeScoreDeviceArgs* args_d = Keep(DeviceCopy(std::vector<ProbeScoreDeviceArgs>{args}));

    // The outcome tables: thresholds around the scores (one probe without), bounds over them.
    const bool sigmoid = c.activation == Activation::kSigmoid;
    std::vector<float> thresholds(c.probes), bounds;
    for (int p = 0; p < c.probes; ++p) {
      thresholds[p] = p % 7 == 3 ? kNaN : (sigmoid ? 0.5f : 0.0f) + 0.1f * (p % 3);
    }
    for (int k = 1; k <= 20; ++k) bounds.push_back(sigmoid ? 0.05f * k : -2.0f + 0.2f * k);
    const ProbeOutcomeLayout layout{c.probes, static_cast<int32_t>(bounds.size())};
    ProbeOutcomeTables tables;
    ASSERT_CUDA(CreateProbeOutcomeTables(thresholds.data(), bounds.data(), layout, &tables));
    unsigned long long* counters = nullptr;
    ASSERT_CUDA(CreateProbeOutcomeCounters(layout, stream_, &counters));
    unsigned long long* total = Keep(DeviceCopy(std::vector<unsigned long long>{0}));

    std::vector<uint8_t> invalid(c.bucket, 0);
    if (c.invalid_rows) {
      for (int r = 0; r < c.rows; r += 5) invalid[r] = 1;
    }
    uint8_t* invalid_d = Keep(DeviceCopy(invalid));
    const int groups = c.group_rows > 1 ? c.rows / c.group_rows : 0;
    std::vector<int32_t> group_counts(groups);
    for (int g = 0; g < groups; ++g) group_counts[g] = g % (c.group_rows + 1);
    int32_t* group_counts_d = Keep(DeviceCopy(group_counts));

    ProbeOutcomeDescriptor d;
    d.scores = out;
    d.scores_row_stride = c.probes;
    d.copy_to = copy;
    d.copy_row_stride = c.probes;
    d.counters = counters;
    d.group_counts = groups > 0 ? group_counts_d : nullptr;
    d.group_rows = groups > 0 ? c.group_rows : 1;
    d.num_rows = c.rows;
    d.add_to_total = 1;
    ProbeOutcomeDescriptor* d_d = Keep(DeviceCopy(std::vector<ProbeOutcomeDescriptor>{d}));

    ProbeScoreParams params;
    params.args = args_d;
    params.rows = rows_d;
    params.weights = &weights;
    params.activation = c.activation;
    params.outcomes.descriptor = d_d;
    params.outcomes.thresholds = tables.thresholds;
    params.outcomes.bounds = tables.bounds;
    params.outcomes.num_bounds = layout.num_bounds;
    params.outcomes.invalid_rows = c.invalid_rows ? invalid_d : nullptr;
    params.outcomes.non_finite_total = total;
    for (int launch = 0; launch < 2; ++launch) {
      ASSERT_CUDA(LaunchProbeScore(plan, params, ws_, stream_));
    }
    ASSERT_CUDA(cudaStreamSynchronize(stream_));

    std::vector<float> scores(out_elems), copied(out_elems);
    ASSERT_CUDA(cudaMemcpy(scores.data(), out, sizeof(float) * out_elems, cudaMemcpyDeviceToHost));
    ASSERT_CUDA(cudaMemcpy(copied.data(), copy, sizeof(float) * out_elems, cudaMemcpyDeviceToHost));
    ProbeOutcomeCounts got(layout, 1);
    ASSERT_CUDA(cudaMemcpy(got.words.data(), counters, sizeof(uint64_t) * got.words.size(),
                           cudaMemcpyDeviceToHost));
    unsigned long long got_total = 0;
    ASSERT_CUDA(cudaMemcpy(&got_total, total, sizeof(got_total), cudaMemcpyDeviceToHost));
    ASSERT_CUDA(DestroyProbeOutcomeTables(&tables));
    ASSERT_CUDA(cudaFree(counters));
    ASSERT_CUDA(DestroyProbeWeights(&weights));

    // What the count sees: the scores, NaN on invalid rows (the poison kernel's output).
    for (int r = 0; r < c.rows; ++r) {
      for (int p = 0; p < c.probes; ++p) {
        ASSERT_FALSE(std::isnan(scores[static_cast<size_t>(r) * c.probes + p]))
            << "row " << r << " probe " << p << " not written";
        if (invalid[r]) scores[static_cast<size_t>(r) * c.probes + p] = kNaN;
      }
    }
    for (size_t i = 0; i < out_elems; ++i) {
      const bool written = static_cast<int>(i / c.probes) < c.rows;
      ASSERT_EQ(Bits(copied[i]), Bits(written ? scores[i] : kNaN)) << "copy element " << i;
    }
    std::vector<std::atomic<uint64_t>> host(layout.SlotWords());
    for (auto& word : host) word = 0;
    ProbeOutcomeCpuParams cpu;
    cpu.scores = scores.data();
    cpu.row_stride = c.probes;
    cpu.thresholds = thresholds.data();
    cpu.bounds = bounds.data();
    cpu.layout = layout;
    for (int launch = 0; launch < 2; ++launch) {
      if (groups == 0) {
        CountProbeOutcomesCpu(cpu, 0, c.rows, host.data());
        continue;
      }
      for (int g = 0; g < groups; ++g) {
        const int begin = g * c.group_rows;
        CountProbeOutcomesCpu(cpu, begin, begin + std::min(group_counts[g], c.group_rows),
                              host.data());
      }
    }
    ProbeOutcomeCounts want(layout, 1);
    for (size_t i = 0; i < want.words.size(); ++i) want.words[i] = host[i].load();
    ASSERT_EQ(want.rows(0), got.rows(0));
    uint64_t want_non_finite = 0, fired = 0;
    for (int p = 0; p < c.probes; ++p) {
      SCOPED_TRACE("probe " + std::to_string(p));
      ASSERT_EQ(want.fired(0, p), got.fired(0, p));
      ASSERT_EQ(want.non_finite(0, p), got.non_finite(0, p));
      for (int k = 0; k <= layout.num_bounds; ++k) {
        ASSERT_EQ(want.bucket(0, p, k), got.bucket(0, p, k)) << "bucket " << k;
      }
      ASSERT_NEAR(want.sum(0, p), got.sum(0, p), 1e-4 * (1 + std::fabs(want.sum(0, p))));
      want_non_finite += want.non_finite(0, p);
      fired += want.fired(0, p);
    }
    ASSERT_EQ(got_total, want_non_finite);
    // The case exercises what it claims: scores fired, and invalid rows counted as non-finite.
    EXPECT_GT(fired, 0u);
    if (c.invalid_rows) EXPECT_GT(want_non_finite, 0u);
  }

  static cudaStream_t stream_;
  static ProbeScoreWorkspace* ws_;
  static cudaError_t status_;
  std::vector<void*> allocations_;
};

cudaStream_t FusedOutcomeCountTest::stream_ = nullptr;
ProbeScoreWorkspace* FusedOutcomeCountTest::ws_ = nullptr;
cudaError_t FusedOutcomeCountTest::status_ = cudaSuccess;

const Case kCases[] = {
    {common::DType::kBFloat16, 1, 1, 256, 1, Activation::kSigmoid, 1, false, 1},
    {common::DType::kBFloat16, 37, 64, 1024, 3, Activation::kSigmoid, 1, true, 2},
    {common::DType::kFloat16, 300, 320, 2048, 200, Activation::kNone, 1, false, 3},
    {common::DType::kBFloat16, 1000, 1024, 512, 16, Activation::kSigmoid, 10, true, 4},
    {common::DType::kBFloat16, 64, 64, 256, 1024, Activation::kSigmoid, 16, false, 5},
    {common::DType::kFloat32, 129, 130, 4096, 40, Activation::kNone, 1, true, 6},
    {common::DType::kBFloat16, 512, 512, 4096, 300, Activation::kSigmoid, 1, false, 7},
};

// Every path on the dispatcher's own plan and on forced splits.
TEST_F(FusedOutcomeCountTest, EveryPathCountsWhatItWrote) {
  for (const Case& c : kCases) {
    for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
      for (int splits : {0, 1, 3}) {
        ProbeScoreTuning t;
        t.splits = splits;
        t.gather_chunk_rows = splits == 3 ? 64 : 0;
        Check(c, static_cast<ProbeScorePath>(pi), t);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Every tile configuration of the tensor-core paths, unsplit and split.
TEST_F(FusedOutcomeCountTest, EveryTileConfigurationCountsWhatItWrote) {
  for (const Case& c : kCases) {
    if (c.dtype == common::DType::kFloat32) continue;
    for (int config = 0; config < probe_score_detail::kNumTcConfigs; ++config) {
      for (int splits : {1, 4}) {
        ProbeScoreTuning t;
        t.tc_config = config;
        t.wgmma_config = config % probe_score_detail::kNumWgmmaConfigs;
        t.splits = splits;
        Check(c, ProbeScorePath::kFusedTensorCore, t);
        if (HasFatalFailure()) return;
        Check(c, ProbeScorePath::kGatherWgmma, t);
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Outcome params without thresholds, or with more bounds than a set may have, are refused before
// anything is enqueued.
TEST_F(FusedOutcomeCountTest, InvalidOutcomeParamsAreRefused) {
  const ProbeScoreShape shape{common::DType::kBFloat16, 16, 4, 256, ProbePrecision::kFast};
  const ProbeScoreResources& res = ProbeScoreWorkspaceResources(*ws_);
  const ProbeScorePath path = ChooseProbeScorePath(shape, res.device);
  ProbeScorePlan plan;
  ASSERT_CUDA(PlanProbeScore(shape, path, res, {}, &plan));
  ProbeScoreParams params;
  params.args = reinterpret_cast<const ProbeScoreDeviceArgs*>(16);
  params.rows = reinterpret_cast<const int32_t*>(16);
  std::vector<float> w(4 * 256, 0.5f), b(4, 0.0f);
  ProbeWeights weights;
  ASSERT_CUDA(CreateProbeWeights(w.data(), b.data(), 4, 256, ProbePrecision::kFast, &weights));
  params.weights = &weights;
  params.outcomes.descriptor = reinterpret_cast<const ProbeOutcomeDescriptor*>(16);
  EXPECT_EQ(LaunchProbeScore(plan, params, ws_, stream_), cudaErrorInvalidValue);
  params.outcomes.thresholds = reinterpret_cast<const float*>(16);
  params.outcomes.non_finite_total = reinterpret_cast<unsigned long long*>(16);
  params.outcomes.bounds = reinterpret_cast<const float*>(16);
  params.outcomes.num_bounds = kMaxScoreBounds + 1;
  EXPECT_EQ(LaunchProbeScore(plan, params, ws_, stream_), cudaErrorInvalidValue);
  ASSERT_CUDA(DestroyProbeWeights(&weights));
}

}  // namespace
}  // namespace probesidecar::kernels

int main(int argc, char** argv) {
  return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv);
}
