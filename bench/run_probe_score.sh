#!/usr/bin/env bash
# Probe-score GPU run: kernel tests, the CUDA benchmark, the peers (torch, Triton) on the same
# shapes, and the report. Writes at most 4 files under OUT_DIR:
#   probe_score_run.log, probe_score_cuda.json, probe_score_peers.json, probe_score.md
#
#   bench/run_probe_score.sh BUILD_DIR [OUT_DIR]        (run from the repository root)
#
# BUILD_DIR holds bin/probe_score_gpu_test and bin/probe-score-bench (kernels-only build is
# enough). Environment:
#   PROBE_SIDECAR_GIT      the full commit of the code measured (required where there is no
#                         checkout, e.g. on the GPU machine; tests/gpu/run.sh exports it); in a
#                         checkout it defaults to `python3 bench/receipt.py` (HEAD, +dirty if the
#                         tree is dirty). Every result file records it.
#   ALLOW_DIRTY=1         accept a "+dirty" identity (results are marked); refused otherwise.
#   PROBE_SIDECAR_REQUIRE_GPU=1  a test that skips for want of a device (exit 77) is a failure:
#                         set on the GPU machine, so that a run there cannot pass by skipping.
#   SWEEP=full|quick|targets (default full), VARIANTS=1 to also time tile / split / chunk
#   variants, SKIP_TESTS=1, SKIP_PEERS=1, and per-step time limits in seconds TEST_TIMEOUT (300),
#   BENCH_TIMEOUT (300), PEERS_TIMEOUT (300).
set -uo pipefail
BUILD=${1:?usage: bench/run_probe_score.sh BUILD_DIR [OUT_DIR]}
OUT_DIR=${2:-bench/results}
SWEEP=${SWEEP:-full}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/probe_score_run.log"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1

# The receipt, before anything runs: every tool below reads PROBE_SIDECAR_GIT and refuses a
# missing, short or (without --allow-dirty) dirty identity.
if [[ -z "${PROBE_SIDECAR_GIT:-}" ]]; then
  PROBE_SIDECAR_GIT=$(python3 bench/receipt.py 2>/dev/null) || {
    echo "run_probe_score.sh: no PROBE_SIDECAR_GIT, and not a git checkout: cannot name" \
      "the commit measured" >&2
    exit 2
  }
fi
export PROBE_SIDECAR_GIT
RECEIPT_ARGS=()
[[ "${ALLOW_DIRTY:-0}" == 1 ]] && RECEIPT_ARGS+=(--allow-dirty)
if [[ "$PROBE_SIDECAR_GIT" == *+dirty && "${ALLOW_DIRTY:-0}" != 1 ]]; then
  echo "run_probe_score.sh: $PROBE_SIDECAR_GIT: the tree had uncommitted changes; commit first," \
    "or set ALLOW_DIRTY=1 (results are then marked +dirty)" >&2
  exit 2
fi

status=0
{
  echo "== probe_score run: git $PROBE_SIDECAR_GIT, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>&1 || true
} >"$LOG"

# An exit status of a test or tool: 0 passes; 77 (no CUDA device) passes as skipped, except where
# a GPU is required; anything else fails.
check_rc() {
  local what=$1 rc=$2
  if [[ $rc -eq 77 && "${PROBE_SIDECAR_REQUIRE_GPU:-0}" == 1 ]]; then
    echo "$what: skipped (no CUDA device), but PROBE_SIDECAR_REQUIRE_GPU=1: failure" | tee -a "$LOG"
    status=1
  elif [[ $rc -ne 0 && $rc -ne 77 ]]; then
    echo "$what: exit $rc" | tee -a "$LOG"
    status=1
  fi
}

if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  echo "== tests" | tee -a "$LOG"
  "$BUILD/bin/probe_score_cpu_test" --gtest_brief=1 >>"$LOG" 2>&1
  check_rc probe_score_cpu_test $?
  timeout "${TEST_TIMEOUT:-300}" "$BUILD/bin/probe_score_gpu_test" --gtest_brief=1 >>"$LOG" 2>&1
  check_rc probe_score_gpu_test $?
  grep -E "^\[worst\]|PASSED|FAILED|SKIPPED|tests ran" "$LOG" | tail -40
fi

BENCH_ARGS=(--out "$OUT_DIR/probe_score_cuda.json" --sweep "$SWEEP" --git "$PROBE_SIDECAR_GIT"
  "${RECEIPT_ARGS[@]}")
[[ "${VARIANTS:-0}" == 1 ]] && BENCH_ARGS+=(--variants)
echo "== bench: $BUILD/bin/probe-score-bench ${BENCH_ARGS[*]}" | tee -a "$LOG"
timeout "${BENCH_TIMEOUT:-300}" "$BUILD/bin/probe-score-bench" "${BENCH_ARGS[@]}" >>"$LOG" 2>&1
check_rc probe-score-bench $?

if [[ "${SKIP_PEERS:-0}" != 1 ]]; then
  echo "== peers" | tee -a "$LOG"
  timeout "${PEERS_TIMEOUT:-300}" python3 bench/peers/probe_score_peers.py \
    --out "$OUT_DIR/probe_score_peers.json" --shapes-from "$OUT_DIR/probe_score_cuda.json" \
    --git "$PROBE_SIDECAR_GIT" "${RECEIPT_ARGS[@]}" >>"$LOG" 2>&1 || status=1
fi

echo "== report" | tee -a "$LOG"
FILES=("$OUT_DIR/probe_score_cuda.json")
[[ -f "$OUT_DIR/probe_score_peers.json" ]] && FILES+=("$OUT_DIR/probe_score_peers.json")
TABLE=$(mktemp)
"$BUILD/bin/probe-score-bench" --dispatch-table "$TABLE" >>"$LOG" 2>&1 || status=1
python3 bench/report.py "${FILES[@]}" --out "$OUT_DIR/probe_score.md" --dispatch-table "$TABLE" \
  --git "$PROBE_SIDECAR_GIT" "${RECEIPT_ARGS[@]}" \
  --command "SWEEP=$SWEEP VARIANTS=${VARIANTS:-0} bench/run_probe_score.sh $BUILD $OUT_DIR" \
  >>"$LOG" 2>&1 || status=1
rm -f "$TABLE"
# Compact summary last (what a caller sees at the end of its output).
sed -n '/^## Targets/,/^## Crossovers/p' "$OUT_DIR/probe_score.md" 2>/dev/null | head -30
exit $status
