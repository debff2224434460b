// Tests wait for what they need on a condition with a deadline, never with a sleep that hopes.
// Header-only, so that unit tests beside the code use it without linking anything.
#pragma once

#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace probesidecar {

// Polls `condition` every millisecond until it holds (true) or `timeout` has passed (false: the
// condition read once more at the deadline).
template <typename Condition>
bool WaitUntil(Condition condition, absl::Duration timeout = absl::Seconds(30)) {
  const absl::Time deadline = absl::Now() + timeout;
  while (!condition()) {
    if (absl::Now() >= deadline) return condition();
    absl::SleepFor(absl::Milliseconds(1));
  }
  return true;
}

}  // namespace probesidecar
