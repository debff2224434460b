#!/usr/bin/env python3
"""What a tap costs the decode thread's CPU, with nothing else in the way: each step's GPU work
(one small matrix product standing in for the decode step) is finished before the tap's calls
are timed, so no call can block on a full CUDA launch queue. In the decode-loop benchmark the
host runs far ahead of the GPU, and whichever call meets the full queue waits there (spinning:
CPU time that is the GPU's pace, not the call's cost); this measures the calls themselves.

    python3 bench/decode_loop/host_cost.py --out-dir DIR     # needs the sidecar binary and a GPU

Writes tap_host_cost.json and .md: per tap (window, write eager or captured in a graph), the CPU
time per step of the decode thread in write() and step() (mean, which amortises the window's
close, p50, p99), the close alone, and the close's profile (cProfile, where its time goes).
"""

from __future__ import annotations

import argparse
import cProfile
import datetime
import io
import json
import pathlib
import pstats
import shlex
import statistics
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))  # bench/: receipt.py

import receipt  # noqa: E402

from run import start_server, stop  # noqa: E402

PROBES, PROBE_SET = 16, "host_cost_p16"


def percentile(values, q):
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round((len(ordered) - 1) * q / 100)))]


def measure(torch, tap, hidden, graph, steps, window, sync) -> dict:
    """`steps` steps: the stand-in step (a graph replay that holds the write, or the product and
    then, timed, the eager write), then (timed) step()."""
    cpu = []
    for t in range(steps):
        if graph is not None:
            graph.replay()
        else:
            torch.mm(hidden, hidden.t()[:, :hidden.shape[0]])
        sync()
        start = time.thread_time()
        if graph is None:
            tap.write(hidden)
        tap.step()
        cpu.append((time.thread_time() - start) * 1e6)
    closes = cpu[window - 1::window]
    others = [c for i, c in enumerate(cpu) if (i + 1) % window]
    return {"cpu_us_per_step": {"mean": round(statistics.fmean(cpu), 2),
                                "p50": round(percentile(cpu, 50), 2),
                                "p99": round(percentile(cpu, 99), 2)},
            "close_cpu_us": {"p50": round(percentile(closes, 50), 2),
                             "p99": round(percentile(closes, 99), 2)},
            "other_steps_cpu_us": {"p50": round(percentile(others, 50), 2) if others else None},
            "steps": steps}


def profile_close(torch, tap, hidden, window, sync, closes: int = 20) -> str:
    profiler = cProfile.Profile()
    for _ in range(closes):
        for _ in range(window - 1):
            tap.write(hidden)
            tap.step()
        tap.write(hidden)
        sync()
        profiler.enable()
        tap.step()
        profiler.disable()
    out = io.StringIO()
    pstats.Stats(profiler, stream=out).sort_stats("tottime").print_stats(12)
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    return "\n".join(lines[:24])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True)
    parser.add_argument("--server", default="build/bin/probe-sidecar")
    parser.add_argument("--steps", type=int, default=512)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=2048)
    receipt.add_arguments(parser)
    args = parser.parse_args()
    identity = receipt.from_args(args)
    import os

    import torch
    from safetensors.torch import save

    from probe_sidecar.torch import TorchClient

    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="host-cost-"))
    server, target, problem = start_server(args.server, dict(os.environ), tmp)
    if problem:
        raise SystemExit(f"the sidecar did not start: {problem}")
    records, profiles = [], {}
    try:
        client = TorchClient(target)
        weight = (torch.randn(PROBES, args.hidden) / args.hidden**0.5).bfloat16()
        client.client.load_probe_set(PROBE_SET, replace=True, data=save(
            {"weight": weight, "bias": torch.zeros(PROBES).bfloat16()},
            metadata={"activation": "none"}))
        hidden = torch.randn(args.batch, args.hidden, device="cuda", dtype=torch.bfloat16)
        sync = torch.cuda.synchronize
        for window in (16, 64):
            for kind in ("eager", "graph"):
                tap = client.tap(PROBE_SET, max_batch=args.batch, window=window)
                graph = None
                if kind == "graph":
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph):
                        torch.mm(hidden, hidden.t()[:, :hidden.shape[0]])
                        tap.write(hidden)
                measure(torch, tap, hidden, graph, 2 * window, window, sync)  # warm-up
                result = measure(torch, tap, hidden, graph, args.steps, window, sync)
                if kind == "eager":
                    profiles[f"K={window}"] = profile_close(torch, tap, hidden, window, sync)
                tap.close()
                records.append({"bench": "tap_host_cost", "impl": "tap", "dtype": "bf16",
                                "shape": {"window": window, "tap": kind, "batch": args.batch,
                                          "H": args.hidden, "P": PROBES},
                                "graph_us_p50": None, "eager_us_p50": None, **result})
                print(f"K={window:<3} {kind:5}  cpu/step mean {result['cpu_us_per_step']['mean']:7.2f}"
                      f" us  close p50 {result['close_cpu_us']['p50']:7.1f} us  other steps p50 "
                      f"{result['other_steps_cpu_us']['p50']} us", flush=True)
        client.close()
    finally:
        stop(server)
    doc = {"device": torch.cuda.get_device_name(), "git": identity,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join(shlex.quote(a) for a in ["python3", *sys.argv]),
           "ceilings": {"copy_gbps": None, "bf16_tflops": None},
           "records": records, "close_profiles": profiles}
    (out_dir / "tap_host_cost.json").write_text(json.dumps(doc, indent=1) + "\n")
    lines = ["# What a tap costs the decode thread (CPU)", "",
             f"Device: {doc['device']}; git {identity}; {doc['date']}. Command: "
             f"`{doc['command']}`. Ceilings: not applicable (host time only).", "",
             __doc__.split("\n\n")[0].replace("\n", " "), "",
             "| K | write | CPU µs/step (mean) | p50 | p99 | close p50 / p99 µs | other steps p50 µs |",
             "|---|---|---|---|---|---|---|"]
    for r in records:
        s, c = r["shape"], r["cpu_us_per_step"]
        lines.append(f"| {s['window']} | {s['tap']} | {c['mean']} | {c['p50']} | {c['p99']} | "
                     f"{r['close_cpu_us']['p50']} / {r['close_cpu_us']['p99']} | "
                     f"{r['other_steps_cpu_us']['p50']} |")
    for name, text in profiles.items():
        lines += ["", f"## Where a close's time goes ({name}, eager write; cProfile, 20 closes)", "",
                  "```", text, "```"]
    (out_dir / "tap_host_cost.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
