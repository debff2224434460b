// GPU tests of probe scoring: every path against a float64 reference on fresh random inputs
// (never zeros), every element within its error bound (probe_score_compare.h) and the relative L2
// error of the block, with strided / unaligned activations, duplicate and boundary rows, partial
// row buckets and NaN-poisoned outputs; CUDA-graph capture and replay with rewritten arguments.
//
// Exit status: 77 (CTest: skipped) only when the machine has no CUDA device; a device this sm_90
// build cannot run on, or a CUDA runtime that cannot count devices, is a failure (1).
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "common/dtype.h"
#include "kernels/blocks/device_support.h"
#include "kernels/blocks/gpu_test_main.h"
#include "kernels/probe_score/probe_score.h"
#include "kernels/probe_score/probe_score_gpu_problem.cuh"

namespace probesidecar::kernels::probe_score_test {
namespace {

// The family the planners are confined to (PROBE_SIDECAR_LIMIT_TO_FAMILY, read by main), or
// nullptr: the device's own limits.
const DeviceFamily* g_family = nullptr;

// The relative L2 error of a whole block, besides the per-element bound: fp32 paths (CUDA cores
// and cuBLAS SGEMM, no TF32) stay within 1e-5, 16-bit inputs within 1e-3; exact precision keeps
// the float32 weights, so only fp32 accumulation remains (~u sqrt(H) ~ 5e-6 at H = 8192): 5e-5,
// twenty times below what rounding the weights to bf16 costs (~1e-3, ExactPrecision... below).
double L2Tolerance(common::DType dtype, ProbePrecision precision = ProbePrecision::kFast) {
  if (dtype == common::DType::kFloat32) return 1e-5;
  return precision == ProbePrecision::kExact ? 5e-5 : 1e-3;
}

struct Worst {
  double rel_l2 = 0.0, ratio = 0.0;  // ratio: max |err| / bound over the elements
  std::string where;
};

// ---------------------------------------------------------------------------------------------
// Fixture: one stream and its workspace for the whole binary, weights cached per (dtype, P, H).

class ProbeScoreGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    ProbeScoreWorkspaceConfig cfg;
    cfg.max_rows = kWsMaxRows;
    cfg.max_hidden = 8192;
    cfg.max_probes = 1024;
    cfg.limit_to_family = g_family;
    ws_status_ = cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking);
    if (ws_status_ == cudaSuccess) ws_status_ = CreateProbeScoreWorkspace(cfg, stream_, &ws_);
  }
  static void TearDownTestSuite() {
    for (auto& [key, w] : weights_) EXPECT_EQ(DestroyProbeWeights(&w.second), cudaSuccess);
    weights_.clear();
    EXPECT_EQ(DestroyProbeScoreWorkspace(ws_), cudaSuccess);
    ws_ = nullptr;
    if (stream_ != nullptr) EXPECT_EQ(cudaStreamDestroy(stream_), cudaSuccess);
    stream_ = nullptr;
  }

  void SetUp() override { ASSERT_EQ(ws_status_, cudaSuccess) << cudaGetErrorString(ws_status_); }

  static const ProbeScoreResources& Resources() { return ProbeScoreWorkspaceResources(*ws_); }

  // Weights for (dtype, P, H, precision, rounded), created once. Exact sets draw full float32
  // weights unless `round`; fast sets draw them in the dtype's precision unless `!round`.
  static const std::pair<HostWeights, ProbeWeights>* Weights(
      common::DType dtype, int32_t P, int32_t H, ProbePrecision precision = ProbePrecision::kFast,
      int round = -1) {
    const bool rounded = round < 0 ? precision == ProbePrecision::kFast : round != 0;
    const auto key = std::make_tuple(static_cast<int>(dtype), P, H,
                                     static_cast<int>(precision) * 2 + (rounded ? 1 : 0));
    auto it = weights_.find(key);
    if (it != weights_.end()) return &it->second;
    // Keep the cache small: the big weight sets are only used by consecutive cases.
    if (weights_.size() > 8) {
      for (auto& [k, w] : weights_) EXPECT_EQ(DestroyProbeWeights(&w.second), cudaSuccess);
      weights_.clear();
    }
    std::pair<HostWeights, ProbeWeights> entry;
    entry.first =
        MakeWeights(P, H, dtype, 1000003ull * P + 7919ull * H + static_cast<int>(dtype), rounded);
    if (CreateProbeWeights(entry.first.w.data(), entry.first.b.data(), P, H, precision,
                           &entry.second) != cudaSuccess) {
      return nullptr;
    }
    return &weights_.emplace(key, std::move(entry)).first->second;
  }

  // Runs every supported path on every case (planned with `tuning`); records the worst error per
  // (dtype, path).
  void RunCases(const std::vector<Case>& cases, const ProbeScoreTuning& tuning,
                std::map<std::string, Worst>* worst) {
    for (const Case& c : cases) {
      SCOPED_TRACE(CaseName(c));
      const auto* w = Weights(c.dtype, c.P, c.H, c.precision);
      ASSERT_NE(w, nullptr);
      Problem prob;
      prob.Setup(c, w->first);
      if (HasFatalFailure()) return;
      for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
        const auto path = static_cast<ProbeScorePath>(pi);
        if (!ProbeScorePathSupports(path, prob.Shape(), Resources().device)) continue;
        SCOPED_TRACE(ProbeScorePathName(path));
        ProbeScorePlan plan;
        const cudaError_t planned = PlanProbeScore(prob.Shape(), path, Resources(), tuning, &plan);
        const int terms =
            c.precision == ProbePrecision::kExact && c.dtype != common::DType::kFloat32 ? 3 : 1;
        if (path == ProbeScorePath::kFusedTensorCore && tuning.tc_config >= 0 &&
            !TcConfigFits(tuning.tc_config, terms, Resources().device)) {
          // A forced tile this device's blocks cannot hold is refused.
          EXPECT_EQ(planned, cudaErrorInvalidValue);
          continue;
        }
        CUDA_ASSERT(planned);
        CUDA_ASSERT(Poison(prob.out(), prob.out_elems(), stream_));
        CUDA_ASSERT(LaunchProbeScore(plan, prob.Params(&w->second), ws_, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const auto ck = prob.Compare(prob.Download(), c.R);
        EXPECT_TRUE(ck.scores.ok()) << DescribeComparison(ck.scores);
        EXPECT_EQ(ck.tail_touched, 0);
        EXPECT_LE(ck.scores.rel_l2, L2Tolerance(c.dtype, c.precision));
        Worst& wst = (*worst)[std::string(common::DTypeName(c.dtype)) + " " +
                              ProbeScorePathName(path) + " " + ProbePrecisionName(c.precision)];
        wst.ratio = std::max(wst.ratio, ck.scores.worst_ratio);
        if (ck.scores.rel_l2 >= wst.rel_l2) {
          wst.rel_l2 = ck.scores.rel_l2;
          wst.where = CaseName(c);
        }
      }
    }
  }

  static cudaStream_t stream_;  // the workspace's stream: every launch runs on it
  static ProbeScoreWorkspace* ws_;
  static cudaError_t ws_status_;
  static std::map<std::tuple<int, int32_t, int32_t, int>, std::pair<HostWeights, ProbeWeights>>
      weights_;
};

cudaStream_t ProbeScoreGpuTest::stream_ = nullptr;
ProbeScoreWorkspace* ProbeScoreGpuTest::ws_ = nullptr;
cudaError_t ProbeScoreGpuTest::ws_status_ = cudaErrorUnknown;
std::map<std::tuple<int, int32_t, int32_t, int>, std::pair<HostWeights, ProbeWeights>>
    ProbeScoreGpuTest::weights_;

void PrintWorst(const std::map<std::string, Worst>& worst) {
  for (const auto& [key, w] : worst) {
    std::printf("[worst] %-22s rel_l2 %.3e at %s; max |err|/bound %.3g\n", key.c_str(), w.rel_l2,
                w.where.c_str(), w.ratio);
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
        c.precision = (n / 2) % 2 ? ProbePrecision::kExact : ProbePrecision::kFast;
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
  for (common::DType dtype :
       {common::DType::kBFloat16, common::DType::kFloat16, common::DType::kFloat32}) {
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
  RunCases(cases, ProbeScoreTuning{}, &worst);
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
  std::vector<Case> both = cases;
  for (Case c : cases) {
    c.precision = ProbePrecision::kExact;
    both.push_back(c);
  }
  for (int config = 0; config < probe_score_detail::kNumTcConfigs; ++config) {
    for (int splits : {1, 3, 16}) {
      ProbeScoreTuning t;
      t.tc_config = config;
      t.wgmma_config = config % probe_score_detail::kNumWgmmaConfigs;
      t.splits = splits;
      t.gather_chunk_rows = 64 * splits;
      RunCases(both, t, &worst);
    }
  }
  PrintWorst(worst);
}

// The dispatcher by the device and the build: gather_wgmma only on compute capability 9.0 with
// the sm_90a kernels built (and not when confined to another family); fused_tc tiles that fit
// the device's blocks (checked for every case by the sweeps, which plan through the dispatcher).
TEST_F(ProbeScoreGpuTest, DispatchFollowsTheDeviceAndBuild) {
  const ProbeScoreDeviceFacts& d = Resources().device;
  const ProbeScoreShape big{common::DType::kBFloat16, 8192, 1024, 4096};
  const ProbeScorePath path = ChooseProbeScorePath(big, d);
  ProbeScorePlan exact;
  CUDA_ASSERT(PlanProbeScore({common::DType::kBFloat16, 8192, 1024, 4096, ProbePrecision::kExact},
                             ProbeScorePath::kFusedTensorCore, Resources(), {}, &exact));
  std::printf(
      "[dispatch] planned as compute capability %d.%d, %lld bytes of shared memory per "
      "block; sm_90a kernels %s this build; gather_wgmma %s; bf16 R=8192 P=1024 "
      "H=4096 -> %s; its exact-precision fused_tc tile %s (%d bytes)\n",
      d.cc_major, d.cc_minor, static_cast<long long>(d.smem_per_block_optin),
      Sm90aKernelsBuilt() ? "in" : "not in", d.gather_wgmma ? "dispatched" : "absent",
      ProbeScorePathName(path), probe_score_detail::kTcConfigs[exact.fused_tc.config].name,
      exact.fused_tc.smem_bytes);
  EXPECT_EQ(path == ProbeScorePath::kGatherWgmma, d.gather_wgmma);
  EXPECT_LE(exact.fused_tc.smem_bytes, d.smem_per_block_optin);
  if (!Sm90aKernelsBuilt() || d.cc_major != 9 || d.cc_minor != 0 ||
      (g_family != nullptr && !g_family->sm90a)) {
    EXPECT_FALSE(d.gather_wgmma);
  }
  if (g_family != nullptr) {
    EXPECT_LE(d.smem_per_block_optin, g_family->limits.smem_per_block_optin);
    EXPECT_EQ(d.cc_major, g_family->limits.cc_major);
  }
  if (const int expected = gpu_test::ExpectedSm90a(); expected >= 0) {
    EXPECT_EQ(d.gather_wgmma, expected == 1) << "PROBE_SIDECAR_EXPECT_SM90A=" << expected;
  }
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
    ProbeScorePlan plan;
    if (!ProbeScorePathSupports(path, prob.Shape(), Resources().device)) {
      // gather_wgmma off sm_90 (or without the sm_90a kernels): refused when planning.
      EXPECT_EQ(PlanProbeScore(prob.Shape(), path, Resources(), ProbeScoreTuning{}, &plan),
                cudaErrorInvalidValue);
      continue;
    }
    CUDA_ASSERT(PlanProbeScore(prob.Shape(), path, Resources(), ProbeScoreTuning{}, &plan));
    CUDA_ASSERT(Poison(prob.out(), prob.out_elems(), stream_));
    CUDA_ASSERT(LaunchProbeScore(plan, prob.Params(&w->second), ws_, stream_));
    CUDA_ASSERT(cudaStreamSynchronize(stream_));
    const auto ck = prob.Compare(prob.Download(), 0);
    EXPECT_EQ(ck.tail_touched, 0) << ProbeScorePathName(path);
  }
}

// Plans the workspace cannot serve are refused when planning; launches whose params, workspace,
// stream or path do not match their plan are refused before anything is enqueued.
TEST_F(ProbeScoreGpuTest, RejectsMismatches) {
  const auto* w = Weights(common::DType::kFloat32, 16, 4096);
  const auto* w17 = Weights(common::DType::kFloat32, 17, 4096);
  ASSERT_NE(w, nullptr);
  ASSERT_NE(w17, nullptr);
  const ProbeScoreShape shape{common::DType::kFloat32, 64, 16, 4096};
  ProbeScorePlan plan;
  EXPECT_EQ(PlanProbeScore(shape, ProbeScorePath::kFusedTensorCore, Resources(), {}, &plan),
            cudaErrorInvalidValue);
  ProbeScoreShape too_many_rows = shape;
  too_many_rows.max_rows = kWsMaxRows + 1;
  EXPECT_EQ(PlanProbeScore(too_many_rows, ProbeScorePath::kFusedCuda, Resources(), {}, &plan),
            cudaErrorInvalidValue);

  ASSERT_EQ(PlanProbeScore(shape, ProbeScorePath::kFusedCuda, Resources(), {}, &plan), cudaSuccess);
  ProbeScoreParams p;
  p.args = reinterpret_cast<const ProbeScoreDeviceArgs*>(16);  // never dereferenced
  p.rows = reinterpret_cast<const int32_t*>(16);
  p.weights = nullptr;
  EXPECT_EQ(LaunchProbeScore(plan, p, ws_, stream_), cudaErrorInvalidValue);
  p.weights = &w17->second;  // P = 17, the plan's 16
  EXPECT_EQ(LaunchProbeScore(plan, p, ws_, stream_), cudaErrorInvalidValue);
  p.weights = &w->second;
  EXPECT_EQ(LaunchProbeScore(plan, p, nullptr, stream_), cudaErrorInvalidValue);
  // A stream other than the workspace's (its cuBLAS handle and scratch belong to that one).
  cudaStream_t other = nullptr;
  CUDA_ASSERT(cudaStreamCreateWithFlags(&other, cudaStreamNonBlocking));
  EXPECT_EQ(LaunchProbeScore(plan, p, ws_, other), cudaErrorInvalidResourceHandle);
  CUDA_ASSERT(cudaStreamDestroy(other));
  // A plan whose path was changed after planning: another path's launch was never planned.
  ProbeScorePlan relabelled = plan;
  relabelled.path = ProbeScorePath::kGatherGemm;
  EXPECT_EQ(LaunchProbeScore(relabelled, p, ws_, stream_), cudaErrorInvalidValue);
  // A gather_wgmma plan made for a device that has it, on a workspace whose device has not.
  if (!Resources().device.gather_wgmma) {
    ProbeScoreResources hopper = Resources();
    hopper.device.gather_wgmma = true;
    const auto* w16 = Weights(common::DType::kBFloat16, 256, 4096);
    ASSERT_NE(w16, nullptr);
    ProbeScorePlan wgmma;
    ASSERT_EQ(PlanProbeScore({common::DType::kBFloat16, 64, 256, 4096},
                             ProbeScorePath::kGatherWgmma, hopper, {}, &wgmma),
              cudaSuccess);
    ProbeScoreParams p16 = p;
    p16.weights = &w16->second;
    EXPECT_EQ(LaunchProbeScore(wgmma, p16, ws_, stream_), cudaErrorInvalidDeviceFunction);
  }
  // A plan made for a larger workspace.
  ProbeScoreResources larger = Resources();
  larger.workspace.max_rows = 2 * kWsMaxRows;
  ProbeScoreShape more_rows = shape;
  more_rows.max_rows = kWsMaxRows + 64;
  ASSERT_EQ(PlanProbeScore(more_rows, ProbeScorePath::kFusedCuda, larger, {}, &plan), cudaSuccess);
  EXPECT_EQ(LaunchProbeScore(plan, p, ws_, stream_), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

// The server's flow: the plan is made once, the graph copies args + rows from pinned host memory,
// then scores. Replay equals eager bit for bit; after rewriting the pinned args (another
// activation buffer, fewer rows, other row indices) a replay gives the new correct answer and
// leaves the tail poisoned.
TEST_F(ProbeScoreGpuTest, GraphCaptureAndReplayWithNewArgs) {
  for (common::DType dtype : {common::DType::kBFloat16, common::DType::kFloat32}) {
    // P = 1024 at 4096 rows: gather_wgmma's warp-specialised tile (its W tensor map is encoded
    // at capture and baked into the graph).
    for (int32_t P : {16, 128, 1024}) {
      const int32_t bucket = P == 1024 ? 4096 : 1024;
      for (int pi = 0; pi < 2 * kNumProbeScorePaths; ++pi) {
        const auto path = static_cast<ProbeScorePath>(pi % kNumProbeScorePaths);
        const ProbePrecision precision =
            pi < kNumProbeScorePaths ? ProbePrecision::kFast : ProbePrecision::kExact;
        const ProbeScoreShape shape{dtype, bucket, P, 4096, precision};
        if (!ProbeScorePathSupports(path, shape, Resources().device)) continue;
        SCOPED_TRACE(std::string(common::DTypeName(dtype)) + " P=" + std::to_string(P) + " " +
                     ProbeScorePathName(path) + " " + ProbePrecisionName(precision));
        const int32_t max_rows = shape.max_rows;
        ProbeScorePlan plan;
        CUDA_ASSERT(PlanProbeScore(shape, path, Resources(), ProbeScoreTuning{}, &plan));
        const Case a{dtype, bucket - 24,          4096, P,        max_rows, 0,
                     0,     Activation::kSigmoid, 77,   precision};
        const Case b{dtype, bucket / 2 + 5,       4096, P,        max_rows, 3,
                     0,     Activation::kSigmoid, 78,   precision};
        const auto* w = Weights(dtype, P, 4096, precision);
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
        CUDA_ASSERT(Poison(pa.out(), pa.out_elems(), stream_));
        CUDA_ASSERT(cudaMemcpyAsync(pa.args_d(), pinned_args, sizeof(ProbeScoreDeviceArgs),
                                    cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(cudaMemcpyAsync(pa.rows_d(), pinned_rows, max_rows * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(LaunchProbeScore(plan, pa.Params(&w->second), ws_, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const std::vector<float> eager = pa.Download();
        const auto ck_eager = pa.Compare(eager, a.R);
        EXPECT_TRUE(ck_eager.scores.ok()) << DescribeComparison(ck_eager.scores);
        EXPECT_LE(ck_eager.scores.rel_l2, L2Tolerance(dtype, precision));

        // Capture: copies + launch.
        cudaGraph_t graph = nullptr;
        cudaGraphExec_t exec = nullptr;
        CUDA_ASSERT(cudaStreamBeginCapture(stream_, cudaStreamCaptureModeThreadLocal));
        CUDA_ASSERT(cudaMemcpyAsync(pa.args_d(), pinned_args, sizeof(ProbeScoreDeviceArgs),
                                    cudaMemcpyHostToDevice, stream_));
        CUDA_ASSERT(cudaMemcpyAsync(pa.rows_d(), pinned_rows, max_rows * sizeof(int32_t),
                                    cudaMemcpyHostToDevice, stream_));
        const cudaError_t launch = LaunchProbeScore(plan, pa.Params(&w->second), ws_, stream_);
        const cudaError_t end = cudaStreamEndCapture(stream_, &graph);
        CUDA_ASSERT(launch);
        CUDA_ASSERT(end);
        CUDA_ASSERT(cudaGraphInstantiate(&exec, graph, 0));

        // Replay == eager, bit for bit.
        CUDA_ASSERT(Poison(pa.out(), pa.out_elems(), stream_));
        CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const std::vector<float> replay = pa.Download();
        EXPECT_EQ(std::memcmp(replay.data(), eager.data(), eager.size() * sizeof(float)), 0);

        // New request through the same graph.
        *pinned_args = args_b;
        std::memcpy(pinned_rows, pb.rows().data(), max_rows * sizeof(int32_t));
        CUDA_ASSERT(Poison(pa.out(), pa.out_elems(), stream_));
        CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const auto ck_b = pb.Compare(pa.Download(), b.R);
        EXPECT_TRUE(ck_b.scores.ok()) << DescribeComparison(ck_b.scores);
        EXPECT_EQ(ck_b.tail_touched, 0);
        EXPECT_LE(ck_b.scores.rel_l2, L2Tolerance(dtype, precision));

        // Back to the first request: the same bits as the first replay.
        *pinned_args = pa.args();
        std::memcpy(pinned_rows, pa.rows().data(), max_rows * sizeof(int32_t));
        CUDA_ASSERT(Poison(pa.out(), pa.out_elems(), stream_));
        CUDA_ASSERT(cudaGraphLaunch(exec, stream_));
        CUDA_ASSERT(cudaStreamSynchronize(stream_));
        const std::vector<float> again = pa.Download();
        EXPECT_EQ(std::memcmp(again.data(), eager.data(), eager.size() * sizeof(float)), 0);

        CUDA_ASSERT(cudaGraphExecDestroy(exec));
        CUDA_ASSERT(cudaGraphDestroy(graph));
        CUDA_ASSERT(cudaFreeHost(pinned_args));
        CUDA_ASSERT(cudaFreeHost(pinned_rows));
      }
    }
  }
}

// Precision, on full float32 weights (what a probe file holds): exact keeps them on every path
// (every element within the fp32-accumulation bound, and the block's relative L2 error under
// 5e-5); fast rounds them to the activations' type on the tensor-core paths (the bound then
// includes that rounding), which costs ~1e-3 relative L2: the test asserts exact is at least 10x
// closer there, so that an "exact" path that rounds cannot pass.
TEST_F(ProbeScoreGpuTest, ExactPrecisionKeepsFloat32Weights) {
  uint64_t n = 4000;
  for (common::DType dtype : {common::DType::kBFloat16, common::DType::kFloat16}) {
    for (int32_t P : {1, 16, 128, 1024}) {
      for (int32_t R : {1, 64, 1000, 8192}) {
        ++n;
        Case c{dtype, R, 4096, P, R, static_cast<int>(n % kNumLayouts), 0, Activation::kNone, n};
        double rel_l2[2][kNumProbeScorePaths] = {};
        for (ProbePrecision precision : {ProbePrecision::kExact, ProbePrecision::kFast}) {
          c.precision = precision;
          SCOPED_TRACE(CaseName(c));
          const auto* w = Weights(dtype, P, c.H, precision, /*round=*/0);
          ASSERT_NE(w, nullptr);
          Problem prob;
          prob.Setup(c, w->first);
          ASSERT_FALSE(HasFatalFailure());
          for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
            const auto path = static_cast<ProbeScorePath>(pi);
            if (!ProbeScorePathSupports(path, prob.Shape(), Resources().device)) continue;
            SCOPED_TRACE(ProbeScorePathName(path));
            ProbeScorePlan plan;
            CUDA_ASSERT(PlanProbeScore(prob.Shape(), path, Resources(), {}, &plan));
            CUDA_ASSERT(Poison(prob.out(), prob.out_elems(), stream_));
            CUDA_ASSERT(LaunchProbeScore(plan, prob.Params(&w->second), ws_, stream_));
            CUDA_ASSERT(cudaStreamSynchronize(stream_));
            // fused_cuda reads the float32 weights whatever the precision.
            const bool rounds =
                precision == ProbePrecision::kFast && path != ProbeScorePath::kFusedCuda;
            ScoreErrorModel model;
            if (rounds) model.operand_u = UnitRoundoff(dtype);
            const auto ck = prob.Compare(prob.Download(), c.R, model);
            EXPECT_TRUE(ck.scores.ok()) << DescribeComparison(ck.scores);
            EXPECT_EQ(ck.tail_touched, 0);
            if (!rounds) EXPECT_LE(ck.scores.rel_l2, L2Tolerance(dtype, ProbePrecision::kExact));
            rel_l2[static_cast<int>(precision)][pi] = ck.scores.rel_l2;
          }
        }
        for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
          const double exact = rel_l2[0][pi], fast = rel_l2[1][pi];
          if (fast == 0.0 || static_cast<ProbeScorePath>(pi) == ProbeScorePath::kFusedCuda)
            continue;
          EXPECT_LE(10.0 * exact, fast)
              << CaseName(c) << " " << ProbeScorePathName(static_cast<ProbeScorePath>(pi));
          std::printf("[precision] %s R=%d P=%d %-12s rel L2 exact %.2e fast %.2e\n",
                      common::DTypeName(dtype), R, P,
                      ProbeScorePathName(static_cast<ProbeScorePath>(pi)), exact, fast);
        }
      }
    }
  }
}

// The sweeps last: they take most of the time.
TEST_F(ProbeScoreGpuTest, AllPathsBf16FullSweep) {
  std::map<std::string, Worst> worst;
  RunCases(SweepCases(common::DType::kBFloat16), ProbeScoreTuning{}, &worst);
  PrintWorst(worst);
}

TEST_F(ProbeScoreGpuTest, AllPathsFp16Sweep) {
  std::map<std::string, Worst> worst;
  RunCases(SweepCases(common::DType::kFloat16), ProbeScoreTuning{}, &worst);
  PrintWorst(worst);
}

TEST_F(ProbeScoreGpuTest, AllPathsFp32Sweep) {
  std::map<std::string, Worst> worst;
  RunCases(SweepCases(common::DType::kFloat32), ProbeScoreTuning{}, &worst);
  PrintWorst(worst);
}

}  // namespace
}  // namespace probesidecar::kernels::probe_score_test

int main(int argc, char** argv) {
  namespace kernels = probesidecar::kernels;
  return kernels::gpu_test::RunGpuTests(argc, argv, &kernels::probe_score_test::g_family);
}
