// The CUDA backend: per GPU, one worker thread per stream slot (each slot a CUDA stream with its
// own staging and cache of captured graphs), fed from one bounded queue.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/config/config.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// The executor of one device, config.device. UNAVAILABLE (with the reason) when that device is
// not usable.
absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config);

// The CUDA devices this process sees; UNAVAILABLE when there are none.
absl::StatusOr<int> CudaDeviceCount();

}  // namespace probesidecar::server
