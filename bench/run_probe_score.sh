#!/usr/bin/env bash
# Probe-score GPU run: kernel tests, the CUDA benchmark, the peers (torch, Triton) on the same
# shapes, and the report. Writes at most 4 files under OUT_DIR:
#   probe_score_run.log, probe_score_cuda.json, probe_score_peers.json, probe_score.md
#
#   bench/run_probe_score.sh BUILD_DIR [OUT_DIR]        (run from the repository root)
#
# BUILD_DIR holds bin/probe_score_gpu_test and bin/probe-score-bench (kernels-only build is
# enough). Environment: SWEEP=full|quick|targets (default full), VARIANTS=1 to also time tile /
# split / chunk variants, SKIP_TESTS=1, SKIP_PEERS=1, and per-step time limits in seconds
# TEST_TIMEOUT (300), BENCH_TIMEOUT (300), PEERS_TIMEOUT (300).
set -uo pipefail
BUILD=${1:?usage: bench/run_probe_score.sh BUILD_DIR [OUT_DIR]}
OUT_DIR=${2:-bench/results}
SWEEP=${SWEEP:-full}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/probe_score_run.log"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1
GIT=${GIT:-$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)}
status=0
{
  echo "== probe_score run: git $GIT, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>&1 || true
} >"$LOG"

if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  echo "== tests" | tee -a "$LOG"
  "$BUILD/bin/probe_score_cpu_test" --gtest_brief=1 >>"$LOG" 2>&1 || status=1
  timeout "${TEST_TIMEOUT:-300}" "$BUILD/bin/probe_score_gpu_test" --gtest_brief=1 >>"$LOG" 2>&1
  rc=$?
  [[ $rc -ne 0 && $rc -ne 77 ]] && status=1
  grep -E "^\[worst\]|PASSED|FAILED|SKIPPED|tests ran" "$LOG" | tail -40
fi

BENCH_ARGS=(--out "$OUT_DIR/probe_score_cuda.json" --sweep "$SWEEP" --git "$GIT")
[[ "${VARIANTS:-0}" == 1 ]] && BENCH_ARGS+=(--variants)
echo "== bench: $BUILD/bin/probe-score-bench ${BENCH_ARGS[*]}" | tee -a "$LOG"
timeout "${BENCH_TIMEOUT:-300}" "$BUILD/bin/probe-score-bench" "${BENCH_ARGS[@]}" >>"$LOG" 2>&1 ||
  status=1

if [[ "${SKIP_PEERS:-0}" != 1 ]]; then
  echo "== peers" | tee -a "$LOG"
  timeout "${PEERS_TIMEOUT:-300}" python3 bench/peers/probe_score_peers.py --out "$OUT_DIR/probe_score_peers.json" \
    --shapes-from "$OUT_DIR/probe_score_cuda.json" --git "$GIT" >>"$LOG" 2>&1 || status=1
fi

echo "== report" | tee -a "$LOG"
FILES=("$OUT_DIR/probe_score_cuda.json")
[[ -f "$OUT_DIR/probe_score_peers.json" ]] && FILES+=("$OUT_DIR/probe_score_peers.json")
TABLE=$(mktemp)
"$BUILD/bin/probe-score-bench" --dispatch-table "$TABLE" >>"$LOG" 2>&1 || status=1
python3 bench/report.py "${FILES[@]}" --out "$OUT_DIR/probe_score.md" --dispatch-table "$TABLE" \
  --command "SWEEP=$SWEEP VARIANTS=${VARIANTS:-0} bench/run_probe_score.sh $BUILD $OUT_DIR" \
  >>"$LOG" 2>&1 || status=1
rm -f "$TABLE"
# Compact summary last (what a caller sees at the end of its output).
sed -n '/^## Targets/,/^## Crossovers/p' "$OUT_DIR/probe_score.md" 2>/dev/null | head -30
exit $status
