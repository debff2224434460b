#!/usr/bin/env bash
# Sets up a Debian 12 machine for Probe Sidecar, builds it, then runs it or its tests.
#
#   deploy/setup-debian.sh run    install what is missing, build, start the service on its
#                                 embedded defaults and show a scored request (Ctrl-C stops it)
#   deploy/setup-debian.sh test   install what is missing, build, run every test (CI runs this)
#
# Debian packages come from apt-get, Python packages from pip into .venv/. Safe to run again:
# only what is missing is installed, and the build is incremental. The CUDA 13 toolkit is
# expected at /usr/local/cuda (CUDA code is compiled even where no GPU is present).
set -euo pipefail

mode="${1:-}"
if [[ "$mode" != run && "$mode" != test ]]; then
  echo "usage: $0 run|test" >&2
  exit 2
fi
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"
build="${BUILD_DIR:-$root/build}"
jobs="$(nproc)"

# --- Debian packages --------------------------------------------------------------------------
packages=(build-essential cmake ninja-build pkg-config git python3 python3-venv python3-dev
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  prometheus-cpp-dev nlohmann-json3-dev libgtest-dev libgmock-dev libbenchmark-dev)
# The observability tests start a real Prometheus (promtool checks its config and rules).
[[ "$mode" == test ]] && packages+=(prometheus)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  sudo=""
  [[ "$(id -u)" != 0 ]] && sudo="sudo"
  echo "== apt-get install ${missing[*]}"
  $sudo apt-get update -q
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

nvcc="${CUDACXX:-/usr/local/cuda/bin/nvcc}"
if [[ ! -x "$nvcc" ]]; then
  echo "error: the CUDA toolkit (nvcc) is not at $nvcc; install CUDA 13 or set CUDACXX" >&2
  exit 1
fi

# --- Python packages --------------------------------------------------------------------------
venv="$root/.venv"
if [[ ! -x "$venv/bin/python" ]]; then
  echo "== python3 -m venv $venv"
  python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install -q --upgrade pip
"$venv/bin/python" -m pip install -q -r tests/requirements.txt
# The client package; its gRPC stubs are generated from proto/ while it is built.
"$venv/bin/python" -m pip install -q --no-build-isolation --force-reinstall --no-deps ./client/python

# --- Build ------------------------------------------------------------------------------------
echo "== build ($build)"
cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
  -DCMAKE_CUDA_COMPILER="$nvcc" -DPython3_EXECUTABLE="$venv/bin/python" >/dev/null
cmake --build "$build" -j "$jobs"

if [[ "$mode" == test ]]; then
  echo "== tests"
  ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
  exit $?
fi

# --- Run: the service on its defaults, then one scored request -------------------------------
"$build/bin/probe-sidecar" &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server' INT TERM
for _ in $(seq 100); do
  "$build/bin/probe-client" health >/dev/null 2>&1 && break
  kill -0 $server 2>/dev/null || { echo "probe-sidecar failed to start" >&2; exit 1; }
  sleep 0.1
done
echo "== a scored request: probe-client score --probe-set demo --random 4,4096"
"$build/bin/probe-client" score --probe-set demo --random 4,4096
echo "== probe-sidecar is serving (unix:/tmp/probe-sidecar.sock, 127.0.0.1:50551, metrics on 127.0.0.1:9464); Ctrl-C stops it"
wait $server
