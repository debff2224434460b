// probe-bench's modes: what one call is (an RPC, its requests, its server). Adding a mode is one
// small function in probe_bench_modes.cc and one line in its table.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "bench/probe_bench/probe_bench_calls.h"
#include "bench/probe_bench/probe_bench_workload.h"

namespace probesidecar::bench {

struct ModeInfo {
  const char* name;  // the records' impl
  const char* help;  // one line for --help
  bool echo;         // talks to --echo-target (else --target)
  bool ipc;          // needs activations registered over CUDA IPC (so a CUDA device)
  CallMaker (*make)(const Workload& workload, double timeout_seconds);
  size_t (*request_bytes)(const Workload& workload);  // bytes of one serialized request
};

// nullptr when unknown.
const ModeInfo* FindMode(const std::string& name);
std::vector<std::string> ModeNames();

}  // namespace probesidecar::bench
