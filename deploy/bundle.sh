#!/usr/bin/env bash
# Makes a relocatable bundle of a build: the binaries, the demo probe set, and the Debian shared
# libraries they need (gRPC, protobuf, absl, c-ares, re2, OpenSSL, prometheus-cpp, civetweb...),
# but not what every target machine has or must provide itself: libc, libstdc++, libgcc, the
# CUDA driver and cuBLAS. The binaries look in ../lib first (RPATH $ORIGIN/../lib). The server
# and the kernel tests open cuBLAS only when their CUDA code first uses it (~570 MB with
# cuBLASLt: too large to carry), so a bundle starts on a host without the CUDA libraries and
# the server serves there on its CPU backend; the benchmarks link cuBLAS and need it to start.
#
#   deploy/bundle.sh BUILD_DIR OUT_DIR [BINARY...]     (default binaries: probe-sidecar,
#                                                      probe-client, probe-bench, probe-echo-server)
#
# The bundle runs on the GPU machine (Ubuntu 24.04, newer glibc and libstdc++) and is the base of
# the container image.
set -euo pipefail
build="${1:?usage: deploy/bundle.sh BUILD_DIR OUT_DIR [BINARY...]}"
out="${2:?usage: deploy/bundle.sh BUILD_DIR OUT_DIR [BINARY...]}"
shift 2
binaries=("$@")
((${#binaries[@]})) || binaries=(probe-sidecar probe-client probe-bench probe-echo-server)

mkdir -p "$out/bin" "$out/lib" "$out/share"
for b in "${binaries[@]}"; do
  [[ -x "$build/bin/$b" ]] || { echo "bundle: $build/bin/$b is missing" >&2; exit 1; }
  cp -f "$build/bin/$b" "$out/bin/"
done
cp -rf "$build/share/probe-sidecar" "$out/share/"

# Everything ldd resolves, except the base system and CUDA.
skip='^(linux-vdso|ld-linux|libc\.so|libm\.so|libpthread|libdl\.so|librt\.so|libgcc_s|libstdc\+\+|libcuda\.so|libcublas|libcudart|libnvidia)'
for b in "${binaries[@]}"; do
  ldd "$out/bin/$b" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}'
done | sort -u | while read -r soname path; do
  [[ "$soname" =~ $skip ]] && continue
  cp -fL "$path" "$out/lib/$soname"
done
echo "bundle: $out ($(du -sh "$out" | cut -f1)): $(ls "$out/bin" | tr '\n' ' ')"
