#!/usr/bin/env bash
# The MLA verify benchmark's peers, made on the build machine for the GPU machine (Python 3.12,
# CUDA 13, no network): what bench/mla_verify/run.sh and the `mla` step of tests/gpu/run.sh take.
#
#   bench/mla_verify/prepare_peers.sh OUT_DIR FLASHMLA_DIR [PREV_COMMIT]
#
# OUT_DIR (tests/gpu/run.sh reads .mla-peers) gets:
#   wheels/    FlashInfer 0.7.4 cut to its MLA decode (slim_flashinfer.py) and the apache-tvm-ffi
#              wheel it needs, for CPython 3.12 (downloaded from PyPI here)
#   flashmla/  libflashmla_peer.so from the FlashMLA checkout FLASHMLA_DIR (flashmla/build.sh)
#   prev/      mla-verify-bench built from PREV_COMMIT of this repository (default 69222c8, the
#              kernel the issue-38 targets name), kernels only, sm_90, stripped; prev/git its commit
#   trace/     mla-verify-bench built from this checkout's HEAD with -DPROBESIDECAR_MLA_TRACE=ON
#              (the in-kernel trace, docs/benchmarks.md), trace/git its commit: the `mla` step
#              traces the points still behind with it when it is of the bundle's commit
# ~32 MB in all. A part already there is kept (delete it to make it again). About 5 minutes on two
# cores the first time.
set -euo pipefail
out=${1:?usage: prepare_peers.sh OUT_DIR FLASHMLA_DIR [PREV_COMMIT]}
flashmla=${2:?usage: prepare_peers.sh OUT_DIR FLASHMLA_DIR [PREV_COMMIT]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../.." && pwd)
py="$root/.venv/bin/python"
cutlass=$(sed -n 's/^PROBESIDECAR_CUTLASS_INCLUDE:PATH=//p' "$root/build/CMakeCache.txt")
prev=$(git -C "$root" rev-parse "${3:-69222c8}")
flashinfer=${FLASHINFER_VERSION:-0.7.4}
mkdir -p "$out"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"; for w in prev trace; do
  git -C "$root" worktree remove --force "$tmp/$w" 2>/dev/null || true; done' EXIT
head=$(git -C "$root" rev-parse HEAD)

if ! ls "$out"/wheels/flashinfer_python-"$flashinfer"-*.whl >/dev/null 2>&1; then
  "$py" -m pip download -q --no-deps "flashinfer-python==$flashinfer" -d "$tmp/fi"
  wheel=$(ls "$tmp"/fi/flashinfer_python-*.whl)
  # The apache-tvm-ffi release pip would pick for FlashInfer's requirement, for the GPU's Python.
  need=$(unzip -p "$wheel" "*.dist-info/METADATA" |
    sed -n 's/^Requires-Dist: apache-tvm-ffi\([^;]*\)$/\1/p' | head -1 | tr -d ' ')
  mkdir -p "$out/wheels"
  "$py" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --platform manylinux_2_28_x86_64 "apache-tvm-ffi$need" -d "$out/wheels"
  "$py" "$here/slim_flashinfer.py" "$wheel" "$out/wheels"
fi
if [[ ! -f "$out/flashmla/libflashmla_peer.so" ]]; then
  bash "$here/flashmla/build.sh" "$flashmla" "$out/flashmla" "$cutlass"
fi
# mla-verify-bench of COMMIT into OUT_DIR/PART (kernels only, sm_90, stripped; PART/git: COMMIT).
build_bench() {  # part commit cmake-flags...
  local part=$1 commit=$2
  shift 2
  [[ -x "$out/$part/mla-verify-bench" && "$(cat "$out/$part/git" 2>/dev/null)" == "$commit" ]] &&
    return 0
  git -C "$root" worktree add -q --detach "$tmp/$part" "$commit"
  cmake -S "$tmp/$part" -B "$tmp/$part/build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DCMAKE_CUDA_ARCHITECTURES=90-real -DPROBESIDECAR_KERNELS_ONLY=ON \
    -DPROBESIDECAR_CUTLASS_INCLUDE="$cutlass" "$@" >/dev/null
  cmake --build "$tmp/$part/build" --target mla-verify-bench -j "$(nproc)" >/dev/null
  mkdir -p "$out/$part"
  cp "$tmp/$part/build/bin/mla-verify-bench" "$out/$part/"
  strip "$out/$part/mla-verify-bench"
  echo "$commit" >"$out/$part/git"
}
build_bench prev "$prev"
build_bench trace "$head" -DPROBESIDECAR_MLA_TRACE=ON
du -sh "$out"/wheels "$out"/flashmla "$out"/prev "$out"/trace
