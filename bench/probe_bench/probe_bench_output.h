// probe-bench's output: a record per (mode, shape, load point) in the project's results format,
// the results file around them, the same records as CSV, and a summary line per record.
#pragma once

#include <cstddef>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "bench/probe_bench/probe_bench_gpu.h"
#include "bench/probe_bench/probe_bench_stats.h"
#include "nlohmann/json.hpp"

namespace probesidecar::bench {

struct RecordInfo {
  std::string impl;
  std::string server_label;
  std::string transport;  // uds | tcp
  int rows = 0, probes = 0, hidden = 0;
  // Closed loop: concurrency > 0. Open loop: rate > 0, arrivals and max_outstanding.
  int concurrency = 0;
  double rate = 0;
  std::string arrivals;  // "closed", "poisson" or "constant"
  int max_outstanding = 0;
  size_t request_bytes = 0;
};

nlohmann::json RecordJson(const RecordInfo& info, const Measurement& m);

// One line for stdout: mode, shape, load point, latency, throughput, errors.
std::string SummaryLine(const nlohmann::json& record);

struct RunInfo {
  std::string device;
  std::string git;
  std::string command;
  std::optional<Ceilings> ceilings;  // none without a GPU
  nlohmann::json server;             // what the probe-sidecar said of itself (ServerInfo)
};

nlohmann::json ResultsJson(const RunInfo& run, nlohmann::json records);

// A header, then a row per record; `git` is repeated on every row.
std::string RecordsCsv(const std::string& git, const nlohmann::json& records);

absl::Status WriteTextFile(const std::string& path, const std::string& text);

}  // namespace probesidecar::bench
