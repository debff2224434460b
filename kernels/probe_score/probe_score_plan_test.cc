// Host-side planning without a GPU: the dispatcher's decisions, the plans' invariants for every
// path over a sweep of shapes, the launch plans the H200 ran (as listed under "Launch plans of
// the default paths" in bench/results/probe_score.md), tuning overrides and rejections.
#include "kernels/probe_score/probe_score_plan.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <string>

#include "kernels/probe_score/probe_score_config.h"

namespace probesidecar::kernels {
namespace {

using common::DType;
using probe_score_detail::kFusedPTValues;
using probe_score_detail::kFusedSmemLimit;
using probe_score_detail::kNumTcConfigs;
using probe_score_detail::kTcConfigs;
using probe_score_detail::TcSmemBytes;

// An H200 as the workspace reads it (132 SMs, 228 KB of shared memory per SM, 1 KB reserved per
// block); fused_cuda's register counts as ptxas reports them (bench/NOTES.md: 114-128).
ProbeScoreDeviceFacts H200() {
  ProbeScoreDeviceFacts d;
  d.cc_major = 9;
  d.num_sms = 132;
  d.smem_per_sm = 233472;
  d.smem_per_block_optin = 232448;
  d.reserved_smem_per_block = 1024;
  d.max_threads_per_sm = 2048;
  d.regs_per_sm = 65536;
  for (auto& per_dtype : d.fused_cuda_regs) {
    for (int32_t& regs : per_dtype) regs = 128;
  }
  return d;
}

// A device of `family` as the workspace reads it (ProbeScoreFactsFrom, gather_wgmma where the
// family runs sm_90a code), the same register counts.
ProbeScoreDeviceFacts FamilyFacts(const DeviceFamily& family) {
  ProbeScoreDeviceFacts d = ProbeScoreFactsFrom(family.limits);
  d.gather_wgmma = family.sm90a;
  for (auto& per_dtype : d.fused_cuda_regs) {
    for (int32_t& regs : per_dtype) regs = 128;
  }
  return d;
}

// The benchmark's workspace (probe-score-bench).
ProbeScoreResources BenchResources() {
  ProbeScoreWorkspaceConfig config;
  config.max_rows = 8192;
  config.max_hidden = 8192;
  config.max_probes = 1024;
  return ProbeScoreResources{H200(), ProbeScoreWorkspaceLimitsFor(config)};
}

ProbeScorePlan Plan(DType dtype, int32_t R, int32_t H, int32_t P, ProbeScorePath path,
                    const ProbeScoreTuning& tuning = {}) {
  ProbeScorePlan plan;
  EXPECT_EQ(PlanProbeScore({dtype, R, P, H}, path, BenchResources(), tuning, &plan), cudaSuccess)
      << common::DTypeName(dtype) << " R=" << R << " H=" << H << " P=" << P << " "
      << ProbeScorePathName(path);
  return plan;
}

// ---------------------------------------------------------------------------------------------
// Dispatcher.

TEST(ProbeScoreDispatchTest, NamesAreStable) {
  EXPECT_STREQ(ProbeScorePathName(ProbeScorePath::kFusedCuda), "fused_cuda");
  EXPECT_STREQ(ProbeScorePathName(ProbeScorePath::kFusedTensorCore), "fused_tc");
  EXPECT_STREQ(ProbeScorePathName(ProbeScorePath::kGatherGemm), "gather_gemm");
}

TEST(ProbeScoreDispatchTest, ChoosesASupportedPathEverywhere) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
    for (int32_t R : {1, 7, 64, 256, 1000, 4096, 8192, 65536}) {
      for (int32_t P : {1, 2, 3, 16, 17, 64, 128, 512, 1024, 4096}) {
        for (int32_t H : {1, 7, 896, 2048, 4096, 5120, 8192, 12288}) {
          const ProbeScoreShape shape{dtype, R, P, H};
          const ProbeScorePath path = ChooseProbeScorePath(shape, H200());
          EXPECT_TRUE(ProbeScorePathSupports(path, shape, H200()))
              << common::DTypeName(dtype) << " R=" << R << " P=" << P << " H=" << H << " -> "
              << ProbeScorePathName(path);
          if (dtype == DType::kFloat32) {
            EXPECT_NE(path, ProbeScorePath::kFusedTensorCore);
          }
        }
      }
    }
  }
}

TEST(ProbeScoreDispatchTest, SupportRules) {
  const auto supports = [](ProbeScorePath path, DType dtype, int32_t P, int32_t H) {
    return ProbeScorePathSupports(path, {dtype, 64, P, H}, H200());
  };
  EXPECT_FALSE(supports(ProbeScorePath::kFusedTensorCore, DType::kFloat32, 16, 4096));
  EXPECT_FALSE(supports(ProbeScorePath::kFusedTensorCore, DType::kBFloat16, 16, 4100));
  EXPECT_TRUE(supports(ProbeScorePath::kFusedTensorCore, DType::kFloat16, 1, 4104));
  EXPECT_TRUE(supports(ProbeScorePath::kFusedCuda, DType::kFloat32, 4096, 7));
  EXPECT_TRUE(supports(ProbeScorePath::kGatherGemm, DType::kBFloat16, 1, 1));
  EXPECT_FALSE(supports(ProbeScorePath::kFusedCuda, DType::kFloat32, 0, 4096));
}

// The shape of the measured decision (the Crossovers of bench/results/probe_score.md): many
// probes over many rows never run on CUDA cores, and one probe never goes through a GEMM call.
TEST(ProbeScoreDispatchTest, FollowsMeasuredCrossovers) {
  const auto choose = [](DType dtype, int32_t R, int32_t P) {
    return ChooseProbeScorePath({dtype, R, P, 4096}, H200());
  };
  for (DType dtype : {DType::kFloat16, DType::kBFloat16}) {
    EXPECT_NE(choose(dtype, 8192, 1024), ProbeScorePath::kFusedCuda);
    EXPECT_NE(choose(dtype, 8192, 1), ProbeScorePath::kGatherGemm);
    EXPECT_NE(choose(dtype, 1, 1), ProbeScorePath::kGatherGemm);
  }
  EXPECT_EQ(choose(DType::kFloat32, 8192, 1), ProbeScorePath::kFusedCuda);
  EXPECT_EQ(choose(DType::kFloat32, 8192, 1024), ProbeScorePath::kGatherGemm);
}

// ---------------------------------------------------------------------------------------------
// Plans.

// What the H200 ran for these shapes (bench/results/probe_score.md, "Launch plans of the default
// paths"): planning moved out of the launcher without changing a plan.
TEST(ProbeScorePlanTest, ReproducesTheLaunchPlansTheH200Ran) {
  struct Golden {
    int32_t R, P;
    ProbeScorePath path;
    const char* plan;
  };
  const Golden goldens[] = {
      {1, 1, ProbeScorePath::kFusedCuda, "pt=1 splits=16 grid=1x16x1 smem=1024"},
      {1024, 1, ProbeScorePath::kFusedCuda, "pt=1 splits=8 grid=32x8x1 smem=2048"},
      {4096, 1, ProbeScorePath::kFusedCuda, "pt=1 splits=3 grid=64x3x1 smem=6144"},
      {8192, 1, ProbeScorePath::kFusedCuda, "pt=1 splits=1 grid=256x1x1 smem=16384"},
      {64, 4, ProbeScorePath::kFusedCuda, "pt=4 splits=16 grid=2x16x1 smem=4096"},
      {1, 1, ProbeScorePath::kFusedTensorCore, "tile=64x16 splits=16 grid=1x1x16"},
      {256, 4, ProbeScorePath::kFusedTensorCore, "tile=64x16 splits=16 grid=1x4x16"},
      {1024, 1, ProbeScorePath::kFusedTensorCore, "tile=64x16k128 splits=8 grid=1x16x8"},
      {4096, 1, ProbeScorePath::kFusedTensorCore, "tile=64x16k128 splits=3 grid=1x64x3"},
      {8192, 1, ProbeScorePath::kFusedTensorCore, "tile=32x16k256 splits=1 grid=1x256x1"},
      {8192, 1, ProbeScorePath::kGatherGemm, "chunk_rows=8192 chunks=1"},
  };
  for (const Golden& g : goldens) {
    EXPECT_EQ(DescribeProbeScorePlan(Plan(DType::kBFloat16, g.R, 4096, g.P, g.path)), g.plan)
        << "R=" << g.R << " P=" << g.P << " " << ProbeScorePathName(g.path);
  }
}

// Every plan covers its shape exactly once, fits the workspace and respects the kernels' limits.
TEST(ProbeScorePlanTest, PlansCoverTheShapeAndFitTheWorkspace) {
  const ProbeScoreWorkspaceLimits limits = BenchResources().workspace;
  for (DType dtype : {DType::kFloat32, DType::kBFloat16}) {
    for (int32_t R : {1, 7, 64, 300, 1024, 8192}) {
      for (int32_t P : {1, 3, 16, 100, 1024}) {
        for (int32_t H : {8, 1000, 4096, 8192}) {
          for (int pi = 0; pi < kNumProbeScorePaths; ++pi) {
            const auto path = static_cast<ProbeScorePath>(pi);
            const ProbeScoreShape shape{dtype, R, P, H};
            if (!ProbeScorePathSupports(path, shape, H200())) continue;
            SCOPED_TRACE(std::string(common::DTypeName(dtype)) + " R=" + std::to_string(R) +
                         " P=" + std::to_string(P) + " H=" + std::to_string(H) + " " +
                         ProbeScorePathName(path));
            const ProbeScorePlan p = Plan(dtype, R, H, P, path);
            EXPECT_EQ(p.path, path);
            const ProbeScoreWorkspaceNeeds& n = p.needs;
            EXPECT_LE(n.partial_floats, limits.partial_floats);
            EXPECT_LE(n.counters, limits.counters);
            EXPECT_LE(n.staging_x_bytes, limits.staging_x_bytes);
            EXPECT_LE(n.staging_c_bytes, limits.staging_c_bytes);
            if (path == ProbeScorePath::kFusedCuda) {
              const FusedCudaPlan& f = p.fused_cuda;
              const int pt = kFusedPTValues[f.pt_index];
              EXPECT_GE(static_cast<int64_t>(f.grid.z) * pt, P);  // probe tiles cover P
              EXPECT_LT(static_cast<int64_t>(f.grid.z - 1) * pt, P);
              EXPECT_GE(static_cast<int64_t>(f.grid.y) * f.k_per_split, H);      // splits cover H
              EXPECT_LT(static_cast<int64_t>(f.grid.y - 1) * f.k_per_split, H);  // none empty
              EXPECT_LE(f.grid.x, (R + 31u) / 32u);  // row groups: at most one per row block
              EXPECT_LE(f.k_per_smem, f.k_per_split);
              EXPECT_LE(f.smem_bytes, kFusedSmemLimit);
              EXPECT_EQ(f.smem_bytes, pt * f.k_per_smem * 4);
              EXPECT_EQ(n.partial_floats > 0, f.grid.y > 1);
            } else if (path == ProbeScorePath::kFusedTensorCore) {
              const FusedTcPlan& t = p.fused_tc;
              const auto& tile = kTcConfigs[t.config];
              EXPECT_EQ(t.grid.x, static_cast<uint32_t>((P + tile.bn - 1) / tile.bn));
              EXPECT_EQ(t.grid.y, static_cast<uint32_t>((R + tile.bm - 1) / tile.bm));
              EXPECT_EQ(t.k_tiles, (H + tile.bk - 1) / tile.bk);
              EXPECT_GE(t.grid.z, 1u);
              EXPECT_LE(t.grid.z, static_cast<uint32_t>(t.k_tiles));  // every split has K tiles
              EXPECT_EQ(t.smem_bytes, probe_score_detail::TcSmemBytes(tile, t.terms));
              if (t.grid.z > 1) {
                EXPECT_GE(static_cast<int64_t>(t.reduce_grid.x) * 256, int64_t{R} * P);
              }
            } else {
              const GatherGemmPlan& g = p.gather_gemm;
              EXPECT_GE(int64_t{g.chunk_rows} * g.num_chunks, R);
              EXPECT_LT(int64_t{g.chunk_rows} * (g.num_chunks - 1), R);
              EXPECT_GE(g.ldc, P);
              EXPECT_EQ(g.ldc % 4, 0);
            }
          }
        }
      }
    }
  }
}

TEST(ProbeScorePlanTest, HonoursTuning) {
  ProbeScoreTuning t;
  t.tc_config = 2;
  t.splits = 3;
  t.gather_chunk_rows = 1000;
  const ProbeScorePlan tc =
      Plan(DType::kBFloat16, 300, 4096, 200, ProbeScorePath::kFusedTensorCore, t);
  EXPECT_EQ(tc.fused_tc.config, 2);
  EXPECT_EQ(tc.fused_tc.grid.z, 3u);
  EXPECT_EQ(Plan(DType::kFloat32, 300, 4096, 4, ProbeScorePath::kFusedCuda, t).fused_cuda.grid.y,
            3u);
  const ProbeScorePlan g = Plan(DType::kBFloat16, 4096, 4096, 64, ProbeScorePath::kGatherGemm, t);
  EXPECT_EQ(g.gather_gemm.num_chunks, 5);  // 4096 rows in chunks of at most 1000
  EXPECT_LE(g.gather_gemm.chunk_rows, 1000);
}

TEST(ProbeScorePlanTest, SplitsShrinkToThePartialBuffer) {
  ProbeScoreResources small = BenchResources();
  small.workspace.partial_floats = 64 * 16 * 4;  // room for 4 splits of one 64 x 16 tile
  ProbeScorePlan plan;
  ASSERT_EQ(PlanProbeScore({DType::kBFloat16, 1, 1, 4096}, ProbeScorePath::kFusedTensorCore, small,
                           {}, &plan),
            cudaSuccess);
  EXPECT_EQ(plan.fused_tc.grid.z, 4u);
  EXPECT_LE(plan.needs.partial_floats, small.workspace.partial_floats);
}

TEST(ProbeScorePlanTest, ZeroRowsPlansNothing) {
  const ProbeScorePlan p = Plan(DType::kBFloat16, 0, 4096, 16, ProbeScorePath::kFusedTensorCore);
  EXPECT_EQ(p.shape.max_rows, 0);
  EXPECT_EQ(p.fused_tc.grid.x, 0u);
  EXPECT_EQ(p.needs.partial_floats, 0);
  EXPECT_EQ(DescribeProbeScorePlan(p), "no rows");
}

TEST(ProbeScorePlanTest, RejectsWhatTheWorkspaceOrPathCannotRun) {
  const ProbeScoreResources res = BenchResources();
  ProbeScorePlan plan;
  const auto plan_of = [&](ProbeScoreShape shape, ProbeScorePath path,
                           const ProbeScoreResources& r) {
    return PlanProbeScore(shape, path, r, {}, &plan);
  };
  const ProbeScoreShape ok{DType::kBFloat16, 64, 16, 4096};
  EXPECT_EQ(plan_of(ok, ProbeScorePath::kFusedCuda, res), cudaSuccess);
  EXPECT_EQ(plan_of({DType::kFloat32, 64, 16, 4096}, ProbeScorePath::kFusedTensorCore, res),
            cudaErrorInvalidValue);
  EXPECT_EQ(plan_of({DType::kBFloat16, 8193, 16, 4096}, ProbeScorePath::kFusedCuda, res),
            cudaErrorInvalidValue);
  EXPECT_EQ(plan_of({DType::kBFloat16, 64, 1025, 4096}, ProbeScorePath::kFusedCuda, res),
            cudaErrorInvalidValue);
  EXPECT_EQ(plan_of({DType::kBFloat16, 64, 16, 8200}, ProbeScorePath::kGatherGemm, res),
            cudaErrorInvalidValue);
  EXPECT_EQ(plan_of({static_cast<DType>(7), 64, 16, 4096}, ProbeScorePath::kFusedCuda, res),
            cudaErrorInvalidValue);
  ProbeScoreResources no_device = res;
  no_device.device.num_sms = 0;
  EXPECT_EQ(plan_of(ok, ProbeScorePath::kFusedCuda, no_device), cudaErrorInvalidValue);
  EXPECT_EQ(PlanProbeScore(ok, ProbeScorePath::kFusedCuda, res, {}, nullptr),
            cudaErrorInvalidValue);
}

// ---------------------------------------------------------------------------------------------
// GPU families (kDeviceFamilies): every family's limits, from the table of device properties.

TEST(ProbeScoreFamilyTest, TheH200FactsAreTheSm90Family) {
  const ProbeScoreDeviceFacts f = FamilyFacts(*FindDeviceFamily("sm_90"));
  EXPECT_EQ(f.smem_per_block_optin, H200().smem_per_block_optin);
  EXPECT_EQ(f.smem_per_sm, H200().smem_per_sm);
  EXPECT_TRUE(f.gather_wgmma);
  EXPECT_EQ(FindDeviceFamily("sm_75"), nullptr);
}

// Every family, every shape: the dispatcher picks a path the family runs (no gather_wgmma off
// sm_90), and its plan fits the family's blocks (shared memory) and SMs (threads).
TEST(ProbeScoreFamilyTest, EveryFamilyGetsPlansThatFitIt) {
  ProbeScoreWorkspaceConfig config;
  config.max_rows = 8192;
  config.max_hidden = 8192;
  config.max_probes = 4096;
  for (const DeviceFamily& family : kDeviceFamilies) {
    SCOPED_TRACE(family.name);
    const ProbeScoreResources res{FamilyFacts(family), ProbeScoreWorkspaceLimitsFor(config)};
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16}) {
      for (ProbePrecision precision : {ProbePrecision::kFast, ProbePrecision::kExact}) {
        for (int32_t R : {1, 7, 64, 256, 1000, 4096, 8192}) {
          for (int32_t P : {1, 3, 16, 64, 128, 256, 1024, 4096}) {
            for (int32_t H : {896, 4096, 8192}) {
              const ProbeScoreShape shape{dtype, R, P, H, precision};
              const ProbeScorePath path = ChooseProbeScorePath(shape, res.device);
              SCOPED_TRACE(std::string(common::DTypeName(dtype)) + " " +
                           ProbePrecisionName(precision) + " R=" + std::to_string(R) +
                           " P=" + std::to_string(P) + " H=" + std::to_string(H) + " " +
                           ProbeScorePathName(path));
              if (!family.sm90a) {
                EXPECT_NE(path, ProbeScorePath::kGatherWgmma);
              }
              ProbeScorePlan plan;
              ASSERT_EQ(PlanProbeScore(shape, path, res, {}, &plan), cudaSuccess);
              if (path == ProbeScorePath::kFusedTensorCore) {
                EXPECT_LE(plan.fused_tc.smem_bytes, family.limits.smem_per_block_optin);
                EXPECT_EQ(plan.fused_tc.smem_bytes,
                          TcSmemBytes(kTcConfigs[plan.fused_tc.config], plan.fused_tc.terms));
              }
              if (path == ProbeScorePath::kFusedCuda) {
                EXPECT_LE(plan.fused_cuda.smem_bytes, family.limits.smem_per_block_optin);
              }
              // fused_tc where it can run, on every family: each of its plans fits too.
              if (ProbeScorePathSupports(ProbeScorePath::kFusedTensorCore, shape, res.device)) {
                ASSERT_EQ(PlanProbeScore(shape, ProbeScorePath::kFusedTensorCore, res, {}, &plan),
                          cudaSuccess);
                EXPECT_LE(plan.fused_tc.smem_bytes, family.limits.smem_per_block_optin);
              }
            }
          }
        }
      }
    }
  }
}

// The tiles the 99 KB and 163 KB blocks get instead of those that do not fit them, and the
// H200's, unchanged.
TEST(ProbeScoreFamilyTest, TilesStepDownToWhatTheBlockHolds) {
  const auto tile = [](const char* family, int32_t R, int32_t P, ProbePrecision precision) {
    ProbeScoreWorkspaceConfig config;
    const ProbeScoreResources res{FamilyFacts(*FindDeviceFamily(family)),
                                  ProbeScoreWorkspaceLimitsFor(config)};
    ProbeScorePlan plan;
    EXPECT_EQ(PlanProbeScore({DType::kBFloat16, R, P, 4096, precision},
                             ProbeScorePath::kFusedTensorCore, res, {}, &plan),
              cudaSuccess);
    return std::string(kTcConfigs[plan.fused_tc.config].name);
  };
  const ProbePrecision exact = ProbePrecision::kExact, fast = ProbePrecision::kFast;
  // 128x128 exact: 192 KB; 64x64 exact: 128 KB; 64x16k128 exact: 112 KB.
  EXPECT_EQ(tile("sm_90", 8192, 1024, exact), "128x128");
  EXPECT_EQ(tile("sm_100", 8192, 1024, exact), "128x128");
  EXPECT_EQ(tile("sm_80", 8192, 1024, exact), "128x128s2");
  EXPECT_EQ(tile("sm_80", 256, 128, exact), "64x64");
  for (const char* small : {"sm_86", "sm_89", "sm_120"}) {
    SCOPED_TRACE(small);
    EXPECT_EQ(tile(small, 8192, 1024, exact), "64x64s2");
    EXPECT_EQ(tile(small, 256, 128, exact), "64x64s2");
    EXPECT_EQ(tile(small, 2048, 16, exact), "64x16");
    // Fast precision: every configuration fits 99 KB (128x128: 96 KB).
    EXPECT_EQ(tile(small, 8192, 1024, fast), "128x128");
    EXPECT_EQ(tile(small, 2048, 16, fast), "64x16k128");
  }
}

// A forced tile that does not fit the device's blocks is refused, not launched.
TEST(ProbeScoreFamilyTest, ForcedTilesThatDoNotFitAreRefused) {
  ProbeScoreWorkspaceConfig config;
  const ProbeScoreResources res{FamilyFacts(*FindDeviceFamily("sm_120")),
                                ProbeScoreWorkspaceLimitsFor(config)};
  for (int c = 0; c < kNumTcConfigs; ++c) {
    for (ProbePrecision precision : {ProbePrecision::kFast, ProbePrecision::kExact}) {
      const int terms = precision == ProbePrecision::kExact ? 3 : 1;
      ProbeScoreTuning tuning;
      tuning.tc_config = c;
      ProbeScorePlan plan;
      const cudaError_t err = PlanProbeScore({DType::kBFloat16, 1024, 256, 4096, precision},
                                             ProbeScorePath::kFusedTensorCore, res, tuning, &plan);
      const bool fits = TcSmemBytes(kTcConfigs[c], terms) <= 101376;
      EXPECT_EQ(TcConfigFits(c, terms, res.device), fits) << kTcConfigs[c].name;
      EXPECT_EQ(err, fits ? cudaSuccess : cudaErrorInvalidValue) << kTcConfigs[c].name;
      if (fits) {
        EXPECT_EQ(plan.fused_tc.config, c);
      }
    }
  }
}

TEST(ProbeScorePlanTest, WorkspaceLimitsFollowTheConfig) {
  const ProbeScoreWorkspaceLimits l = BenchResources().workspace;
  EXPECT_EQ(l.max_rows, 8192);
  EXPECT_EQ(l.staging_x_bytes, int64_t{128} << 20);  // every row of H = 4096 fp32 fits
  EXPECT_EQ(l.staging_c_bytes, int64_t{8192} * 1024 * 4);
  EXPECT_EQ(l.partial_floats, (int64_t{32} << 20) / 4);
  ProbeScoreWorkspaceConfig small;
  small.max_rows = 10;
  small.max_hidden = 100;
  small.max_probes = 1;
  const ProbeScoreWorkspaceLimits s = ProbeScoreWorkspaceLimitsFor(small);
  EXPECT_EQ(s.staging_x_bytes, 4096);  // 10 x 100 x 4 bytes, rounded up to 256
  EXPECT_EQ(s.staging_c_bytes, 5120);  // 10 rows x 128 (padded probes) x 4 bytes
}

}  // namespace
}  // namespace probesidecar::kernels
