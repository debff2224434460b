// probe-sidecar-test-faults: the service binary with the test-only fault injectors, for the tests
// of what the service does when a request fails as a CUDA error would
// (tests/faults/fault_injection.h, PROBE_SIDECAR_TEST_FAULT_EVERY) and when a real CUDA fault
// loses the GPU context (tests/faults/illegal_address_fault.h,
// PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT). Built with the tests only and never installed: the
// production binary contains neither, whatever its environment says.
#include <utility>

#include "tests/faults/illegal_address_fault.h"
#include "tests/faults/fault_injection.h"
#include "server/rpc/server.h"

int main(int argc, char** argv) {
  using probesidecar::server::Executor;
  probesidecar::server::ArmIllegalAddressFaultFromEnvironment();
  return probesidecar::server::ServerMain(
      argc, argv, [](std::unique_ptr<Executor> executor) -> std::unique_ptr<Executor> {
        const uint64_t every = probesidecar::server::FaultEveryFromEnvironment();
        if (every == 0) return executor;
        return probesidecar::server::InjectFaults(std::move(executor), every);
      });
}
