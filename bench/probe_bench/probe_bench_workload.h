// What probe-bench sends: random probe sets loaded into the server, and the requests of one
// (rows R, probes P) shape, built once before they are measured.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "bench/rpc/echo.pb.h"
#include "client/cpp/client.h"

namespace probesidecar::bench {

// Normal(0, 1) values as bf16 bytes.
std::string RandomBf16(size_t elements, uint32_t seed);

// The probe set of P random bf16 probes of width `hidden` that probe-bench loads.
std::string ProbeSetName(int probes);
// A probe set that is never loaded: requests naming it are answered NOT_FOUND.
inline constexpr char kMissingProbeSet[] = "bench_not_loaded";

// Loads (or replaces) ProbeSetName(P) for every P.
absl::Status LoadProbeSets(client::Client& client, const std::vector<int>& probes, int hidden,
                           uint32_t seed);

struct WorkloadSpec {
  int rows = 1;
  int probes = 1;
  int hidden = 4096;
  int tokens = 16384;       // rows of the registered activations
  uint64_t buffer_id = 0;   // the registered activations; 0: none (the IPC requests are unusable)
  uint64_t session_id = 0;  // the session that registered them (requests must name it)
  // bf16 [>= rows, hidden]: the inline requests' activations.
  const std::string* host_activations = nullptr;
  double bad_fraction = 0;
  uint32_t seed = 7;
};

// The requests of one shape. Each list is rotated through; the *_bad lists name
// kMissingProbeSet and are used for a `bad_fraction` of the calls.
struct Workload {
  std::vector<v1::ScoreRequest> inline_requests, inline_bad;
  std::vector<v1::ScoreRequest> ipc_requests, ipc_bad;  // eight row sets each
  probesidecar::bench::EchoRequest echo;  // the IPC request's size, the response's size
  double bad_fraction = 0;
};

Workload MakeWorkload(const WorkloadSpec& spec);

// Whether call `i` is one of the `fraction` of calls that are bad (spread evenly).
bool IsBad(int64_t i, double fraction);

}  // namespace probesidecar::bench
