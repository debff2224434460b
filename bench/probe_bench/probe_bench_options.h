// probe-bench's command line: what to measure, how hard to push, where to write.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace probesidecar::bench {

enum class Arrivals { kPoisson, kConstant };

struct Options {
  // Where.
  std::string target;       // probe-sidecar
  std::string echo_target;  // probe-echo-server (bench/rpc), for the echo modes
  std::string transport;    // "uds" or "tcp"; derived from the targets when not given
  // Sent with the probe sets' LoadProbeSet (a server run with --admin-token-file); "": none.
  std::string admin_token_file;
  // What.
  std::vector<std::string> modes = {"echo", "score_ipc", "score_inline"};
  std::vector<int> rows = {1, 64, 1024, 8192};
  std::vector<int> probes = {1, 16};
  int hidden = 4096;
  int tokens = 16384;         // rows of the registered activations (IPC modes)
  double bad_fraction = 0.0;  // share of score requests naming a probe set that is not loaded
  // How hard: closed loop (a client thread per concurrent call) and/or open loop (a schedule).
  std::vector<int> concurrency = {1, 16};
  bool closed_loop = true;    // false when only --rate was given
  std::vector<double> rates;  // requests/s; empty: no open-loop run
  Arrivals arrivals = Arrivals::kPoisson;
  int max_outstanding = 256;
  int connections = 4;  // open loop: channels the lanes share
  double seconds = 1.5;
  int warmup = 100;
  double timeout_seconds = 30.0;
  uint64_t seed = 1;
  bool quiet = false;
  // Output and receipt.
  std::string out;  // results JSON
  std::string csv;
  std::string server_label;
  std::string git;
  bool allow_dirty = false;
  std::string command;  // the command line, as run
  bool help = false;
};

// The --help text, every flag with its default.
std::string HelpText();

// Parses argv; an error names the offending flag.
absl::StatusOr<Options> ParseOptions(int argc, char** argv);

const char* ArrivalsName(Arrivals arrivals);

}  // namespace probesidecar::bench
