#!/usr/bin/env bash
# MLA verify GPU run: the kernel tests, the CUDA benchmark (ours + ceilings), the peers (torch
# reference, FlashInfer fa3) and the report, within one device call. Writes under OUT_DIR:
#   mla_verify_run.log, mla_verify_ours.json, mla_verify_peers.json,
#   mla_verify.json, mla_verify.md, mla_verify.png
# and, where asked for, mla_verify_previous.json, mla_verify_trace.md / .json / _timeline.txt /
# _timed.json, sanitizer.log.
#
#   PROBE_SIDECAR_GIT=<40-char commit> bench/mla_verify/run.sh BIN_DIR OUT_DIR [WHEEL_DIR]
#
# BIN_DIR holds mla_verify_cpu_test, mla_verify_gpu_test and mla-verify-bench (kernels-only
# build); WHEEL_DIR the FlashInfer (slim: bench/mla_verify/slim_flashinfer.py) and apache-tvm-ffi
# wheels (the GPU machine's Python is 3.12: take cp312). Environment: SWEEP
# (full|quick|targets, default full), POINTS (h:s:b:len,...: only these points), IMPLS (the
# benchmark's --impls), DEADLINE_S (default 285: the peers get what is left of it), SKIP_TESTS=1,
# SKIP_PEERS=1, PEER_IMPLS (peers.py --impls; flashmla needs FLASHMLA_PEER_LIB, built by
# flashmla/build.sh), PREV_BIN (a mla-verify-bench built from an earlier commit, PREV_GIT its
# commit: its dispatched path on the same points, "previous" in the report),
# TRACE_BIN (a mla-verify-bench built with -DPROBESIDECAR_MLA_TRACE=ON) with TRACE_POINTS and
# TRACE_IMPLS (its in-kernel trace at those points, summarised by trace_report.py), SANITIZE=1
# (compute-sanitizer over a few GPU tests after the benchmarks: SANITIZE_TOOLS, default memcheck
# and racecheck; SANITIZE_FILTER, a gtest filter),
# REFERENCE (a committed record the report's "no point slower than the committed figures" target
# compares with where it was measured on the same GPU model; default bench/results/mla_verify.json;
# empty: none), RUN_COMMAND (the command line the report names, default the script's own).
set -uo pipefail
BIN=${1:?usage: run.sh BIN_DIR OUT_DIR [WHEEL_DIR]}
OUT_DIR=${2:?usage: run.sh BIN_DIR OUT_DIR [WHEEL_DIR]}
WHEELS=${3:-}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
SWEEP=${SWEEP:-full}
POINTS=${POINTS:-}
IMPLS=${IMPLS:-split_kv,split_kv_sm90a,baseline}
DEADLINE_S=${DEADLINE_S:-285}
GIT=${PROBE_SIDECAR_GIT:?set PROBE_SIDECAR_GIT to the full commit}
START=$(date +%s)
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/mla_verify_run.log"
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export PYTHONUNBUFFERED=1 FLASHINFER_CUDA_ARCH_LIST=9.0a
status=0
left() { echo $((DEADLINE_S - ($(date +%s) - START))); }
POINT_ARGS=()
[[ -n "$POINTS" ]] && POINT_ARGS=(--points "$POINTS")
{
  echo "== mla_verify run: git $GIT, $(date -u +%Y-%m-%dT%H:%M:%SZ), sweep $SWEEP ${POINTS:+points $POINTS}"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu,power.draw \
    --format=csv 2>&1 || true
} >"$LOG"

# FlashInfer: install the wheels and JIT-build its fa3 module while the tests run.
WARM_PID=
if [[ -n "$WHEELS" && "${SKIP_PEERS:-0}" != 1 ]]; then
  (python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
     --target /tmp/site "$WHEELS"/*.whl &&
   PYTHONPATH=/tmp/site timeout 150 python3 "$HERE/peers.py" --out /dev/null --warm-only) \
    >"$OUT_DIR/.warm.log" 2>&1 &
  WARM_PID=$!
  export PYTHONPATH=/tmp/site
fi

if [[ "${SKIP_TESTS:-0}" != 1 ]]; then
  echo "== tests" | tee -a "$LOG"
  "$BIN/mla_verify_cpu_test" --gtest_brief=1 >>"$LOG" 2>&1 || status=1
  timeout 150 "$BIN/mla_verify_gpu_test" --gtest_brief=1 >>"$LOG" 2>&1
  rc=$?
  [[ $rc -ne 0 && $rc -ne 77 ]] && status=1
  echo "gpu test exit code $rc" >>"$LOG"
  grep -E "^\[worst\]|PASSED|FAILED|SKIPPED|tests ran|Failure|error|exit code" "$LOG" | tail -60
fi

CUOBJDUMP=$(command -v cuobjdump || echo /usr/local/cuda/bin/cuobjdump)
if [[ -x "$CUOBJDUMP" ]]; then
  "$CUOBJDUMP" -sass "$BIN/mla-verify-bench" >"$OUT_DIR/.sass" 2>/dev/null
  echo "== SASS of mla-verify-bench: HGMMA $(grep -c HGMMA "$OUT_DIR/.sass"), HMMA $(grep -c HMMA \
    "$OUT_DIR/.sass"), LDL $(grep -c LDL "$OUT_DIR/.sass"), STL $(grep -c STL "$OUT_DIR/.sass")" | tee -a "$LOG"
  rm -f "$OUT_DIR/.sass"
fi

# The benchmarks time graph replays between CUDA events: a host busy with FlashInfer's JIT build
# delays the launches between the events, so they wait for it to finish.
if [[ -n "$WARM_PID" ]]; then
  wait "$WARM_PID"
  echo "== flashinfer warm-up (exit $?, $(left) s left)" >>"$LOG"
  cat "$OUT_DIR/.warm.log" >>"$LOG"
  rm -f "$OUT_DIR/.warm.log"
  WARM_PID=
fi

echo "== bench ($(left) s left)" | tee -a "$LOG"
timeout 200 "$BIN/mla-verify-bench" --out "$OUT_DIR/mla_verify_ours.json" --sweep "$SWEEP" \
  --impls "$IMPLS" "${POINT_ARGS[@]}" --git "$GIT" >>"$LOG" 2>&1 || status=1

PREV_ARGS=()
if [[ -n "${PREV_BIN:-}" ]]; then
  echo "== previous kernel ${PREV_GIT:-?} ($(left) s left)" | tee -a "$LOG"
  timeout 120 "$PREV_BIN" --out /tmp/mla_verify_previous.json --sweep "$SWEEP" \
    --impls split_kv_sm90a --skip-ceilings "${POINT_ARGS[@]}" --git "${PREV_GIT:?set PREV_GIT}" \
    >>"$LOG" 2>&1 || status=1
  # Its fractions of the (unmeasured) ceilings are inf, which JSON has no word for.
  sed 's/: inf/: null/g' /tmp/mla_verify_previous.json >"$OUT_DIR/mla_verify_previous.json"
  PREV_ARGS=(--previous "$OUT_DIR/mla_verify_previous.json")
fi

TRACE_ARGS=()
if [[ -n "${TRACE_BIN:-}" ]]; then
  echo "== in-kernel trace ($(left) s left)" | tee -a "$LOG"
  mkdir -p /tmp/mla_trace
  timeout 120 "$TRACE_BIN" --out /tmp/mla_trace/timed.json --sweep "$SWEEP" --skip-ceilings \
    --impls "${TRACE_IMPLS:-split_kv_sm90a}" --points "${TRACE_POINTS:?set TRACE_POINTS}" \
    --trace-dir /tmp/mla_trace --git "$GIT" --allow-dirty >>"$LOG" 2>&1 || status=1
  python3 "$HERE/trace_report.py" /tmp/mla_trace --out "$OUT_DIR/mla_verify_trace.md" \
    --json "$OUT_DIR/mla_verify_trace.json" --timeline "$OUT_DIR/mla_verify_trace_timeline.txt" \
    >>"$LOG" 2>&1 || status=1
  cp /tmp/mla_trace/timed.json "$OUT_DIR/mla_verify_trace_timed.json" 2>/dev/null
  TRACE_ARGS=(--trace "$OUT_DIR/mla_verify_trace.md")
fi

if [[ -n "$WARM_PID" ]]; then
  wait "$WARM_PID"
  echo "== flashinfer warm-up (exit $?)" >>"$LOG"
  cat "$OUT_DIR/.warm.log" >>"$LOG"
  rm -f "$OUT_DIR/.warm.log"
fi
if [[ "${SKIP_PEERS:-0}" != 1 ]]; then
  budget=$(( $(left) - 15 ))
  echo "== peers ($budget s)" | tee -a "$LOG"
  if (( budget > 20 )); then
    timeout "$budget" python3 "$HERE/peers.py" --out "$OUT_DIR/mla_verify_peers.json" \
      --sweep "$SWEEP" --impls "${PEER_IMPLS:-torch_ref,flashinfer_fa3}" --points "$POINTS" \
      --git "$GIT" >>"$LOG" 2>&1 || { echo "peers exit $?" >>"$LOG"; status=1; }
  fi
fi

if [[ "${SANITIZE:-0}" == 1 ]]; then
  SAN=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
  echo "== compute-sanitizer ($(left) s left)" | tee -a "$LOG"
  FILTER=${SANITIZE_FILTER:-MlaVerifyGpuTest.PagePairsAcrossRequests:MlaVerifyGpuTest.StridedViewsAndEmptyRows}
  for tool in ${SANITIZE_TOOLS:-memcheck racecheck}; do
    timeout 100 "$SAN" --tool "$tool" --error-exitcode 9 "$BIN/mla_verify_gpu_test" \
      --gtest_brief=1 --gtest_filter="$FILTER" >"$OUT_DIR/.san_$tool.log" 2>&1
    rc=$?
    echo "compute-sanitizer $tool: exit $rc" | tee -a "$LOG"
    grep -E "ERROR SUMMARY|Hazard|Invalid|PASSED|FAILED" "$OUT_DIR/.san_$tool.log" | head -8 | tee -a "$LOG"
    [[ $rc -ne 0 && $rc -ne 124 ]] && status=1
    cat "$OUT_DIR/.san_$tool.log" >>"$OUT_DIR/sanitizer.log"
    rm -f "$OUT_DIR/.san_$tool.log"
  done
fi

echo "== report" | tee -a "$LOG"
PEERS=()
[[ -f "$OUT_DIR/mla_verify_peers.json" ]] && PEERS=("$OUT_DIR/mla_verify_peers.json")
REFERENCE=${REFERENCE-$HERE/../results/mla_verify.json}
REF_ARGS=()
[[ -n "$REFERENCE" ]] && REF_ARGS=(--reference "$REFERENCE")
python3 "$HERE/report.py" "$OUT_DIR/mla_verify_ours.json" "${PEERS[@]}" --out-dir "$OUT_DIR" \
  "${PREV_ARGS[@]}" "${TRACE_ARGS[@]}" "${REF_ARGS[@]}" \
  --command "${RUN_COMMAND:-SWEEP=$SWEEP bench/mla_verify/run.sh $BIN $OUT_DIR $WHEELS}" >>"$LOG" 2>&1 || status=1
echo "== done in $(( $(date +%s) - START )) s, status $status" | tee -a "$LOG"
sed -n '/^## Targets/,/^## All points/p' "$OUT_DIR/mla_verify.md" 2>/dev/null | head -30
exit $status
