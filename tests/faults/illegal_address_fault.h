// TEST-ONLY: arms a real CUDA fault from the environment, in probe-sidecar-test-faults only
// (tests/faults/test_faults_main.cc). PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT=N makes the Nth Score
// request first launch a kernel that writes out of bounds (tests/faults/test_faults.cu): the CUDA context
// is then lost, for the tests of what the server does (tests/python/test_gpu_faults.py).
#pragma once

namespace probesidecar::server {

inline constexpr char kIllegalAddressAtEnv[] = "PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT";

// Installs the ScoreFaultHook when the variable is a positive integer; otherwise nothing.
void ArmIllegalAddressFaultFromEnvironment();

}  // namespace probesidecar::server
