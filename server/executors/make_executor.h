// Picks and builds the executor for --backend.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/config/config.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// auto: the CUDA backend when a device is usable, else the CPU backend (the reason is logged).
// cuda: the CUDA backend or FAILED_PRECONDITION saying why not. (The test-only fault injector,
// fault_injection.h, is linked into the test binary probe-sidecar-test-faults only.)
absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config);

}  // namespace probesidecar::server
