// The CUDA backend: per GPU, a few workers, each with its own stream, pinned and device staging
// and a cache of captured graphs.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "server/config.h"
#include "server/executor.h"

namespace probesidecar::server {

// UNAVAILABLE (with the reason) when no usable CUDA device is present.
absl::StatusOr<std::unique_ptr<Executor>> CreateCudaExecutor(const Config& config);

}  // namespace probesidecar::server
