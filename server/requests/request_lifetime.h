// How long a request stays worth running: until its caller's deadline passes, or until its caller
// goes away (cancels, or its connection breaks). Executors check it when a worker takes the
// request and, on the CPU backend, between the tasks of a running request, so that work nobody
// waits for any more neither runs nor holds a worker.
#pragma once

#include <functional>

#include "absl/status/status.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace probesidecar::server {

inline absl::Status DeadlinePassed() {
  return absl::DeadlineExceededError("the request's deadline passed before its work was done");
}

struct RequestLifetime {
  // The caller's deadline (gRPC's, carried over); InfiniteFuture when it set none.
  absl::Time deadline = absl::InfiniteFuture();
  // True once the caller has cancelled or gone away. Callable from any thread until the request
  // is answered; empty: never.
  std::function<bool()> cancelled;

  // OK while the request is worth running; DEADLINE_EXCEEDED once its deadline has passed,
  // CANCELLED once its caller has gone. Costs a clock read and, with `cancelled`, a short lock
  // inside gRPC: cheap next to a task of CPU scoring or a graph launch.
  absl::Status Check() const {
    const absl::Time now = absl::Now();
    if (now >= deadline) return DeadlinePassed();
    if (cancelled && cancelled()) {
      // The caller's deadline is ours minus the request's transit, so its own timer fires first
      // and its cancellation arrives just before our deadline: that is the deadline passing.
      if (now + kDeadlineSkew >= deadline) return DeadlinePassed();
      return absl::CancelledError(
          "the caller cancelled the request (or went away) before its work was done");
    }
    return absl::OkStatus();
  }

  // How much earlier than ours the caller's deadline may pass (the request's transit, on a busy
  // host), for telling a deadline from a cancellation.
  static constexpr absl::Duration kDeadlineSkew = absl::Milliseconds(20);
};

}  // namespace probesidecar::server
