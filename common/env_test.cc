#include "common/env.h"

#include <gtest/gtest.h>
#include <stdlib.h>

#include <string>

namespace probesidecar::common {
namespace {

TEST(ProjectEnvTest, TheNewNameWinsAndTheOldOneIsADeprecatedAlias) {
  unsetenv("PROBE_SIDECAR_ENV_TEST");
  unsetenv("PROBESIDECAR_ENV_TEST");
  EXPECT_EQ(ProjectEnv("ENV_TEST"), nullptr);

  setenv("PROBESIDECAR_ENV_TEST", "old", 1);
  ::testing::internal::CaptureStderr();
  ASSERT_NE(ProjectEnv("ENV_TEST"), nullptr);
  EXPECT_EQ(std::string(ProjectEnv("ENV_TEST")), "old");
  const std::string warned = ::testing::internal::GetCapturedStderr();
  // Once per name, naming the new spelling.
  EXPECT_EQ(warned,
            "warning: PROBESIDECAR_ENV_TEST is deprecated; set PROBE_SIDECAR_ENV_TEST instead\n");

  setenv("PROBE_SIDECAR_ENV_TEST", "new", 1);
  EXPECT_EQ(std::string(ProjectEnv("ENV_TEST")), "new");
  unsetenv("PROBE_SIDECAR_ENV_TEST");
  unsetenv("PROBESIDECAR_ENV_TEST");
}

}  // namespace
}  // namespace probesidecar::common
