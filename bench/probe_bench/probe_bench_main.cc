// probe-bench: a load generator for probe-sidecar (closed and open loop), beside a bare gRPC
// echo (bench/rpc). `probe-bench --help` says everything; the parts:
//   probe_bench_options   the command line
//   probe_bench_modes     what one call is (echo, echo_stream, score_ipc, score_inline, ...)
//   probe_bench_calls     unary and ping-pong stream calls, blocking and started
//   probe_bench_load      closed loop and open loop
//   probe_bench_stats     latencies and status codes; probe_bench_progress: the progress line
//   probe_bench_workload  probe sets and requests; probe_bench_gpu: CUDA IPC and ceilings
//   probe_bench_output    results JSON, CSV, summary lines
//   probe_bench_run       one run, from options to files
#include <cstdio>

#include "bench/probe_bench/probe_bench_options.h"
#include "bench/probe_bench/probe_bench_run.h"

int main(int argc, char** argv) {
  namespace bench = probesidecar::bench;
  absl::StatusOr<bench::Options> options = bench::ParseOptions(argc, argv);
  if (!options.ok()) {
    std::fprintf(stderr, "probe-bench: %s\n", std::string(options.status().message()).c_str());
    return 2;
  }
  if (options->help) {
    std::fputs(bench::HelpText().c_str(), stdout);
    return 0;
  }
  absl::StatusOr<std::string> git = bench::ResultReceipt(*options);
  if (!git.ok()) {
    std::fprintf(stderr, "probe-bench: %s\n", std::string(git.status().message()).c_str());
    return 2;
  }
  if (absl::Status s = bench::Run(*options, *git); !s.ok()) {
    std::fprintf(stderr, "probe-bench: %s\n", s.ToString().c_str());
    return 1;
  }
  return 0;
}
