#include "server/executors/cuda/illegal_address_fault.h"

#include <cstdint>
#include <cstdlib>

#include "absl/strings/numbers.h"
#include "kernels/test_faults/test_faults.h"
#include "server/executors/cuda/score_fault_hook.h"

namespace probesidecar::server {

void ArmIllegalAddressFaultFromEnvironment() {
  const char* value = std::getenv(kIllegalAddressAtEnv);
  uint64_t at = 0;
  if (value == nullptr || !absl::SimpleAtoi(value, &at) || at == 0) return;
  InstallScoreFaultHook({.at = at, .launch = &kernels::LaunchTestIllegalAddress});
}

}  // namespace probesidecar::server
