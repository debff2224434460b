#!/usr/bin/env bash
# The one script for the GPU machine: builds here what the GPU needs, then runs the GPU tests and
# benchmarks there, writing results to $OUT.
#
#   tests/gpu/run.sh prepare        on the build machine (Debian 12), from a COMMITTED tree: build,
#                                   make the relocatable bundle and the Python client into .gpu/
#                                   (carried to the GPU), and record the commit (full hash, +dirty
#                                   if the tree has changes: results then say so)
#       BEFORE=path/to/old/probe-sidecar  also carry an older server binary, which the rpc step
#                                   measures beside the current one (server_label "before")
#       BINARIES="probe-score-bench probe_score_gpu_test"  bundle only these binaries: the whole
#                                   bundle (over 64 MiB even built for 90-real; the release
#                                   list's binaries are about 3x larger, docs/gpu-support.md)
#                                   exceeds what the device tool carries (64 MiB), so kernel work
#                                   and server work go in separate calls; for an H200, BUILD_DIR
#                                   configured with -DCMAKE_CUDA_ARCHITECTURES=90-real keeps them
#                                   small
#       VLLM=1                      also pack vLLM's CUDA build for the GPU machine into .gpu-vllm/
#                                   (tests/gpu/vllm/pack.py: vLLM 0.26.0, pruned to sm_90, with
#                                   the requirements the machine's image lacks; ~45 MiB): carry
#                                   ".gpu-vllm" for the vllm step. Made once: an existing pack
#                                   of the same version is kept (VLLM=force makes it again)
#       PACK=1                      also pack .gpu/ into .gpu-packed/gpu.tar.xz (the whole bundle
#                                   of the release list is ~270 MiB, ~25 MiB packed): carry
#                                   ".gpu-packed" instead of ".gpu", and the script unpacks it there
#                                   first, so kernel and server work fit in one call; says what a
#                                   call would carry with the tree (and with .gpu-vllm: with the
#                                   whole bundle that passes 64 MiB, so the vllm step takes a
#                                   BINARIES="probe-sidecar" bundle)
#   tests/gpu/run.sh                on the GPU machine (through the device tool), from the
#                                   repository root, with .gpu/ (or .gpu-packed/) carried:
#       run(command="STEPS='tests kernels rpc' tests/gpu/run.sh", carry=[".gpu"])
#
# Steps (STEPS, default "tests quick kernels metrics rpc decode"):
#   tests    every GPU test: the kernel tests (probe scoring, probe outcomes, request staging,
#            verify support, MLA verify, tap writes, the tap protocol's C++ half:
#            tap_protocol_gpu_test), the C++ tap against the server (tap_gpu_test), and the
#            two-process Python tests (IPC, executor, ordering and device rows, metrics, Verify,
#            taps and the transformers integration, the tap protocol across languages
#            (test_gpu_tap_protocol.py: runs tap_protocol_gpu_test), real CUDA faults and stuck
#            or killed clients: test_gpu_faults.py, test_gpu_stuck.py).
#            PROBE_SIDECAR_REQUIRE_GPU=1: a test that would skip fails here. KERNEL_TESTS and
#            PYTHON_TESTS (space-separated) run a subset, e.g. with a BINARIES bundle.
#   quick    the quick kernel sweeps against the committed full-sweep figures
#            (bench/kernels_quick.py): probe-score-bench and mla-verify-bench --sweep quick,
#            QUICK_PASSES times (default 2), each point's fastest pass over the committed time of
#            the same implementation and shape, in kernels_quick.txt (and each pass's JSON). Fails
#            where a ratio is over QUICK_THRESHOLD (default 1.03), a measured point has no
#            committed figure, a benchmark measured nothing, or the GPU is another model than the
#            committed figures' (exit 4: the ratios then compare GPUs, not commits). On another
#            model than the default files' (an H200's), the newest record committed on that model
#            is taken where there is one (on an H100: mla_verify_26b25f9_h100.json).
#            QUICK_COMMITTED="mla=FILE probe=FILE": name a benchmark's committed file outright.
#            Needs only those two binaries (BINARIES="probe-score-bench mla-verify-bench").
#   kernels  the probe-scoring benchmark with its torch and Triton peers (bench/run_probe_score.sh)
#   mla      the MLA verify kernels' full sweep with their peers (bench/mla_verify/run.sh: its GPU
#            tests, FlashInfer fa3, FlashMLA, the 69222c8 kernel, compute-sanitizer memcheck;
#            MLA_SWEEP, default full), into mla_verify/. The peers
#            come carried in .mla-peers (bench/mla_verify/prepare_peers.sh makes it, ~32 MB: carry
#            ".mla-peers" with ".gpu-packed"); a peer missing there is left out. Its trace build
#            (.mla-peers/trace), where it is of the bundle's commit, traces MLA_TRACE_POINTS
#            (default h128 s1/s4 b64 x 16k and h16 s1 b64 x 4k). Not in the default steps.
#   metrics  the metrics-recording micro-benchmark on this host's CPUs (raw Google Benchmark JSON)
#   rpc      the end-to-end RPC benchmark (probe-bench against probe-sidecar and a bare gRPC
#            echo, over a Unix socket and loopback TCP; closed and open loop; before/after)
#   vllm     the vLLM plugin in a real vLLM engine on the GPU (needs .gpu-vllm carried): the
#            engines and their checks (tests/vllm/test_gpu_vllm.py: every token scored once in
#            every CUDA graph mode and eager, against float64; the write inside the captured
#            graphs; nothing added to a step but the taps' kernels), then the cost
#            (bench/vllm_engine/run.py: tokens/s, inter-token latency and time to first token with
#            and without the plugin, interleaved): vllm_engine.json/.md. Not in the default steps.
#            VLLM_BENCH=0: the tests alone; PROBE_SIDECAR_VLLM_RUNS=quick: their default and eager
#            engines only.
#   decode   the decode-loop benchmark (bench/decode_loop): taps and in-process scoring, with and
#            without MPS, and the graphed step's kernels profiled under both; then what a tap's
#            calls cost the decode thread's CPU (host_cost.py)
#   windowed the decode loop's taps (compiled and graph-captured) against the loop without them,
#            interleaved window by window (bench/decode_loop/windowed.py, no MPS):
#            decode_loop_windowed.json/.md. Not in the default steps.
#   generate the compiled decode loop end to end: transformers' static-cache generate() with and
#            without the tap, interleaved (bench/decode_loop/compiled_generate.py, GENERATE_ARGS):
#            compiled_generate.json/.md. Not in the default steps.
#   outcomes what counting probe outcomes costs a scoring graph (probe-score-bench --sweep
#            outcomes, rendered by bench/outcomes/report.py): outcomes.json/.md. Not in the
#            default steps (BINARIES="probe-score-bench" suffices).
# Everything goes into $OUT/gpu_results.tgz (results files and logs) and $OUT/run.log; a summary is
# printed last.
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
gpu="$root/.gpu"

if [[ "${1:-}" == prepare ]]; then
  set -e
  build="${BUILD_DIR:-$root/build}"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPROBESIDECAR_BUILD_BENCH=ON \
    -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
  # probe-sidecar-test-faults: the server with the test-only fault hooks (test_gpu_faults.py).
  binaries=(probe-sidecar probe-sidecar-test-faults probe-client probe-bench probe-echo-server
    probe-score-bench mla-verify-bench metrics_bench probe_score_gpu_test probe_score_cpu_test
    probe_outcomes_gpu_test request_staging_gpu_test verify_support_gpu_test mla_verify_gpu_test
    mla_verify_cpu_test tap_write_gpu_test tap_protocol_gpu_test tap_gpu_test)
  # BINARIES: bundle only these (the device tool carries at most 64 MiB with the tree, and the
  # whole bundle is larger); steps whose binaries are missing then fail (exit 127).
  if [[ -n "${BINARIES:-}" ]]; then read -r -a binaries <<<"$BINARIES"; fi
  cmake --build "$build" -j "$(nproc)" --target "${binaries[@]}" demo_probe_set
  rm -rf "$gpu"
  deploy/bundle.sh "$build" "$gpu/bundle" "${binaries[@]}"
  if [[ -n "${BEFORE:-}" ]]; then
    cp "$BEFORE" "$gpu/bundle/bin/probe-sidecar-before"
    ldd "$BEFORE" | awk '$2 == "=>" && $3 ~ /^\// {print $1, $3}' | while read -r so path; do
      [[ -e "$gpu/bundle/lib/$so" || "$so" =~ ^(libc|libm|libstdc|libgcc|libcu|ld-) ]] ||
        cp -L "$path" "$gpu/bundle/lib/$so"
    done
  fi
  # The Python client with its generated stubs, pure Python: runs on the GPU machine's own
  # grpcio/protobuf/torch.
  "$root/.venv/bin/python" -m pip install -q --no-deps --no-build-isolation \
    --target "$gpu/python" ./client/python
  # The client's health extra, which the test harness waits on (the GPU machine's image has
  # grpcio and protobuf but not grpcio-health-checking). 1.62.3: its generated code imports under
  # any protobuf from 4.21 on; later releases pin the protobuf they were generated with.
  "$root/.venv/bin/python" -m pip install -q --no-deps --target "$gpu/python" \
    "grpcio-health-checking==${GPU_HEALTH_VERSION:-1.62.3}"
  python3 bench/receipt.py >"$gpu/git"
  if [[ -n "${VLLM:-}" && "${VLLM}" != 0 ]]; then
    version="$(sed -n 's/^VERSION = "\(.*\)".*/\1/p' tests/gpu/vllm/pack.py)"
    if [[ "$VLLM" == force || ! -f "$root/.gpu-vllm/vllm-$version-sm_90.tar.xz" ]]; then
      "$root/.venv/bin/python" tests/gpu/vllm/pack.py --out "$root/.gpu-vllm"
    fi
  fi
  if [[ "${PACK:-0}" == 1 ]]; then
    rm -rf "$root/.gpu-packed"
    mkdir -p "$root/.gpu-packed"
    # One xz stream with a dictionary larger than the bundle: the binaries that link the kernels
    # each hold the same machine code, which a multi-threaded or small-dictionary xz packs once
    # per binary (the whole bundle: ~70 MiB that way, ~25 MiB this way).
    tar -cf - -C "$root" .gpu | xz --lzma2=preset=6,dict=256MiB -c >"$root/.gpu-packed/gpu.tar.xz"
    echo "packed $(du -sh "$root/.gpu-packed/gpu.tar.xz" | cut -f1): carry .gpu-packed"
    # The device tool refuses a call whose tracked files and carried paths pass 64 MiB in all.
    tree=$(git ls-files -z | du -cb --files0-from=- | tail -1 | cut -f1)
    packed=$(stat -c %s "$root/.gpu-packed/gpu.tar.xz")
    vllm=0
    for f in "$root"/.gpu-vllm/vllm-*.tar.xz; do [[ -f "$f" ]] && vllm=$(stat -c %s "$f"); done
    carry_note() {  # label, bytes
      echo "carry $1: $(($2 / 1048576)) MiB with the tree" \
        "$( (($2 > 64 * 1048576)) && echo '(over the 64 MiB a call carries)')"
    }
    carry_note .gpu-packed $((tree + packed))
    ((vllm > 0)) && carry_note ".gpu-packed .gpu-vllm" $((tree + packed + vllm))
  fi
  echo "prepared $gpu ($(du -sh "$gpu" | cut -f1)) for $(cat "$gpu/git"); on the GPU machine:" \
    "tests/gpu/run.sh"
  exit 0
fi

OUT="${OUT:-$root/gpu-results}"
out="$(mktemp -d)/gpu_results"  # packed into $OUT at the end (few files may come back)
mkdir -p "$OUT" "$out"
if [[ ! -d "$gpu/bundle" && -f "$root/.gpu-packed/gpu.tar.xz" ]]; then
  tar -xJf "$root/.gpu-packed/gpu.tar.xz" -C "$root" || exit 1
fi
[[ -d "$gpu/bundle" ]] || { echo "no .gpu/bundle: run 'tests/gpu/run.sh prepare' first" >&2; exit 1; }
bin="$gpu/bundle/bin"
export PATH="$bin:$PATH"
export PYTHONPATH="$gpu/python:$root/tests/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1 PROBE_SIDECAR_REQUIRE_GPU=1
export PROBE_SIDECAR_BIN="$bin/probe-sidecar" PROBE_CLIENT_BIN="$bin/probe-client"
export PROBE_BENCH_BIN="$bin/probe-bench" PROBE_ECHO_SERVER_BIN="$bin/probe-echo-server"
export PROBE_SIDECAR_GIT="$(cat "$gpu/git")"
[[ "$PROBE_SIDECAR_GIT" == *+dirty ]] && export ALLOW_DIRTY=1  # results are then marked dirty
git_hash="$PROBE_SIDECAR_GIT"
steps="${STEPS:-tests quick kernels metrics rpc decode}"
summary=()
status=0
log="$out/run.log"
{
  echo "== tests/gpu/run.sh: git $git_hash, steps: $steps, $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv
} >"$log" 2>&1
started=$(date +%s)
# After each step the results so far are packed into $OUT, so that a call cut short by its time
# limit still brings back what finished.
pack() {
  cp "$log" "$OUT/run.log"
  tar -czf "$OUT/gpu_results.tgz" -C "$(dirname "$out")" gpu_results
}
note() {
  summary+=("$1: exit $2 ($(($(date +%s) - started)) s since start)$3")
  ((${2})) && status=1
  echo "${summary[-1]}" >>"$log"
  pack
}

if [[ " $steps " == *" tests "* ]]; then
  echo "== tests: kernel and C++ GPU tests"
  rc=0
  for t in ${KERNEL_TESTS:-probe_score_gpu_test probe_outcomes_gpu_test request_staging_gpu_test \
           verify_support_gpu_test mla_verify_gpu_test tap_write_gpu_test tap_protocol_gpu_test \
           tap_gpu_test}; do
    timeout 300 "$bin/$t" --gtest_brief=1 >"$out/$t.log" 2>&1
    r=$?
    # 77 is "no CUDA device": a failure here.
    echo "$t: exit $r $(grep -E '^\[  (PASSED|FAILED)' "$out/$t.log" | tr '\n' ' ')" | tee -a "$log"
    ((r)) && rc=1
  done
  note "kernel and C++ GPU tests" $rc ""
  echo "== tests: two-process Python tests"
  # PYTHON_TESTS: a subset of the files (with a BINARIES bundle, say).
  timeout "${PYTHON_TIMEOUT:-400}" python3 -m pytest -q -rs -p no:cacheprovider --durations=20 \
    ${PYTHON_TESTS:-tests/python/test_gpu_*.py} >"$out/python_gpu_tests.log" 2>&1
  rc=$?
  # The figures the reliability tests record (gpu_faults.json, gpu_stuck.json).
  cp "$gpu"/bundle/reliability/*.json "$out/" 2>/dev/null
  note "python GPU tests" $rc ": $(tail -1 "$out/python_gpu_tests.log")"
fi

if [[ " $steps " == *" quick "* ]]; then
  echo "== quick: quick kernel sweeps against the committed figures"
  quick_committed=()
  for c in ${QUICK_COMMITTED:-}; do quick_committed+=(--committed "$c"); done
  # The benchmarks link cuBLAS (not carried in the bundle).
  LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    timeout "${QUICK_TIMEOUT:-400}" python3 bench/kernels_quick.py --bin-dir "$bin" \
    --out-dir "$out" --passes "${QUICK_PASSES:-2}" --threshold "${QUICK_THRESHOLD:-1.03}" \
    ${ALLOW_DIRTY:+--allow-dirty} "${quick_committed[@]}" >"$out/kernels_quick_run.log" 2>&1
  rc=$?
  note "quick kernel sweeps" $rc \
    " (kernels_quick.txt: $(grep -h '^== exit' "$out/kernels_quick.txt" 2>/dev/null))"
fi

if [[ " $steps " == *" kernels "* ]]; then
  echo "== kernels: probe-score benchmark + peers"
  SKIP_TESTS=1 SWEEP="${SWEEP:-full}" timeout 300 bash bench/run_probe_score.sh "$gpu/bundle" \
    "$out" >>"$log" 2>&1
  note "probe-score bench" $? " (probe_score.md)"
fi

if [[ " $steps " == *" mla "* ]]; then
  echo "== mla: the MLA verify sweep with its peers"
  peers="${MLA_PEERS:-$root/.mla-peers}"
  mla_peers=""
  ls "$peers"/wheels/flashinfer_python-*.whl >/dev/null 2>&1 && mla_peers="flashinfer_fa3"
  [[ -f "$peers/flashmla/libflashmla_peer.so" ]] && mla_peers="${mla_peers:+$mla_peers,}flashmla"
  mla_env=(SWEEP="${MLA_SWEEP:-full}" IMPLS=split_kv_sm90a DEADLINE_S=300 SANITIZE=1
    SANITIZE_TOOLS=memcheck FLASHMLA_PEER_LIB="$peers/flashmla/libflashmla_peer.so"
    RUN_COMMAND="STEPS=mla tests/gpu/run.sh (bench/mla_verify/run.sh with the .mla-peers peers)")
  if [[ -n "$mla_peers" ]]; then mla_env+=(PEER_IMPLS="$mla_peers"); else mla_env+=(SKIP_PEERS=1); fi
  [[ -x "$peers/prev/mla-verify-bench" ]] &&
    mla_env+=(PREV_BIN="$peers/prev/mla-verify-bench" PREV_GIT="$(cat "$peers/prev/git")")
  [[ -x "$peers/trace/mla-verify-bench" && "$(cat "$peers/trace/git")" == "${git_hash%+dirty}" ]] &&
    mla_env+=(TRACE_BIN="$peers/trace/mla-verify-bench"
      TRACE_POINTS="${MLA_TRACE_POINTS:-128:1:64:16384,128:4:64:16384,16:1:64:4096}")
  wheel_dir=()
  [[ "$mla_peers" == *flashinfer_fa3* ]] && wheel_dir=("$peers/wheels")
  env "${mla_env[@]}" timeout 500 bash bench/mla_verify/run.sh "$bin" "$out/mla_verify" \
    "${wheel_dir[@]}" >>"$log" 2>&1
  note "mla verify sweep" $? " (mla_verify/mla_verify.md; peers: ${mla_peers:-none})"
fi

if [[ " $steps " == *" metrics "* ]]; then
  echo "== metrics: recording cost on this host"
  # metrics_bench links Debian's libbenchmark (carried in the bundle's lib/).
  timeout 120 "$bin/metrics_bench" --benchmark_min_time=0.5 --benchmark_repetitions=3 \
    --benchmark_report_aggregates_only=true --benchmark_format=json \
    --benchmark_out_format=json --benchmark_out="$out/metrics_gpu_host_raw.json" \
    >/dev/null 2>>"$log"
  note "metrics bench" $? " (metrics_gpu_host_raw.json: report it with bench/metrics/run.sh)"
fi

if [[ " $steps " == *" rpc "* ]]; then
  echo "== rpc: end-to-end benchmark"
  tmp="$(mktemp -d)"
  # probe-bench loads its probe sets over the transport it measures: over TCP that needs the admin
  # token (without an admin credential only the server's own user may load, over the Unix socket).
  head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/admin-token"
  admin=(--admin-token-file="$tmp/admin-token")
  # serve NAME BINARY FLAGS...: starts a server, sets $<NAME>_pid, _uds, _tcp, _metrics.
  serve() {
    local name=$1 binary=$2
    shift 2
    "$binary" --backend=cuda --listen="unix:$tmp/$name.sock" --listen=127.0.0.1:0 "${admin[@]}" \
      "$@" >"$tmp/$name.log" 2>&1 &
    eval "${name}_pid=$!"
    for _ in $(seq 300); do grep -q "serving on" "$tmp/$name.log" && break; sleep 0.1; done
    eval "${name}_uds=unix:$tmp/$name.sock"
    eval "${name}_tcp=$(grep -o 'serving on [^;]*' "$tmp/$name.log" | grep -o '127\.0\.0\.1:[0-9]*' | head -1)"
    eval "${name}_metrics=$(grep -o 'metrics on 127\.0\.0\.1:[0-9]*' "$tmp/$name.log" | grep -o '127.*')"
  }
  serve after probe-sidecar --metrics-listen=127.0.0.1:0 --max-message-bytes=256Mi \
    --warmup-rows=1,64,1024,8192 --cuda-workers=4
  probe-echo-server --listen="unix:$tmp/e.sock" --listen=127.0.0.1:0 2>"$tmp/echo.log" &
  echo_server=$!
  for _ in $(seq 300); do grep -q "serving on" "$tmp/echo.log" && break; sleep 0.1; done
  echo_tcp="$(grep -o '127\.0\.0\.1:[0-9]*' "$tmp/echo.log" | head -1)"
  rc=0
  receipt=(--git="$git_hash" ${ALLOW_DIRTY:+--allow-dirty} "${admin[@]}")
  seconds="${RPC_SECONDS:-0.8}"
  # Where one client's small requests spend their time on the server (stage histogram means).
  probe-bench --target="$after_uds" --transport=uds --rows=1,64 --probes=1 --concurrency=1 \
    --modes=score_ipc --seconds=1 --quiet "${admin[@]}" >/dev/null 2>&1
  python3 bench/stage_means.py "$after_metrics" --save "$tmp/metrics_c0.txt"
  probe-bench --target="$after_uds" --transport=uds --rows=1 --probes=1 --concurrency=1 \
    --modes=score_ipc --seconds=2 --quiet "${admin[@]}" >/dev/null 2>&1
  python3 bench/stage_means.py "$after_metrics" --since "$tmp/metrics_c0.txt" \
    --title "server-side stage means, 1 client, R=1 P=1, uds" >>"$log" 2>&1
  for transport in uds tcp; do
    if [[ $transport == uds ]]; then t="$after_uds" e="unix:$tmp/e.sock"; else t="$after_tcp" e="$echo_tcp"; fi
    # Closed loop, unary and ScoreStream next to the bare unary and bidi echo.
    probe-bench --target="$t" --echo-target="$e" --transport=$transport "${receipt[@]}" \
      --modes=echo,echo_stream,score_ipc,score_inline,score_stream_ipc --quiet \
      --out="$tmp/rpc_$transport.json" --seconds="$seconds" >>"$log" 2>&1 || rc=1
    # Open loop, small requests: latency against offered load (the PNG).
    probe-bench --target="$t" --echo-target="$e" --transport=$transport "${receipt[@]}" \
      --modes=echo,score_ipc,score_stream_ipc --rows=1 --probes=1 --rate=1000,5000,10000,20000 \
      --quiet --out="$tmp/rpc_open_$transport.json" --seconds="$seconds" >>"$log" 2>&1 || rc=1
  done
  kill -TERM "$after_pid" 2>/dev/null
  wait "$after_pid" 2>/dev/null
  { echo "== rpc server log"; tail -20 "$tmp/after.log"; } >>"$log"
  inputs=("$tmp"/rpc_{uds,tcp,open_uds,open_tcp}.json)
  # Small single-client requests against a server without GPU stage timing, and against the
  # older server binary (before the executor change), in the same run, one at a time.
  variants=("untimed:probe-sidecar:--gpu-timing-every=0")
  [[ -x "$bin/probe-sidecar-before" ]] && variants+=("before:probe-sidecar-before:")
  for variant in "${variants[@]}"; do
    IFS=: read -r label binary flag <<<"$variant"
    serve "$label" "$binary" --metrics-listen=none --warmup-rows=1,64 $flag
    pid_var="${label}_pid" uds_var="${label}_uds"
    probe-bench --target="${!uds_var}" --transport=uds "${receipt[@]}" --rows=1,64 \
      --probes=1,16 --concurrency=1 --modes=score_ipc,score_stream_ipc --server-label="$label" \
      --quiet --out="$tmp/rpc_$label.json" --seconds="$seconds" >>"$log" 2>&1 || rc=1
    kill -TERM "${!pid_var}" 2>/dev/null
    wait "${!pid_var}" 2>/dev/null
    inputs+=("$tmp/rpc_$label.json")
  done
  kill -TERM $echo_server 2>/dev/null
  wait $echo_server 2>/dev/null
  python3 bench/report_rpc.py "${inputs[@]}" ${ALLOW_DIRTY:+--allow-dirty} \
    --out "$out/rpc_score.json" --md "$out/rpc_score.md" \
    --command "tests/gpu/run.sh (STEPS=rpc)" >>"$log" 2>&1 || rc=1
  python3 bench/plot_rpc.py "$out/rpc_score.json" --png "$out/rpc_score.png" >>"$log" 2>&1 || rc=1
  note "rpc bench" $rc " (rpc_score.md, rpc_score.png)"
fi

if [[ " $steps " == *" vllm "* ]]; then
  echo "== vllm: the plugin in a vLLM engine on the GPU"
  rc=0
  site=/tmp/probe-sidecar-vllm-site
  pack="$(ls "$root"/.gpu-vllm/vllm-*.tar.xz 2>/dev/null | head -1)"
  if [[ -z "$pack" ]]; then
    echo "no .gpu-vllm/vllm-*.tar.xz: prepare with VLLM=1 and carry .gpu-vllm" | tee -a "$log"
    rc=1
  elif [[ ! -d "$site/vllm" ]]; then
    mkdir -p "$site" && tar -xJf "$pack" -C "$site" || rc=1
  fi
  if ((rc == 0)); then
    # torch's NVRTC (vLLM's kernels load it by soname), no FlashInfer there.
    nvrtc="$(python3 -c 'import glob, os, nvidia; print(os.path.dirname(sorted(glob.glob(os.path.join(nvidia.__path__[0], "**", "libnvrtc.so.*"), recursive=True))[0]))' 2>/dev/null)"
    models="$(mktemp -d)"
    (
      export PYTHONPATH="$site:$PYTHONPATH" VLLM_USE_FLASHINFER_SAMPLER=0
      export LD_LIBRARY_PATH="$nvrtc${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
      export PROBE_SIDECAR_VLLM_MODELS="$models" PROBE_SIDECAR_RESULTS_DIR="$out"
      python3 -c "import vllm, sys; print('vllm', vllm.__version__, file=sys.stderr)" || exit 1
      timeout "${VLLM_TEST_TIMEOUT:-330}" python3 -m pytest -q -rs -p no:cacheprovider \
        --durations=10 tests/vllm/test_gpu_vllm.py >"$out/vllm_gpu_tests.log" 2>&1
      tests=$?
      pack  # what the tests left, in case the benchmark is cut short
      bench=0
      if [[ "${VLLM_BENCH:-1}" != 0 ]]; then  # VLLM_BENCH=0: the tests alone
        timeout "${VLLM_BENCH_TIMEOUT:-330}" python3 bench/vllm_engine/run.py --out-dir "$out" \
          --model-dir "$models" --correctness "$out/vllm_engine_correctness.json" \
          ${ALLOW_DIRTY:+--allow-dirty} ${VLLM_BENCH_ARGS:-} >"$out/vllm_engine_run.log" 2>&1
        bench=$?
      fi
      exit $((tests || bench))
    ) >>"$log" 2>&1
    rc=$?
  fi
  note "vllm engine" $rc " ($(tail -1 "$out/vllm_gpu_tests.log" 2>/dev/null); vllm_engine.md)"
fi

if [[ " $steps " == *" decode "* ]]; then
  echo "== decode: the decode-loop benchmark"
  # Its own time budget (330 s, cut repeats first) plus model builds; raw runs kept in the log dir.
  timeout "${DECODE_TIMEOUT:-420}" python3 bench/decode_loop/run.py --out-dir "$out" --profile \
    --runs "$out/decode_loop_runs.jsonl" ${ALLOW_DIRTY:+--allow-dirty} ${DECODE_ARGS:-} \
    >"$out/decode_loop_run.log" 2>&1
  note "decode-loop bench" $? " (decode_loop.md)"
  timeout 120 python3 bench/decode_loop/host_cost.py --out-dir "$out" --server "$bin/probe-sidecar" \
    ${ALLOW_DIRTY:+--allow-dirty} >"$out/tap_host_cost_run.log" 2>&1
  note "tap host cost" $? " (tap_host_cost.md)"
fi

if [[ " $steps " == *" windowed "* ]]; then
  echo "== windowed: the taps' cost, windows interleaved"
  timeout "${WINDOWED_TIMEOUT:-480}" python3 bench/decode_loop/windowed.py --out-dir "$out" \
    --server "$bin/probe-sidecar" ${ALLOW_DIRTY:+--allow-dirty} ${WINDOWED_ARGS:-} \
    >"$out/decode_loop_windowed_run.log" 2>&1
  note "windowed decode loop" $? " (decode_loop_windowed.md)"
fi

if [[ " $steps " == *" generate "* ]]; then
  echo "== generate: a compiled generate() with and without the tap"
  timeout "${GENERATE_TIMEOUT:-360}" python3 bench/decode_loop/compiled_generate.py \
    --out "$out/compiled_generate.json" --server "$bin/probe-sidecar" \
    ${ALLOW_DIRTY:+--allow-dirty} ${GENERATE_ARGS:-} >"$out/compiled_generate_run.log" 2>&1
  note "compiled generate" $? " (compiled_generate.md)"
fi

if [[ " $steps " == *" outcomes "* ]]; then
  echo "== outcomes: what counting costs a scoring graph"
  LD_LIBRARY_PATH=/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
    timeout "${OUTCOMES_TIMEOUT:-240}" "$bin/probe-score-bench" --sweep outcomes \
    --out "$out/outcomes.json" --git "$git_hash" ${ALLOW_DIRTY:+--allow-dirty} \
    >"$out/outcomes_run.log" 2>&1
  rc=$?
  python3 bench/outcomes/report.py "$out/outcomes.json" --out "$out/outcomes.md" \
    ${ALLOW_DIRTY:+--allow-dirty} >>"$out/outcomes_run.log" 2>&1 || rc=1
  note "outcomes sweep" $rc " (outcomes.md)"
fi

echo "== summary" | tee -a "$log"
printf '%s\n' "${summary[@]}" | tee -a "$log"
pack
[[ -f "$out/kernels_quick.txt" ]] && grep -E '^== (probe|mla):.*points' "$out/kernels_quick.txt"
[[ -f "$out/probe_score.md" ]] && sed -n '/^## Targets/,/^## Crossovers/p' "$out/probe_score.md" | head -20
[[ -f "$out/rpc_score.md" ]] && grep -A12 -i "^## Targets" "$out/rpc_score.md" | head -16
[[ -f "$out/decode_loop.md" ]] && grep -A14 -i "^## Targets" "$out/decode_loop.md" | head -16
[[ -f "$out/vllm_engine.md" ]] && sed -n '/^| batch/,$p' "$out/vllm_engine.md" | head -40
[[ -f "$out/decode_loop_windowed.md" ]] && sed -n '/^| tap/,/^## Kernels/p' "$out/decode_loop_windowed.md"
[[ -f "$out/outcomes.md" ]] && grep -E '^\| [0-9]' "$out/outcomes.md" | head -30
exit $status
