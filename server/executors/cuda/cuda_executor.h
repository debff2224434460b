// The CUDA backend: per GPU, one worker thread per stream slot (each slot a CUDA stream with its
// own staging and cache of captured graphs), fed from one bounded queue.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/config/config.h"
#include "server/executors/executor.h"

namespace probesidecar::server {

// UNAVAILABLE (with the reason) when no usable CUDA device is present.
absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config);

}  // namespace probesidecar::server
