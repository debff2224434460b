#!/usr/bin/env bash
# Fuzzes every libFuzzer target of a PROBESIDECAR_FUZZ=ON build for a bounded time.
#
#   tests/fuzz/run.sh BUILD_DIR [SECONDS_PER_TARGET]     (default 30; FUZZ_JOBS targets at once,
#                                                         default the number of cores)
#
# Each target starts from its committed seeds (tests/fuzz/<name>/corpus) and regression inputs
# (tests/fuzz/<name>/regressions) plus what earlier runs in the same build directory found
# (BUILD_DIR/fuzz/<name>/corpus). A crash, leak, timeout or sanitizer report fails the run; the
# input is left in BUILD_DIR/fuzz/<name>/ (crash-*, leak-*, timeout-*) with the target's log.
# Reproduce one with: BUILD_DIR/bin/fuzz_<name> BUILD_DIR/fuzz/<name>/crash-...
set -euo pipefail

build="${1:?usage: $0 BUILD_DIR [SECONDS_PER_TARGET]}"
seconds="${2:-30}"
jobs="${FUZZ_JOBS:-$(nproc)}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
build="$(cd "$build" && pwd)"
targets=(safetensors probe_set ipc_handle score_request verify_request buffer_registry)

fuzz_one() {
  local name="$1" out="$build/fuzz/$1"
  mkdir -p "$out/corpus"
  rm -f "$out"/crash-* "$out"/leak-* "$out"/timeout-* "$out"/oom-* "$out/status"
  # -timeout: one input running over 10 s is a hang; -rss_limit_mb: over 2 GiB is a defect too.
  local status=0
  "$build/bin/fuzz_$name" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$out/" \
    "$out/corpus" "$here/$name/corpus" "$here/$name/regressions" >"$out/log" 2>&1 || status=$?
  echo "$status" >"$out/status"
}

failed=0
for name in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= jobs)); do wait -n || true; done
  fuzz_one "$name" &
done
wait
printf '%-16s %12s %8s %s\n' target executions corpus result
for name in "${targets[@]}"; do
  status="$(cat "$build/fuzz/$name/status" 2>/dev/null || echo 1)"
  log="$build/fuzz/$name/log"
  runs="$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)"
  corpus="$(find "$build/fuzz/$name/corpus" -type f | wc -l)"
  if ((status == 0)); then
    printf '%-16s %12s %8s ok\n' "$name" "${runs:-?}" "$corpus"
  else
    failed=1
    printf '%-16s %12s %8s FAILED (exit %d; log and input in %s)\n' "$name" "${runs:-?}" \
      "$corpus" "$status" "$build/fuzz/$name"
    grep -E 'ERROR|property failed|runtime error|SUMMARY' "$log" | head -5 | sed 's/^/    /'
  fi
done
exit "$failed"
