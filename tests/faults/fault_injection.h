// TEST-ONLY: an executor that makes every Nth Score or Verify fail as a CUDA error would, so that
// the service's handling of one (INTERNAL, the cuda_errors metric, the next requests served) can
// be tested on machines without a GPU.
//
// Linked only into the test binary probe-sidecar-test-faults (tests/faults/test_faults_main.cc),
// never into probe-sidecar; there it is off unless the environment variable
// PROBE_SIDECAR_TEST_FAULT_EVERY=N (N >= 1) is set when the server starts.
#pragma once

#include <memory>

#include "server/executors/executor.h"

namespace probesidecar::server {

inline constexpr char kFaultEveryEnv[] = "PROBE_SIDECAR_TEST_FAULT_EVERY";

// Wraps `inner` so that requests number N, 2N, 3N ... (Score and Verify counted together, in the
// order they are submitted) run as usual and then answer INTERNAL, the way a failed CUDA call
// answers. Everything else is passed through.
std::unique_ptr<Executor> InjectFaults(std::unique_ptr<Executor> inner, uint64_t every);

// N from PROBE_SIDECAR_TEST_FAULT_EVERY; 0 when it is unset, empty or not a positive integer.
uint64_t FaultEveryFromEnvironment();

}  // namespace probesidecar::server
