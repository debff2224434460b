// probe-sidecar-test-faults: the service binary with the test-only fault injector
// (server/executors/fault_injection.h), for the tests of what the service does when a request
// fails as a CUDA error would. Built with the tests only and never installed: the production
// binary does not contain the injector, whatever its environment says.
#include <utility>

#include "server/executors/fault_injection.h"
#include "server/rpc/server.h"

int main(int argc, char** argv) {
  using probesidecar::server::Executor;
  return probesidecar::server::ServerMain(
      argc, argv, [](std::unique_ptr<Executor> executor) -> std::unique_ptr<Executor> {
        const uint64_t every = probesidecar::server::FaultEveryFromEnvironment();
        if (every == 0) return executor;
        return probesidecar::server::InjectFaults(std::move(executor), every);
      });
}
