// TEST-ONLY: a kernel that makes a real CUDA fault, for the server's tests of what happens when
// the GPU context is lost (PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT,
// tests/faults/illegal_address_fault.h). It writes outside every allocation, so the
// launch fails with cudaErrorIllegalAddress and the context is unusable for every later call: a
// sticky error, the kind only a process restart clears. Linked only into the test binary
// probe-sidecar-test-faults, which launches it only when that variable is set.
#pragma once

#include <cuda_runtime_api.h>

namespace probesidecar::kernels {

// Enqueues the faulting kernel on `stream` (the error surfaces at the next synchronisation).
cudaError_t LaunchTestIllegalAddress(cudaStream_t stream);

}  // namespace probesidecar::kernels
