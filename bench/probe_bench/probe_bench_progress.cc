#include "bench/probe_bench/probe_bench_progress.h"

#include <cstdio>

#include "absl/time/clock.h"

namespace probesidecar::bench {

Progress::Progress(std::string title, const Recorder& recorder, std::function<int64_t()> sent,
                   bool enabled)
    : title_(std::move(title)), recorder_(recorder), sent_(std::move(sent)) {
  if (enabled) thread_ = std::thread([this] { Loop(); });
}

Progress::~Progress() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void Progress::Loop() {
  const absl::Time start = absl::Now();
  absl::Time last = start;
  int64_t last_calls = 0;
  absl::MutexLock lock(&mu_);
  while (!mu_.AwaitWithTimeout(absl::Condition(&stop_), absl::Seconds(1))) {
    const absl::Time now = absl::Now();
    const Recorder::Snapshot s = recorder_.Now();
    const double rate = (s.calls - last_calls) / absl::ToDoubleSeconds(now - last);
    std::fprintf(stderr,
                 "probe-bench: %s  %5.1f s  sent %lld  ok %lld  errors %lld  %.0f/s  "
                 "p50 %.0f us  p99 %.0f us\n",
                 title_.c_str(), absl::ToDoubleSeconds(now - start),
                 static_cast<long long>(sent_()), static_cast<long long>(s.ok),
                 static_cast<long long>(s.calls - s.ok), rate, s.p50_us, s.p99_us);
    last = now;
    last_calls = s.calls;
  }
}

}  // namespace probesidecar::bench
