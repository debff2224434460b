#!/usr/bin/env bash
# The GPU-families run on one H200 (docs/gpu-support.md): the compute_80-PTX-only build through
# the JIT, the release build's sm_90a dispatch, and the sm_80/86/89/120 tiles forced on the H200
# (PROBE_SIDECAR_LIMIT_TO_FAMILY, --family), with their speed.
#
# Prepared here, from a committed tree, in a folder the device tool carries (DIR):
#   two kernels-only builds (-DPROBESIDECAR_KERNELS_ONLY=ON), the release list and
#   -DCMAKE_CUDA_ARCHITECTURES=80-virtual; DIR/full/ holds the release build's probe_score_gpu_test,
#   mla_verify_gpu_test, probe-score-bench and mla-verify-bench, each xz-compressed (.xz: the four
#   are ~112 MB, over what the tool carries), DIR/ptx80/ the PTX build's two tests; each folder's
#   `targets` the "CUDA targets" line of its configure; DIR/git the output of bench/receipt.py.
# Run there: bash DIR/run.sh (writes $OUT/gpu_families.log and six JSON files), then render with
# bench/gpu_families/report.py.
set -uo pipefail
cd "$(dirname "$0")"
export PROBE_SIDECAR_REQUIRE_GPU=1 PYTHONUNBUFFERED=1
export PROBE_SIDECAR_GIT="$(cat git)"
log="$OUT/gpu_families.log"
status=0
step() {  # step NAME ENV... -- CMD...
  local name="$1"; shift
  local start=$SECONDS
  echo "== $name"
  env "$@"
  local rc=$?
  echo "== $name: exit $rc, $((SECONDS - start)) s"
  [[ $rc == 0 ]] || status=1
}
{
  echo "commit: $PROBE_SIDECAR_GIT"
  nvidia-smi --query-gpu=name,compute_cap,driver_version,memory.total --format=csv,noheader
  echo "release build: $(cat full/targets); ptx build: $(cat ptx80/targets)"
  for f in full/*.xz; do python3 -c "import lzma,sys; open(sys.argv[2],'wb').write(lzma.open(sys.argv[1]).read())" "$f" "${f%.xz}" && chmod +x "${f%.xz}"; done
  if command -v cuobjdump >/dev/null; then
    echo "ptx80 probe_score_gpu_test: $(cuobjdump --list-elf ptx80/probe_score_gpu_test 2>&1 | wc -l) ELF images, $(cuobjdump --list-ptx ptx80/probe_score_gpu_test 2>&1 | grep -c compute_80) compute_80 PTX"
    echo "release mla_verify_gpu_test ELF images by arch: $(cuobjdump --list-elf full/mla_verify_gpu_test 2>&1 | grep -o 'sm_[0-9]*a*' | sort | uniq -c | tr '\n' ' ')"
  fi
  rm -rf "$HOME/.nv/ComputeCache"
  # (a) compute_80 PTX only: no sm_90 machine code, no sm_90a kernels; the driver JIT-compiles.
  step ptx80_probe_score PROBE_SIDECAR_EXPECT_SM90A=0 ptx80/probe_score_gpu_test
  step ptx80_mla_verify PROBE_SIDECAR_EXPECT_SM90A=0 ptx80/mla_verify_gpu_test
  # (b) the release build on the H200: the sm_90a paths dispatched.
  step release_probe_score PROBE_SIDECAR_EXPECT_SM90A=1 full/probe_score_gpu_test
  step release_mla_verify PROBE_SIDECAR_EXPECT_SM90A=1 full/mla_verify_gpu_test
  # (c) other families' tiles, planned for their limits, run on the H200.
  for fam in sm_80 sm_86 sm_89 sm_120; do
    step "${fam}_probe_score" PROBE_SIDECAR_LIMIT_TO_FAMILY=$fam PROBE_SIDECAR_EXPECT_SM90A=0 \
      full/probe_score_gpu_test
    step "${fam}_mla_verify" PROBE_SIDECAR_LIMIT_TO_FAMILY=$fam PROBE_SIDECAR_EXPECT_SM90A=0 \
      full/mla_verify_gpu_test
  done
  # Speed: the same kernels as planned for each family (quick sweeps), and the H200's own.
  for fam in native sm_80 sm_120; do
    flag=(); [[ $fam == native ]] || flag=(--family $fam)
    step "bench_mla_$fam" full/mla-verify-bench --sweep quick --impls split_kv,split_kv_sm90a \
      --out "$OUT/mla_verify_$fam.json" "${flag[@]}"
    step "bench_probe_$fam" full/probe-score-bench --sweep quick \
      --out "$OUT/probe_score_$fam.json" "${flag[@]}"
  done
  echo "== all: $([[ $status == 0 ]] && echo passed || echo FAILED)"
} 2>&1 | tee "$log"
exit $status
