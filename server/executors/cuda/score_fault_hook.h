// TEST-ONLY seam for a real CUDA fault in a Score request: the tests of what the server does
// when its GPU context is lost (tests/python/test_gpu_faults.py) arm it in the test binary
// probe-sidecar-test-faults (tests/faults/illegal_address_fault.h). The production binary
// never installs a hook, and holds neither the faulting kernel nor the variable that arms it.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace probesidecar::server {

// Enqueues the faulting work on `stream`.
using FaultLaunch = cudaError_t (*)(cudaStream_t stream);

struct ScoreFaultHook {
  // The Score request (counted from 1, in submission order, per device) that first enqueues
  // `launch` on its stream; 0: none.
  uint64_t at = 0;
  FaultLaunch launch = nullptr;
};

// Before the CUDA executors are created (each reads the hook once, at its start).
void InstallScoreFaultHook(ScoreFaultHook hook);
ScoreFaultHook InstalledScoreFaultHook();

}  // namespace probesidecar::server
