#!/usr/bin/env bash
# The one script for the GPU machine: builds here what the GPU needs, then runs every GPU test and
# benchmark there in one call, writing results to $OUT.
#
#   tests/gpu/run.sh prepare        on the build machine (Debian 12): build, make the relocatable
#                                   bundle and the Python client into .gpu/ (carried to the GPU)
#   tests/gpu/run.sh                on the GPU machine (through the device tool), from the
#                                   repository root, with .gpu/ carried:
#       run(command="tests/gpu/run.sh", carry=[".gpu"])
#
# On the GPU machine it runs, in order: the kernel tests and the probe_score benchmark with its
# peers (bench/run_probe_score.sh), the two-process CUDA IPC tests (torch client, real server),
# and the end-to-end RPC benchmark (probe-bench against probe-sidecar and a bare gRPC echo, over a
# Unix socket and loopback TCP). Results: $OUT/*.json, *.md and logs; a summary is printed last.
# Environment: STEPS (default "kernels ipc rpc"), SWEEP (probe_score sweep, default full).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$root"
gpu="$root/.gpu"

if [[ "${1:-}" == prepare ]]; then
  set -e
  build="${BUILD_DIR:-$root/build}"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DPROBESIDECAR_BUILD_BENCH=ON \
    -DPython3_EXECUTABLE="$root/.venv/bin/python" >/dev/null
  cmake --build "$build" -j "$(nproc)" --target probe-sidecar probe-client probe-bench \
    probe-echo-server probe_score_gpu_test probe_score_cpu_test probe-score-bench demo_probe_set
  rm -rf "$gpu"
  deploy/bundle.sh "$build" "$gpu/bundle" probe-sidecar probe-client probe-bench \
    probe-echo-server probe_score_gpu_test probe_score_cpu_test probe-score-bench
  # The Python client with its generated stubs, pure Python: runs on the GPU machine's own
  # grpcio/protobuf/torch.
  "$root/.venv/bin/python" -m pip install -q --no-deps --no-build-isolation \
    --target "$gpu/python" ./client/python
  git rev-parse --short=12 HEAD >"$gpu/git" 2>/dev/null || echo unknown >"$gpu/git"
  echo "prepared $gpu ($(du -sh "$gpu" | cut -f1)); on the GPU machine: tests/gpu/run.sh"
  exit 0
fi

out="${OUT:-$root/gpu-results}"
mkdir -p "$out"
[[ -d "$gpu/bundle" ]] || { echo "no .gpu/bundle: run 'tests/gpu/run.sh prepare' first" >&2; exit 1; }
export PATH="$gpu/bundle/bin:$PATH"
export PYTHONPATH="$gpu/python:$root/tests/python${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
export PROBE_SIDECAR_BIN="$gpu/bundle/bin/probe-sidecar" PROBE_CLIENT_BIN="$gpu/bundle/bin/probe-client"
git_hash="$(cat "$gpu/git")"
export GIT="$git_hash"
steps="${STEPS:-kernels ipc rpc}"
summary=()
status=0
# At most 8 files come back from the device: the JSONs and tables, the two logs that explain
# them, and run.log for everything else.
log="$out/run.log"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,temperature.gpu --format=csv \
  >"$log" 2>&1 || true

if [[ " $steps " == *" kernels "* ]]; then
  echo "== kernels: tests + probe_score benchmark + peers"
  # run_probe_score.sh expects BUILD/bin; the bundle has that layout.
  SWEEP="${SWEEP:-full}" bash bench/run_probe_score.sh "$gpu/bundle" "$out" >>"$log" 2>&1
  rc=$?
  ((rc)) && status=1
  summary+=("kernels+bench: exit $rc (see probe_score_run.log, probe_score.md)")
fi

if [[ " $steps " == *" ipc "* ]]; then
  echo "== ipc: two-process tests (torch client, real server)"
  python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_gpu_ipc.py tests/python/test_gpu_metrics.py \
    >"$out/ipc_tests.log" 2>&1
  rc=$?
  ((rc)) && status=1
  summary+=("ipc tests: exit $rc: $(tail -1 "$out/ipc_tests.log")")
fi

if [[ " $steps " == *" rpc "* ]]; then
  echo "== rpc: end-to-end benchmark"
  tmp="$(mktemp -d)"
  probe-sidecar --backend=cuda --listen="unix:$tmp/s.sock" --listen=127.0.0.1:0 \
    --metrics-listen=127.0.0.1:0 --max-message-bytes=256Mi --warmup-rows=1,64,1024,8192 \
    --cuda-workers=4 >"$tmp/server.log" 2>&1 &
  server=$!
  probe-echo-server --listen="unix:$tmp/e.sock" --listen=127.0.0.1:0 2>"$tmp/echo.log" &
  echo_server=$!
  for _ in $(seq 300); do
    grep -q "serving on" "$tmp/server.log" && grep -q "serving on" "$tmp/echo.log" && break
    sleep 0.1
  done
  tcp="$(grep -o 'serving on [^;]*' "$tmp/server.log" | grep -o '127\.0\.0\.1:[0-9]*' | head -1)"
  metrics="$(grep -o 'metrics on 127\.0\.0\.1:[0-9]*' "$tmp/server.log" | grep -o '127.*')"
  echo_tcp="$(grep -o '127\.0\.0\.1:[0-9]*' "$tmp/echo.log" | head -1)"
  rc=0
  # Where one client's small requests spend their time on the server (stage histogram means).
  # These two runs write no results (so need no receipt).
  probe-bench --target="unix:$tmp/s.sock" --transport=uds --rows=1,64 --probes=1 --concurrency=1 \
    --modes=score_ipc --seconds=1 --quiet >/dev/null 2>&1
  python3 bench/stage_means.py "$metrics" --save "$tmp/metrics_c0.txt"
  probe-bench --target="unix:$tmp/s.sock" --transport=uds --rows=1 --probes=1 --concurrency=1 \
    --modes=score_ipc --seconds=2 --quiet >/dev/null 2>&1
  python3 bench/stage_means.py "$metrics" --since "$tmp/metrics_c0.txt" \
    --title "server-side stage means, 1 client, R=1 P=1, uds" >>"$log" 2>&1
  python3 bench/stage_means.py "$metrics" --save "$tmp/metrics_c1.txt"
  receipt=(--git="$git_hash" ${ALLOW_DIRTY:+--allow-dirty})
  for transport in uds tcp; do
    if [[ $transport == uds ]]; then t="unix:$tmp/s.sock" e="unix:$tmp/e.sock"; else t="$tcp" e="$echo_tcp"; fi
    # Closed loop, unary and ScoreStream next to the bare unary and bidi echo.
    probe-bench --target="$t" --echo-target="$e" --transport=$transport "${receipt[@]}" \
      --modes=echo,echo_stream,score_ipc,score_inline,score_stream_ipc --quiet \
      --out="$tmp/rpc_$transport.json" --seconds="${RPC_SECONDS:-1.5}" \
      >>"$log" 2>&1 || rc=1
    # Open loop, small requests: latency against offered load (the PNG).
    probe-bench --target="$t" --echo-target="$e" --transport=$transport "${receipt[@]}" \
      --modes=echo,score_ipc,score_stream_ipc --rows=1 --probes=1 --rate=1000,5000,10000,20000 \
      --quiet --out="$tmp/rpc_open_$transport.json" --seconds="${RPC_SECONDS:-1.5}" \
      >>"$log" 2>&1 || rc=1
  done
  python3 bench/stage_means.py "$metrics" --since "$tmp/metrics_c1.txt" \
    --title "server-side stage means over the whole sweep" >>"$log" 2>&1
  kill -TERM $server 2>/dev/null
  wait $server 2>/dev/null
  { echo "== rpc server log"; tail -30 "$tmp/server.log"; } >>"$log"
  # The same small requests against a server that times no GPU stage (--gpu-timing-every=0):
  # what the event nodes cost.
  probe-sidecar --backend=cuda --listen="unix:$tmp/u.sock" --metrics-listen=none \
    --gpu-timing-every=0 --warmup-rows=1,64 >"$tmp/untimed.log" 2>&1 &
  server=$!
  for _ in $(seq 300); do grep -q "serving on" "$tmp/untimed.log" && break; sleep 0.1; done
  probe-bench --target="unix:$tmp/u.sock" --transport=uds "${receipt[@]}" --rows=1,64 \
    --probes=1,16 --concurrency=1 --modes=score_ipc --server-label=untimed --quiet \
    --out="$tmp/rpc_untimed.json" --seconds="${RPC_SECONDS:-1.5}" >>"$log" 2>&1 || rc=1
  kill -TERM $server $echo_server 2>/dev/null
  wait $server $echo_server 2>/dev/null
  python3 bench/report_rpc.py "$tmp"/rpc_{uds,tcp,open_uds,open_tcp,untimed}.json \
    ${ALLOW_DIRTY:+--allow-dirty} --out "$out/rpc_score.json" \
    --md "$out/rpc_score.md" --command "tests/gpu/run.sh (STEPS=rpc)" >>"$log" 2>&1 || rc=1
  python3 bench/plot_rpc.py "$out/rpc_score.json" --png "$out/rpc_score.png" >>"$log" 2>&1 || rc=1
  ((rc)) && status=1
  summary+=("rpc bench: exit $rc (rpc_score.json, rpc_score.md, rpc_score.png)")
fi

echo "== summary" | tee -a "$log"
printf '%s\n' "${summary[@]}" | tee -a "$log"
[[ -f "$out/probe_score.md" ]] && sed -n '/^## Targets/,/^## Crossovers/p' "$out/probe_score.md" | head -25
[[ -f "$out/rpc_score.md" ]] && sed -n '/^## Targets/,$p' "$out/rpc_score.md" | head -25
exit $status
