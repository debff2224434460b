#include "bench/probe_bench/probe_bench_output.h"

#include <fstream>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace probesidecar::bench {
namespace {

nlohmann::json OrNull(bool present, double value) {
  return present ? nlohmann::json(value) : nlohmann::json(nullptr);
}

// The CSV columns: a name and where its value is in a record.
const std::vector<std::pair<std::string, nlohmann::json::json_pointer>>& CsvColumns() {
  using P = nlohmann::json::json_pointer;
  static const auto* columns = new std::vector<std::pair<std::string, P>>{
      {"bench", P("/bench")},
      {"impl", P("/impl")},
      {"server_label", P("/server_label")},
      {"dtype", P("/dtype")},
      {"transport", P("/shape/transport")},
      {"arrivals", P("/shape/arrivals")},
      {"R", P("/shape/R")},
      {"H", P("/shape/H")},
      {"P", P("/shape/P")},
      {"concurrency", P("/shape/concurrency")},
      {"rate", P("/shape/rate")},
      {"max_outstanding", P("/max_outstanding")},
      {"p50_us", P("/latency_us/p50")},
      {"p90_us", P("/latency_us/p90")},
      {"p99_us", P("/latency_us/p99")},
      {"p99_9_us", P("/latency_us/p99_9")},
      {"throughput_rps", P("/throughput_rps")},
      {"offered_rps", P("/offered_rps")},
      {"calls", P("/calls")},
      {"ok", P("/ok")},
      {"scheduled", P("/scheduled")},
      {"not_sent", P("/not_sent")},
      {"seconds", P("/seconds")},
      {"request_bytes", P("/request_bytes")},
      {"send_lag_p99_us", P("/send_lag_us/p99")},
  };
  return *columns;
}

std::string CsvField(const std::string& text) {
  if (text.find_first_of(",\"\n") == std::string::npos) return text;
  std::string quoted = "\"";
  for (char c : text) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  return quoted + "\"";
}

std::string CsvValue(const nlohmann::json& value) {
  if (value.is_null()) return "";
  if (value.is_string()) return CsvField(value.get<std::string>());
  return value.dump();
}

}  // namespace

nlohmann::json RecordJson(const RecordInfo& info, const Measurement& m) {
  const bool open = info.rate > 0;
  const std::vector<double>& lat = m.calls.latency_us;
  nlohmann::json shape = {{"R", info.rows},
                          {"H", info.hidden},
                          {"P", info.probes},
                          {"transport", info.transport},
                          {"arrivals", info.arrivals}};
  if (open) {
    shape["rate"] = info.rate;
  } else {
    shape["concurrency"] = info.concurrency;
  }
  nlohmann::json errors = nlohmann::json::object(), first_errors = nlohmann::json::object();
  for (const auto& [code, n] : m.calls.codes) {
    if (code != "OK") errors[code] = n;
  }
  for (const auto& [code, message] : m.calls.first_message) first_errors[code] = message;
  nlohmann::json lag = nullptr;
  if (open) {
    lag = {{"p50", Quantile(m.send_lag_us, 0.5)},
           {"p99", Quantile(m.send_lag_us, 0.99)},
           {"max", m.send_lag_us.empty() ? 0.0 : m.send_lag_us.back()}};
  }
  return {
      {"bench", "rpc_score"},
      {"impl", info.impl},
      {"server_label", info.server_label},
      {"dtype", "bf16"},
      {"shape", shape},
      {"graph_us_p50", nullptr},
      {"eager_us_p50", nullptr},
      {"latency_us",
       {{"p50", Quantile(lat, 0.5)},
        {"p90", Quantile(lat, 0.9)},
        {"p99", Quantile(lat, 0.99)},
        {"p99_9", Quantile(lat, 0.999)}}},
      {"throughput_rps", m.seconds > 0 ? m.calls.calls() / m.seconds : 0.0},
      {"offered_rps", OrNull(open, m.offered_rps)},
      {"calls", m.calls.calls()},
      {"ok", m.calls.ok()},
      {"errors", errors},
      {"first_errors", first_errors},
      {"scheduled", open ? nlohmann::json(m.scheduled) : nlohmann::json(nullptr)},
      {"not_sent", m.not_sent},
      {"max_outstanding", open ? nlohmann::json(info.max_outstanding) : nlohmann::json(nullptr)},
      {"send_lag_us", lag},
      {"seconds", m.seconds},
      {"request_bytes", info.request_bytes},
  };
}

std::string SummaryLine(const nlohmann::json& r) {
  const nlohmann::json& s = r["shape"];
  const std::string load = s.contains("rate")
                               ? absl::StrFormat("rate=%g/s %s", s["rate"].get<double>(),
                                                 s["arrivals"].get<std::string>())
                               : absl::StrCat("c=", s["concurrency"].get<int>());
  std::string line = absl::StrFormat(
      "%-16s %-3s R=%-5d P=%-3d %-20s p50 %8.1f us  p99 %8.1f us  p99.9 %8.1f us  %9.0f rps",
      r["impl"].get<std::string>(), s["transport"].get<std::string>(), s["R"].get<int>(),
      s["P"].get<int>(), load, r["latency_us"]["p50"].get<double>(),
      r["latency_us"]["p99"].get<double>(), r["latency_us"]["p99_9"].get<double>(),
      r["throughput_rps"].get<double>());
  if (!r["offered_rps"].is_null()) {
    absl::StrAppendFormat(&line, " of %.0f offered", r["offered_rps"].get<double>());
  }
  if (r["not_sent"].get<int64_t>() > 0) {
    absl::StrAppend(&line, "  NOT SENT ", r["not_sent"].get<int64_t>());
  }
  for (const auto& [code, n] : r["errors"].items()) {
    absl::StrAppend(&line, "  ", code, " ", n.get<int64_t>(), ": ",
                    r["first_errors"][code].get<std::string>());
  }
  if (!r["server_label"].get<std::string>().empty()) {
    absl::StrAppend(&line, "  [", r["server_label"].get<std::string>(), "]");
  }
  return line;
}

nlohmann::json ResultsJson(const RunInfo& run, nlohmann::json records) {
  nlohmann::json ceilings = {{"copy_gbps", nullptr}, {"bf16_tflops", nullptr}};
  if (run.ceilings.has_value()) {
    ceilings = {{"copy_gbps", run.ceilings->copy_gbps}, {"bf16_tflops", run.ceilings->bf16_tflops}};
  }
  return {{"device", run.device},
          {"git", run.git},
          {"date", absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", absl::Now(), absl::UTCTimeZone())},
          {"command", run.command},
          {"ceilings", ceilings},
          {"server", run.server},
          {"records", std::move(records)}};
}

std::string RecordsCsv(const std::string& git, const nlohmann::json& records) {
  std::vector<std::string> header = {"git"};
  for (const auto& [name, pointer] : CsvColumns()) header.push_back(name);
  header.push_back("errors");
  std::string csv = absl::StrJoin(header, ",") + "\n";
  for (const nlohmann::json& r : records) {
    std::vector<std::string> row = {CsvField(git)};
    for (const auto& [name, pointer] : CsvColumns()) {
      row.push_back(r.contains(pointer) ? CsvValue(r.at(pointer)) : "");
    }
    std::vector<std::string> errors;
    for (const auto& [code, n] : r["errors"].items()) {
      errors.push_back(absl::StrCat(code, "=", n.get<int64_t>()));
    }
    row.push_back(absl::StrJoin(errors, ";"));
    csv += absl::StrJoin(row, ",") + "\n";
  }
  return csv;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace probesidecar::bench
