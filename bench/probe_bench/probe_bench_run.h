// One probe-bench run: set up (probe sets, IPC activations, ceilings), measure every
// (rows, probes, load point, mode) combination, write the results.
#pragma once

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "bench/probe_bench/probe_bench_options.h"

namespace probesidecar::bench {

// The commit to record (--git, else $PROBE_SIDECAR_GIT): "" when nothing is written; an error
// when results would be written without a full commit, or from a dirty tree without
// --allow-dirty.
absl::StatusOr<std::string> ResultReceipt(const Options& options);

absl::Status Run(const Options& options, const std::string& git);

}  // namespace probesidecar::bench
