// Load generation: the closed loop (client threads, each sending its next call when the last one
// is answered) and the open loop (calls sent on a schedule fixed in advance, latency from each
// call's scheduled send time).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "bench/probe_bench/probe_bench_calls.h"
#include "bench/probe_bench/probe_bench_options.h"
#include "bench/probe_bench/probe_bench_stats.h"

namespace probesidecar::bench {

struct LoadSettings {
  double seconds = 1.5;
  int warmup = 100;  // closed loop: per client thread; open loop: in all
  double timeout_seconds = 30.0;
  bool progress = true;
  std::string title;  // of the progress line
  // Open loop.
  Arrivals arrivals = Arrivals::kPoisson;
  int max_outstanding = 256;
  int connections = 4;
  uint64_t seed = 1;
};

// `concurrency` client threads, each on a connection of its own, for `seconds` after `warmup`
// calls each. Fails only when the target cannot be reached; failed calls are counted.
absl::StatusOr<Measurement> RunClosedLoop(const CallMaker& calls, const std::string& target,
                                          int concurrency, const LoadSettings& settings);

// `rate` calls/s for `seconds`, over `max_outstanding` lanes spread on `connections` channels.
absl::StatusOr<Measurement> RunOpenLoop(const CallMaker& calls, const std::string& target,
                                        double rate, const LoadSettings& settings);

// The schedule: send times in seconds from the start, ascending, all < seconds. Constant: i/rate;
// Poisson: exponential gaps of mean 1/rate (seeded).
std::vector<double> SendTimes(double rate, double seconds, Arrivals arrivals, uint64_t seed);

}  // namespace probesidecar::bench
