// Picks and builds the executor for --backend.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/config/config.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// auto: the CUDA backend when a device is usable, else the CPU backend (the reason is logged).
// cuda: the CUDA backend or FAILED_PRECONDITION saying why not. With the test-only
// PROBESIDECAR_TEST_FAULT_EVERY set, wrapped in a fault injector (fault_injection.h).
absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config);

}  // namespace probesidecar::server
