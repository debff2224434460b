#include "bench/probe_bench/probe_bench_run.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "bench/probe_bench/probe_bench_gpu.h"
#include "bench/probe_bench/probe_bench_load.h"
#include "bench/probe_bench/probe_bench_modes.h"
#include "bench/probe_bench/probe_bench_output.h"
#include "bench/probe_bench/probe_bench_workload.h"
#include "bench/result_receipt.h"
#include "client/cpp/client.h"

namespace probesidecar::bench {
namespace {

// The least deadline of the set-up calls (ServerInfo, LoadProbeSet), seconds.
constexpr double kSetupTimeoutSeconds = 30;

std::string TransportOf(const Options& o, const std::string& target) {
  if (!o.transport.empty()) return o.transport;
  return target.rfind("unix:", 0) == 0 ? "uds" : "tcp";
}

// One point of a load sweep: closed loop (concurrency) or open loop (rate).
struct LoadPoint {
  int concurrency = 0;
  double rate = 0;
};

std::vector<LoadPoint> LoadPoints(const Options& o) {
  std::vector<LoadPoint> points;
  if (o.closed_loop) {
    for (int c : o.concurrency) points.push_back({c, 0});
  }
  for (double r : o.rates) points.push_back({0, r});
  return points;
}

// What the server says of itself, for the results.
absl::StatusOr<nlohmann::json> DescribeServer(client::Client& client, const std::string& target) {
  absl::StatusOr<v1::ServerInfoResponse> info = client.ServerInfo();
  if (!info.ok()) {
    return absl::Status(info.status().code(), absl::StrCat("cannot reach probe-sidecar at ", target,
                                                           ": ", info.status().message()));
  }
  return nlohmann::json{{"version", info->version()},
                        {"git_commit", info->git_commit()},
                        {"backend", info->backend()},
                        {"device_name", info->device_name()}};
}

// The modes to run; echo modes are skipped (with a note) without --echo-target.
std::vector<const ModeInfo*> SelectModes(const Options& o) {
  std::vector<const ModeInfo*> modes;
  for (const std::string& name : o.modes) {
    const ModeInfo* mode = FindMode(name);
    if (mode->echo && o.echo_target.empty()) {
      std::fprintf(stderr, "probe-bench: %s skipped: no --echo-target\n", mode->name);
      continue;
    }
    modes.push_back(mode);
  }
  return modes;
}

// One record: `mode` under one load point.
absl::StatusOr<nlohmann::json> Measure(const Options& o, const ModeInfo& mode,
                                       const Workload& workload, const WorkloadSpec& spec,
                                       const LoadPoint& point) {
  const std::string& target = mode.echo ? o.echo_target : o.target;
  RecordInfo info;
  info.impl = mode.name;
  info.server_label = o.server_label;
  info.transport = TransportOf(o, target);
  info.rows = spec.rows;
  info.probes = spec.probes;
  info.hidden = spec.hidden;
  info.concurrency = point.concurrency;
  info.rate = point.rate;
  info.arrivals = point.rate > 0 ? ArrivalsName(o.arrivals) : "closed";
  info.max_outstanding = o.max_outstanding;
  info.request_bytes = mode.request_bytes(workload);

  LoadSettings settings;
  settings.seconds = o.seconds;
  settings.warmup = o.warmup;
  settings.timeout_seconds = o.timeout_seconds;
  settings.progress = !o.quiet;
  settings.arrivals = o.arrivals;
  settings.max_outstanding = o.max_outstanding;
  settings.connections = o.connections;
  settings.seed = o.seed;
  settings.title = absl::StrFormat("%s R=%d P=%d %s", mode.name, spec.rows, spec.probes,
                                   point.rate > 0 ? absl::StrFormat("rate=%g/s", point.rate)
                                                  : absl::StrCat("c=", point.concurrency));
  const CallMaker calls = mode.make(workload, o.timeout_seconds);
  absl::StatusOr<Measurement> m = point.rate > 0
                                      ? RunOpenLoop(calls, target, point.rate, settings)
                                      : RunClosedLoop(calls, target, point.concurrency, settings);
  if (!m.ok()) return m.status();
  return RecordJson(info, *m);
}

}  // namespace

absl::StatusOr<std::string> ResultReceipt(const Options& o) {
  if (o.out.empty() && o.csv.empty()) return std::string();
  const std::string git = ResultIdentity(o.git);
  if (const std::string why = CheckResultIdentity(git, o.allow_dirty); !why.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("refusing to write results: ", why));
  }
  return git;
}

absl::Status Run(const Options& o, const std::string& git) {
  const std::vector<const ModeInfo*> modes = SelectModes(o);
  const bool ipc = std::any_of(modes.begin(), modes.end(), [](auto* m) { return m->ipc; });
  const bool score = std::any_of(modes.begin(), modes.end(), [](auto* m) { return !m->echo; });

  // CUDA only where a GPU is present (ceilings) or needed (IPC modes).
  const absl::StatusOr<std::string> gpu = CudaDeviceName();
  if (ipc && !gpu.ok()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the *_ipc modes need a CUDA device on this machine (", gpu.status().message(),
                     "); the other modes do not"));
  }
  RunInfo run{gpu.ok() ? *gpu : "none", git, o.command, std::nullopt, nullptr};
  if (gpu.ok()) {
    if (absl::StatusOr<Ceilings> c = MeasureCeilings(); c.ok()) {
      run.ceilings = *c;
    } else {
      std::fprintf(stderr, "probe-bench: ceilings not measured: %s\n",
                   c.status().ToString().c_str());
    }
  }

  std::unique_ptr<client::Client> client;  // only for score modes: echo runs need no probe-sidecar
  std::unique_ptr<IpcActivations> activations;
  const int max_rows = *std::max_element(o.rows.begin(), o.rows.end());
  const std::string host =
      RandomBf16(static_cast<size_t>(std::max(ipc ? o.tokens : 0, max_rows)) * o.hidden,
                 static_cast<uint32_t>(o.seed));
  if (score) {
    // Set-up calls (ServerInfo, loading probe sets) are not measured: a --timeout meant for the
    // measured calls (a short one, to study deadlines) must not fail them.
    client::ClientOptions options;
    options.timeout_seconds = std::max(o.timeout_seconds, kSetupTimeoutSeconds);
    options.max_message_bytes = 1 << 30;
    if (!o.admin_token_file.empty()) {
      std::ifstream in(o.admin_token_file);
      std::string line;
      if (!in || !std::getline(in, line)) {
        return absl::NotFoundError(
            absl::StrCat("--admin-token-file=", o.admin_token_file, ": cannot read"));
      }
      options.admin_token = std::string(absl::StripAsciiWhitespace(line));
    }
    client = std::make_unique<client::Client>(o.target, options);
    absl::StatusOr<nlohmann::json> server = DescribeServer(*client, o.target);
    if (!server.ok()) return server.status();
    run.server = *server;
    if (!(*server)["device_name"].get<std::string>().empty()) {
      run.device = (*server)["device_name"];
    }
    if (absl::Status s = LoadProbeSets(*client, o.probes, o.hidden, static_cast<uint32_t>(o.seed));
        !s.ok()) {
      return s;
    }
  }
  if (ipc) {
    absl::StatusOr<std::unique_ptr<IpcActivations>> a =
        IpcActivations::Create(*client, host, o.tokens, o.hidden);
    if (!a.ok()) return a.status();
    activations = *std::move(a);
  }

  nlohmann::json records = nlohmann::json::array();
  for (int rows : o.rows) {
    for (int probes : o.probes) {
      WorkloadSpec spec;
      spec.rows = rows;
      spec.probes = probes;
      spec.hidden = o.hidden;
      spec.tokens = o.tokens;
      spec.buffer_id = activations ? activations->buffer_id() : 0;
      spec.session_id = activations ? activations->session_id() : 0;
      spec.host_activations = &host;
      spec.bad_fraction = o.bad_fraction;
      const Workload workload = MakeWorkload(spec);
      for (const LoadPoint& point : LoadPoints(o)) {
        for (const ModeInfo* mode : modes) {
          absl::StatusOr<nlohmann::json> record = Measure(o, *mode, workload, spec, point);
          if (!record.ok()) return record.status();
          std::printf("%s\n", SummaryLine(*record).c_str());
          std::fflush(stdout);
          records.push_back(*std::move(record));
        }
      }
    }
  }
  activations.reset();

  if (!o.csv.empty()) {
    if (absl::Status s = WriteTextFile(o.csv, RecordsCsv(git, records)); !s.ok()) return s;
  }
  if (!o.out.empty()) {
    const std::string text = ResultsJson(run, std::move(records)).dump(1) + "\n";
    if (absl::Status s = WriteTextFile(o.out, text); !s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace probesidecar::bench
