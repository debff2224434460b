// Small helpers shared by the RPC handlers' files.
#pragma once

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace probesidecar::server {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

inline absl::Status NoBuffersOnThisBackend(const char* backend) {
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA IPC buffers need the CUDA backend; this server runs the ", backend,
                   " backend (start it on a GPU host with --backend cuda or auto)"));
}

}  // namespace probesidecar::server
