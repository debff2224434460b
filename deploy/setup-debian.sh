#!/usr/bin/env bash
# Sets up a Debian 12 machine for Probe Sidecar, builds it, then runs it or its tests.
#
#   deploy/setup-debian.sh run    install what is missing, build, start the service on its
#                                 embedded defaults and show a scored request (Ctrl-C stops it)
#   deploy/setup-debian.sh test   install what is missing, build, run every test (CI runs this)
#
# `test` runs six stages, in this order; TEST_STAGES runs some of them alone (a space-separated
# list, e.g. TEST_STAGES=fuzz FUZZ_SECONDS=120 deploy/setup-debian.sh test):
#   release   the normal build (build/) and every CTest test: unit, C++ and Python integration
#   vllm      the vLLM plugin against a real vLLM engine (PyPI's CPU build, added to .venv/ by
#             tests/vllm/setup.sh) and the release build's server: tests/vllm/
#   asan      clang AddressSanitizer + UndefinedBehaviorSanitizer build (build-asan/, with the
#             libFuzzer targets): every CPU test again, the Python integration tests against the
#             sanitized server, and the fuzz corpora replayed
#   tsan      clang ThreadSanitizer build (build-tsan/): the executors' and registries' tests
#   fuzz      each libFuzzer target of build-asan/ for FUZZ_SECONDS (default 30) seconds
#   deploy    deploy/ run for real (tests/deploy/run.sh): the image built from a bundle of build/
#             and started, the compose stack brought up and scraped, the Kubernetes manifests
#             checked; installs docker.io, docker-compose and debootstrap (needs root or sudo)
# Any sanitizer report fails the stage; reports are kept in <build dir>/sanitizer-reports/. With the
# release stage, the sanitizer stages' builds run in the background (nice 19) during its tests.
#
# CUDA targets (docs/gpu-support.md): build/ carries machine code for every GPU family the
# service supports unless CUDA_ARCHITECTURES narrows it (a CMAKE_CUDA_ARCHITECTURES list, e.g.
# CUDA_ARCHITECTURES=90-real for a fast local build; .ci/run sets its own). The sanitizer builds
# run no GPU code: they compile SANITIZER_CUDA_ARCHITECTURES (default 80-virtual: PTX only) and no
# GPU tests.
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
# The observability tests start a real Prometheus (promtool checks its config and rules). The
# sanitizer and fuzzing builds use clang with its runtimes (compiler-rt) and llvm-symbolizer.
[[ "$mode" == test ]] && packages+=(prometheus clang libclang-rt-dev llvm)
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

cuda_archs="${CUDA_ARCHITECTURES:-release}"
sanitizer_cuda_archs="${SANITIZER_CUDA_ARCHITECTURES:-80-virtual}"

configure() {  # configure BUILD_DIR CUDA_ARCHITECTURES [cmake args...]
  local dir="$1" archs="$2"
  shift 2
  cmake -S . -B "$dir" -G Ninja -DCMAKE_CUDA_COMPILER="$nvcc" \
    -DCMAKE_CUDA_ARCHITECTURES="$archs" -DPython3_EXECUTABLE="$venv/bin/python" "$@" >/dev/null
}

# The sanitizer builds: build-asan/ (ASan+UBSan, with the fuzz targets) and build-tsan/ (only what
# the TSan tests need). No benchmarks, no GPU tests: they run no GPU code.
build_asan() {
  configure "$root/build-asan" "$sanitizer_cuda_archs" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DPROBESIDECAR_SANITIZE=address,undefined -DPROBESIDECAR_FUZZ=ON \
    -DPROBESIDECAR_BUILD_BENCH=OFF -DPROBESIDECAR_GPU_TESTS=OFF
  cmake --build "$root/build-asan" -j "$jobs"
}
build_tsan() {
  configure "$root/build-tsan" "$sanitizer_cuda_archs" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DPROBESIDECAR_SANITIZE=thread -DPROBESIDECAR_BUILD_BENCH=OFF -DPROBESIDECAR_GPU_TESTS=OFF
  cmake --build "$root/build-tsan" -j "$jobs" --target tsan_tests
}

# The release and vLLM stages' tests leave about a third of the CPU idle (servers started and
# stopped, deadlines waited on). When sanitizer stages follow, their builds start in the
# background once the release build is done, at the lowest CPU priority (nice 19: the tests
# take the CPU whenever they want it), build-asan first; each sanitizer stage waits for its own
# build, whose step then finishes what is left and reports any error. Their output:
# build/sanitizer-prebuild.log; build/.prebuilt-<name> marks each one done.
prebuild_pid=""
start_sanitizer_prebuild() {
  local wanted=()
  [[ " $stages " == *" asan "* || " $stages " == *" fuzz "* ]] && wanted+=(asan)
  [[ " $stages " == *" tsan "* ]] && wanted+=(tsan)
  ((${#wanted[@]})) || return 0
  rm -f "$build"/.prebuilt-*
  echo "== building ${wanted[*]} in the background (nice 19): $build/sanitizer-prebuild.log"
  # Its own process group (set -m), so that the EXIT trap stops it with every compiler it runs.
  set -m
  (
    renice -n 19 -p "$BASHPID" >/dev/null
    for name in "${wanted[@]}"; do
      "build_$name" || true
      touch "$build/.prebuilt-$name"
    done
  ) </dev/null >"$build/sanitizer-prebuild.log" 2>&1 &
  prebuild_pid=$!
  set +m
}
wait_sanitizer_prebuild() {  # wait_sanitizer_prebuild asan|tsan
  [[ -n "$prebuild_pid" ]] || return 0
  while [[ ! -e "$build/.prebuilt-$1" ]] && kill -0 "$prebuild_pid" 2>/dev/null; do
    sleep 1
  done
}

if [[ "$mode" == test ]]; then
  stages="${TEST_STAGES:-release vllm asan tsan fuzz deploy}"
  for stage in $stages; do
    case "$stage" in
      release | vllm | asan | tsan | fuzz | deploy) ;;
      *) echo "error: unknown stage '$stage' in TEST_STAGES (release vllm asan tsan fuzz deploy)" >&2; exit 2 ;;
    esac
  done
  # A stage that fails ends the script: the background builds go with it.
  trap 'if [[ -n "$prebuild_pid" ]]; then kill -- "-$prebuild_pid" 2>/dev/null || true; fi' EXIT
  for stage in $stages; do
    start=$SECONDS
    case "$stage" in
      release)
        echo "== build ($build)"
        configure "$build" "$cuda_archs" -DCMAKE_BUILD_TYPE=Release
        cmake --build "$build" -j "$jobs"
        start_sanitizer_prebuild
        echo "== tests"
        ctest --test-dir "$build" --output-on-failure -j "$jobs" --timeout 900
        ;;
      vllm)
        echo "== vLLM (CPU build) in $venv"
        tests/vllm/setup.sh "$venv"
        echo "== build ($build: probe-sidecar)"
        configure "$build" "$cuda_archs" -DCMAKE_BUILD_TYPE=Release
        cmake --build "$build" -j "$jobs" --target probe-sidecar
        echo "== the vLLM plugin's tests (each starts the engine: about a minute each)"
        PROBE_SIDECAR_BIN="$build/bin/probe-sidecar" PROBE_SIDECAR_REQUIRE_VLLM=1 \
          "$venv/bin/python" -m pytest -q -rs -p no:cacheprovider tests/vllm
        ;;
      asan | fuzz)
        # One build serves both (ASan+UBSan, with the fuzz targets); the second is a no-op.
        wait_sanitizer_prebuild asan
        echo "== build (build-asan: AddressSanitizer + UndefinedBehaviorSanitizer, fuzz targets)"
        build_asan
        if [[ "$stage" == asan ]]; then
          echo "== tests under ASan + UBSan (not the GPU tests, nor those that start no binary)"
          asan_args=(-LE "gpu|python-only" -j "$jobs")
          if [[ -x "$build/bin/probe-bench" && -x "$build/bin/probe-echo-server" ]]; then
            # The load generator is not rebuilt with sanitizers: the release one drives the
            # sanitized server.
            export PROBE_BENCH_BIN="$build/bin/probe-bench"
            export PROBE_ECHO_SERVER_BIN="$build/bin/probe-echo-server"
          else
            asan_args+=(-E python_test_probe_bench)
          fi
          tests/sanitizers/ctest.sh "$root/build-asan" "${asan_args[@]}"
        else
          echo "== fuzzing, ${FUZZ_SECONDS:-30} s per target"
          tests/fuzz/run.sh "$root/build-asan" "${FUZZ_SECONDS:-30}"
        fi
        ;;
      tsan)
        wait_sanitizer_prebuild tsan
        echo "== build (build-tsan: ThreadSanitizer; the executors' and registries' tests)"
        build_tsan
        echo "== tests under TSan"
        tests/sanitizers/ctest.sh "$root/build-tsan" -L tsan -j "$jobs"
        ;;
      deploy)
        # The release build's binaries, bundled into the image (built here if missing).
        echo "== build ($build: probe-sidecar, probe-client)"
        configure "$build" "$cuda_archs" -DCMAKE_BUILD_TYPE=Release
        cmake --build "$build" -j "$jobs" --target probe-sidecar probe-client demo_probe_set
        tests/deploy/run.sh "$build"
        ;;
    esac
    echo "== stage $stage: $((SECONDS - start)) s"
  done
  exit 0
fi

# --- Build ------------------------------------------------------------------------------------
echo "== build ($build)"
configure "$build" "$cuda_archs" -DCMAKE_BUILD_TYPE=Release
cmake --build "$build" -j "$jobs"

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
