#include "bench/probe_bench/probe_bench_stats.h"

#include <algorithm>

#include "absl/status/status.h"

namespace probesidecar::bench {

std::string CodeName(grpc::StatusCode code) {
  // grpc::StatusCode and absl::StatusCode share their values (google.rpc.Code).
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(code));
}

double Quantile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  return sorted[std::min(sorted.size() - 1, static_cast<size_t>(q * (sorted.size() - 1) + 0.5))];
}

int64_t CallStats::ok() const {
  auto it = codes.find("OK");
  return it == codes.end() ? 0 : it->second;
}

void Recorder::Add(double latency_us, const grpc::Status& status) {
  const std::string code = CodeName(status.error_code());
  absl::MutexLock lock(&mu_);
  stats_.latency_us.push_back(latency_us);
  ++stats_.codes[code];
  if (!status.ok()) stats_.first_message.emplace(code, status.error_message());
}

Recorder::Snapshot Recorder::Now() const {
  std::vector<double> samples;
  Snapshot s;
  {
    absl::MutexLock lock(&mu_);
    samples = stats_.latency_us;
    s.ok = stats_.ok();
  }
  s.calls = static_cast<int64_t>(samples.size());
  if (samples.empty()) return s;
  auto at = [&](double q) {
    auto nth = samples.begin() + static_cast<ptrdiff_t>(q * (samples.size() - 1) + 0.5);
    std::nth_element(samples.begin(), nth, samples.end());
    return *nth;
  };
  s.p50_us = at(0.5);
  s.p99_us = at(0.99);
  return s;
}

CallStats Recorder::Take() {
  CallStats out;
  {
    absl::MutexLock lock(&mu_);
    std::swap(out, stats_);
  }
  std::sort(out.latency_us.begin(), out.latency_us.end());
  return out;
}

}  // namespace probesidecar::bench
