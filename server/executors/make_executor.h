// Picks and builds the executor for --backend.
#pragma once

#include <functional>
#include <memory>

#include "absl/status/statusor.h"
#include "server/config/config.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// auto: the CUDA backend when the devices of --devices are usable, else (no device usable) the CPU
// backend (the reason is logged). cuda: the CUDA backend or FAILED_PRECONDITION saying why not.
// Either way FAILED_PRECONDITION when some of the devices are usable and others are not (a server
// of fewer devices than asked is not started, nor a CPU one in its place), or when the build holds
// no code for a device. (The test-only fault injectors are linked into the test binary
// probe-sidecar-test-faults only.)
absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config);

// The CUDA side of MakeExecutor: the devices the process sees, and one device's executor (made
// from a copy of the config whose `device` and `devices` name that device). Tests pass fakes.
struct CudaExecutorFactory {
  std::function<absl::StatusOr<int>()> device_count;
  std::function<absl::StatusOr<std::unique_ptr<Executor>>(const Config&)> create;
};
absl::StatusOr<std::unique_ptr<Executor>> MakeExecutor(const Config& config,
                                                       const CudaExecutorFactory& cuda);

}  // namespace probesidecar::server
