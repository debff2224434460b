#!/usr/bin/env bash
# Runs metrics_bench on this machine and writes bench/results/metrics_observe.{json,md}.
#
#   bench/metrics/run.sh [BUILD_DIR] [RESULTS_DIR] [OTHER_RAW LABEL DESCRIPTION]
#
# BUILD_DIR defaults to build/, RESULTS_DIR to bench/results/. OTHER_RAW: the Google Benchmark
# JSON of the same command run on another machine (e.g. the 16-core GPU host, with the Debian
# shared libraries carried beside the binary), reported next to this machine's run.
# MACHINE_LABEL names this machine in the report (default: hostname and CPU count).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
build="${1:-$root/build}"
results="${2:-$root/bench/results}"
bin="$build/bin/metrics_bench"
[[ -x "$bin" ]] || { echo "no $bin: build the metrics_bench target first" >&2; exit 1; }
mkdir -p "$results"
raw="$(mktemp)"
trap 'rm -f "$raw"' EXIT
args=(--benchmark_min_time=0.5 --benchmark_repetitions=3 --benchmark_report_aggregates_only=true
      --benchmark_format=json --benchmark_out_format=json)
"$bin" "${args[@]}" "--benchmark_out=$raw" >/dev/null
cpu="$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
runs=(--run "$raw" "${MACHINE_LABEL:-$(hostname), $(nproc) CPUs}" "$cpu")
if (($# >= 5)); then
  runs+=(--run "$3" "$4" "$5")
fi
python3 "$root/bench/metrics/report_metrics.py" "${runs[@]}" ${ALLOW_DIRTY:+--allow-dirty} \
  --command "metrics_bench ${args[*]} --benchmark_out=RAW.json" \
  --json "$results/metrics_observe.json" --md "$results/metrics_observe.md"
echo "wrote $results/metrics_observe.json and .md"
