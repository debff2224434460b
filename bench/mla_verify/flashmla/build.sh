#!/usr/bin/env bash
# Builds FlashMLA's sm90 dense decode as the MLA verify peer library (libflashmla_peer.so), on
# the build machine, for sm_90a: its sources come from a FlashMLA checkout the caller names (the
# project keeps no copy and fetches nothing), CUTLASS/CuTe from the headers the project builds
# with (the nvidia-cutlass package).
#
#   bench/mla_verify/flashmla/build.sh FLASHMLA_DIR OUT_DIR [CUTLASS_INCLUDE]
#
# CUTLASS_INCLUDE defaults to the build's PROBESIDECAR_CUTLASS_INCLUDE (build/CMakeCache.txt).
# OUT_DIR gets libflashmla_peer.so and flashmla_peer.txt (the FlashMLA commit it was built from:
# FLASHMLA_COMMIT where the checkout is no git tree); peers.py loads it from FLASHMLA_PEER_LIB
# (impl flashmla). About 2.5 minutes on two cores.
set -euo pipefail
src=${1:?usage: build.sh FLASHMLA_DIR OUT_DIR [CUTLASS_INCLUDE]}
out=${2:?usage: build.sh FLASHMLA_DIR OUT_DIR [CUTLASS_INCLUDE]}
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(cd "$here/../../.." && pwd)
cutlass=${3:-$(sed -n 's/^PROBESIDECAR_CUTLASS_INCLUDE:PATH=//p' "$root/build/CMakeCache.txt")}
[[ -d "$cutlass/cute" ]] || { echo "no CUTLASS/CuTe headers at '$cutlass'" >&2; exit 1; }
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
mkdir -p "$out"
obj=$(mktemp -d)
trap 'rm -rf "$obj"' EXIT
flags=(-O3 -std=c++20 -DNDEBUG -D_USE_MATH_DEFINES -DFLASH_MLA_DISABLE_FP16
  -Wno-deprecated-declarations -U__CUDA_NO_HALF_OPERATORS__ -U__CUDA_NO_HALF_CONVERSIONS__
  -U__CUDA_NO_HALF2_OPERATORS__ -U__CUDA_NO_BFLOAT16_CONVERSIONS__ --expt-relaxed-constexpr
  --expt-extended-lambda --use_fast_math -gencode arch=compute_90a,code=sm_90a -Xcompiler -fPIC
  -I"$src/csrc" -I"$src/csrc/kerutils/include" -I"$src/csrc/sm90" -I"$cutlass")
sources=("$here/flashmla_peer.cu"
  "$src/csrc/sm90/decode/dense/instantiations/bf16.cu"
  "$src/csrc/smxx/decode/combine/combine.cu"
  "$src/csrc/smxx/decode/get_decoding_sched_meta/get_decoding_sched_meta.cu")
objects=()
for s in "${sources[@]}"; do
  o="$obj/$(basename "$s" .cu).o"
  "$nvcc" "${flags[@]}" -c "$s" -o "$o"
  objects+=("$o")
done
"$nvcc" -shared -gencode arch=compute_90a,code=sm_90a "${objects[@]}" -o "$out/libflashmla_peer.so" \
  -lcudart
commit=${FLASHMLA_COMMIT:-$(git -C "$src" rev-parse HEAD 2>/dev/null || echo unknown)}
echo "FlashMLA $commit (sm90 dense decode, bf16), built $(date -u +%Y-%m-%dT%H:%M:%SZ) with $("$nvcc" --version | tail -1)" >"$out/flashmla_peer.txt"
echo "built $out/libflashmla_peer.so from FlashMLA $commit"
