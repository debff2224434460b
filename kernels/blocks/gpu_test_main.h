// The main() of every GPU test (test code, header only): CTest's skip status 77 only where there
// is no device at all (no driver installed, or none found); every other reason not to run is a
// failure, so that a broken GPU machine cannot pass as "skipped" (gpu_test_device.h).
//
//   int main(int argc, char** argv) {
//     return probesidecar::kernels::gpu_test::RunGpuTests(argc, argv);
//   }
#pragma once

#include <gtest/gtest.h>

#include "kernels/blocks/gpu_test_device.h"

namespace probesidecar::kernels::gpu_test {

// `family`: where the test keeps the family its planners are confined to (nullptr: it does not
// plan; the family named by the environment is still checked).
inline int RunGpuTests(int argc, char** argv, const DeviceFamily** family = nullptr) {
  const DeviceFamily* unused = nullptr;
  const DeviceCheck check = CheckTestDevice(family != nullptr ? family : &unused);
  if (check == DeviceCheck::kSkip) return 77;
  if (check == DeviceCheck::kFail) return 1;
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}

}  // namespace probesidecar::kernels::gpu_test
