#!/usr/bin/env bash
# Builds of mla-verify-bench against the first one, on one GPU: PASSES passes of a sweep, the
# builds' order rotated from pass to pass (so that none always runs on a warmer GPU), then
# ab_report.py: per point and build, the median over passes of its time over A's in the same pass,
# and A's own spread.
#
#   bench/mla_verify/ab.sh OUT_DIR BIN_A BIN_B [BIN_C ...]      (at most 6 builds: a..f)
#
# Environment: GITS (the full commits the builds are of, in order, space-separated: they name the
# passes), PASSES (default 3), SWEEP (full|quick|targets, default full), POINTS (h:s:b:len,...),
# IMPLS (default split_kv_sm90a: the dispatched sm_90a path). Writes OUT_DIR/ab_<build>_<pass>.json
# and OUT_DIR/ab.md; exits non-zero when a pass fails.
set -uo pipefail
OUT=${1:?usage: ab.sh OUT_DIR BIN_A BIN_B [BIN_C ...]}
shift
BINS=("$@")
read -r -a GIT_LIST <<<"${GITS:?set GITS to the builds\' commits}"
(( ${#BINS[@]} >= 2 && ${#BINS[@]} <= 6 )) || { echo "ab.sh: 2 to 6 builds" >&2; exit 2; }
(( ${#GIT_LIST[@]} == ${#BINS[@]} )) || { echo "ab.sh: one commit per build in GITS" >&2; exit 2; }
HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PASSES=${PASSES:-3}
LABELS=(a b c d e f)
ARGS=(--sweep "${SWEEP:-full}" --impls "${IMPLS:-split_kv_sm90a}")
[[ -n "${POINTS:-}" ]] && ARGS+=(--points "$POINTS")
export LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
mkdir -p "$OUT"
status=0
n=${#BINS[@]}
for ((p = 1; p <= PASSES; ++p)); do
  for ((k = 0; k < n; ++k)); do
    i=$(( (p - 1 + k) % n ))
    skip=()
    [[ $p -gt 1 ]] && skip=(--skip-ceilings)
    timeout 300 "${BINS[$i]}" --out "$OUT/ab_${LABELS[$i]}_$p.json" "${ARGS[@]}" "${skip[@]}" \
      --git "${GIT_LIST[$i]}" >>"$OUT/ab_run.log" 2>&1 ||
      { echo "pass $p of ${LABELS[$i]} failed" >&2; status=1; }
  done
done
python3 "$HERE/ab_report.py" "$OUT" --out "$OUT/ab.md" || status=1
exit $status
