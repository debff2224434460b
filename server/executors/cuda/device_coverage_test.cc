#include "server/executors/cuda/device_coverage.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace probesidecar::server {
namespace {

TEST(DeviceCoverageTest, TheMessageNamesTheDeviceAndTheBuildOption) {
  const std::string m = UncoveredDeviceMessage(1, "NVIDIA A100-SXM4-80GB", 8, 0, "90-real +sm_90a");
  EXPECT_NE(m.find("CUDA device 1 (NVIDIA A100-SXM4-80GB, compute capability 8.0)"),
            std::string::npos)
      << m;
  EXPECT_NE(m.find("CUDA targets: 90-real +sm_90a"), std::string::npos) << m;
  EXPECT_NE(m.find("-DCMAKE_CUDA_ARCHITECTURES including 80-real"), std::string::npos) << m;
  EXPECT_NE(m.find("--backend cpu"), std::string::npos) << m;
}

TEST(DeviceCoverageTest, Sm90aPathsOnlyWhereTheyRun) {
  const std::vector<std::string> portable = {"fused_cuda", "fused_tc", "gather_gemm", "split_kv",
                                             "baseline"};
  EXPECT_EQ(KernelPathsFor(false), portable);
  const std::vector<std::string> hopper = {"fused_cuda",    "fused_tc", "gather_gemm",
                                           "gather_wgmma",  "split_kv", "baseline",
                                           "split_kv_sm90a"};
  EXPECT_EQ(KernelPathsFor(true), hopper);
}

}  // namespace
}  // namespace probesidecar::server
