#!/usr/bin/env bash
# A against B: two builds of mla-verify-bench on one GPU, PASSES passes of a sweep, A before B in
# odd passes and after it in even ones (so that neither always runs on a warmer GPU), then
# ab_report.py: per point the median over passes of B's time over A's, and A's own spread.
#
#   bench/mla_verify/ab.sh BIN_A BIN_B OUT_DIR
#
# Environment: GIT_A, GIT_B (the full commits the builds are of: they name the passes), PASSES
# (default 3), SWEEP (full|quick|targets, default full), POINTS (h:s:b:len,...), IMPLS (default
# split_kv_sm90a: the dispatched sm_90a path). Writes OUT_DIR/ab_{a,b}_<pass>.json and
# OUT_DIR/ab.md; exits non-zero when a pass fails.
set -uo pipefail
A=${1:?usage: ab.sh BIN_A BIN_B OUT_DIR}
B=${2:?usage: ab.sh BIN_A BIN_B OUT_DIR}
OUT=${3:?usage: ab.sh BIN_A BIN_B OUT_DIR}
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PASSES=${PASSES:-3}
ARGS=(--sweep "${SWEEP:-full}" --impls "${IMPLS:-split_kv_sm90a}")
[[ -n "${POINTS:-}" ]] && ARGS+=(--points "$POINTS")
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
status=0
run() {  # side pass
  local bin=$A git=${GIT_A:?set GIT_A}
  [[ $1 == b ]] && bin=$B git=${GIT_B:?set GIT_B}
  local skip=()
  [[ $2 -gt 1 ]] && skip=(--skip-ceilings)
  timeout 300 "$bin" --out "$OUT/ab_$1_$2.json" "${ARGS[@]}" "${skip[@]}" --git "$git" \
    >>"$OUT/ab_run.log" 2>&1 || { echo "pass $2 of $1 failed" >&2; status=1; }
}
for ((p = 1; p <= PASSES; ++p)); do
  if ((p % 2)); then run a "$p"; run b "$p"; else run b "$p"; run a "$p"; fi
done
python3 "$HERE/ab_report.py" "$OUT" --out "$OUT/ab.md" || status=1
exit $status
