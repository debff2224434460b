#include "tests/faults/illegal_address_fault.h"

#include <cstdint>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "tests/faults/test_faults.h"
#include "server/executors/cuda/score_fault_hook.h"
#include "server/observability/log.h"

namespace probesidecar::server {

void ArmIllegalAddressFaultFromEnvironment() {
  const char* value = std::getenv(kIllegalAddressAtEnv);
  uint64_t at = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &at) || at == 0) return;
  InstallScoreFaultHook({.at = at, .launch = &kernels::LaunchTestIllegalAddress});
  LogWarning(
      "%s=%d: Score request number %d (on each device) will first launch a kernel that writes out "
      "of bounds (a test-only fault hook: the CUDA context is then lost and the server stops)",
      kIllegalAddressAtEnv, static_cast<int>(at), static_cast<int>(at));
}

}  // namespace probesidecar::server
