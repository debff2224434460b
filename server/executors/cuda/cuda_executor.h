// The CUDA backend: per GPU, one worker thread per stream slot (each slot a CUDA stream with its
// own staging and cache of captured graphs), fed from one bounded queue.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/config/config.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// TEST-ONLY: PROBESIDECAR_TEST_ILLEGAL_ADDRESS_AT=N makes the Nth Score request (counted from 1,
// in submission order) first launch a kernel that writes out of bounds (kernels/test_faults): a
// real CUDA fault that loses the context, for the tests of what the server does then. Off unless
// set when the server starts; not a flag, not in --help. Never set it in production.
inline constexpr char kIllegalAddressAtEnv[] = "PROBESIDECAR_TEST_ILLEGAL_ADDRESS_AT";

// The executor of one device, config.device. UNAVAILABLE (with the reason) when that device is
// not usable.
absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config);

// The CUDA devices this process sees; UNAVAILABLE when there are none.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace probesidecar::server
