// Small helpers shared by the RPC handlers' files.
#pragma once

#include <grpcpp/server_context.h>

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "server/requests/request_lifetime.h"

namespace probesidecar::server {

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The call's deadline and cancellation, for the executor: `context` must outlive the request's
// work (it does: the call ends only once the work has answered).
inline RequestLifetime LifetimeOf(grpc::CallbackServerContext* context) {
  RequestLifetime lifetime;
  if (const std::chrono::system_clock::time_point deadline = context->deadline();
      deadline != std::chrono::system_clock::time_point::max()) {
    lifetime.deadline = absl::FromChrono(deadline);
  }
  lifetime.cancelled = [context] { return context->IsCancelled(); };
  return lifetime;
}

// What new work, and the streams still open, get once the server drains.
inline absl::Status ShuttingDown() { return absl::UnavailableError("the server is shutting down"); }

inline absl::Status NoBuffersOnThisBackend(const char* backend) {
  return absl::FailedPreconditionError(
      absl::StrCat("CUDA IPC buffers need the CUDA backend; this server runs the ", backend,
                   " backend (start it on a GPU host with --backend cuda or auto)"));
}

}  // namespace probesidecar::server
