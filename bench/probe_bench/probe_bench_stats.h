// What probe-bench measured: latencies and status codes of every call, gathered from many
// threads, and the summaries that go into the results.
#pragma once

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace probesidecar::bench {

// The gRPC status code's name, as the server's metrics label it: "OK", "NOT_FOUND", ...
std::string CodeName(grpc::StatusCode code);

// Nearest-rank quantile of sorted samples (0 when empty).
double Quantile(const std::vector<double>& sorted, double q);

// Every call of one record.
struct CallStats {
  std::vector<double> latency_us;                    // sorted
  std::map<std::string, int64_t> codes;              // calls by status code name, OK included
  std::map<std::string, std::string> first_message;  // the first message of each failing code

  int64_t calls() const { return static_cast<int64_t>(latency_us.size()); }
  int64_t ok() const;
};

// Collects calls as they finish; thread-safe.
class Recorder {
 public:
  void Add(double latency_us, const grpc::Status& status);

  struct Snapshot {
    int64_t calls = 0;
    int64_t ok = 0;
    double p50_us = 0;
    double p99_us = 0;
  };
  // So far (copies and partially sorts the samples: meant for once a second).
  Snapshot Now() const;
  // The final result; the recorder is left empty.
  CallStats Take();

 private:
  mutable absl::Mutex mu_;
  CallStats stats_ ABSL_GUARDED_BY(mu_);  // latency_us unsorted until Take
};

// What one load run measured.
struct Measurement {
  CallStats calls;
  double seconds = 0;               // from the first send to the last answer
  int64_t scheduled = 0;            // open loop: sends the schedule held
  int64_t not_sent = 0;             // open loop: over --max-outstanding when due
  double offered_rps = 0;           // open loop: scheduled / --seconds
  std::vector<double> send_lag_us;  // open loop: actual minus scheduled send time, sorted
};

}  // namespace probesidecar::bench
