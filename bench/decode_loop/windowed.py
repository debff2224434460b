#!/usr/bin/env python3
"""What a tap costs a CUDA-graphed decode loop, measured so that 0.3% shows: the steps themselves,
timed by CUDA events, the loop without scoring and the loop with it interleaved a few windows at
a time on the same decoder state (interleave.py has the arithmetic), no MPS.

    python3 bench/decode_loop/windowed.py --out-dir "$OUT"      # about 7 min on an H200

Two taps, each against the same kind of loop without it:
  compiled  the decode forward compiled by torch.compile (Inductor), the tap's operator
            (probe_sidecar.tap_op) traced into it on the final norm's last position, the step
            captured in a CUDA graph; against the same compiled forward without the operator.
  graph     the eager forward captured in a CUDA graph with the tap's write captured after it
            (TorchClient.tap's write()); against the same graph without the write.
The same ~1.2B random Llama as run.py (Llama 3.2 1B's shape, bf16), P=16 probes on the real
sidecar (--backend=cuda, its own context: no MPS), batches 1/8/32/64, K=16 and 64. Per (tap,
batch, K): blocks of `--windows-per-block` windows, none / tapped / none / ... (2 x
--sandwiches + 1 blocks), the decoder reset at each block's start so that every block decodes
the same tokens; kept per sandwich, then its median and a bootstrap 95% interval; where the
extra time lands in a window (the write in every step; the close and the sidecar's Score after
it); the GPU time from a window's close to its scores in host memory; one window of every tap
checked against float64; and the kernels one tapped step adds (torch.profiler, first batch).

Writes decode_loop_windowed.json and .md into --out-dir after every measurement, so a run cut
short leaves what it measured. Needs the probe-sidecar binary ($PROBE_SIDECAR_BIN or --server),
the Python client, torch with CUDA, transformers and a receipt (bench/receipt.py).
--cpu-dry-run: the tiny model on the CPU with the real sidecar's CPU backend and CPU taps, the
compiled forward uncompiled, CPU clocks for events: it runs every line and checks the scores,
and times nothing real.
"""

from __future__ import annotations

import argparse
import datetime
import os
import pathlib
import shlex
import sys
import tempfile
import time
import types

import torch

HERE = pathlib.Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))  # bench/: receipt.py

import receipt  # noqa: E402

import interleave  # noqa: E402
import model as model_lib  # noqa: E402
import run as run_lib  # noqa: E402
import variants  # noqa: E402
import windowed_report  # noqa: E402
import worker  # noqa: E402
from probe_sidecar import tap_op  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402

LAG_STEPS = 16  # the host runs at most this many steps ahead of the GPU (both loops alike)
WARM_WINDOWS = 2  # untimed windows of each tapped loop first: the sidecar captures its graphs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, type=pathlib.Path)
    parser.add_argument("--server", help="the probe-sidecar binary (default $PROBE_SIDECAR_BIN)")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--windows", default="16,64", help="K: steps per Score")
    parser.add_argument("--taps", default="compiled,graph")
    parser.add_argument("--sandwiches", type=int, default=6, help="tapped blocks per measurement")
    parser.add_argument("--windows-per-block", type=int, default=3,
                        help="windows per block (its first is not counted)")
    parser.add_argument("--budget-s", type=float, default=420.0,
                        help="no batch starts when less than its expected time is left")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cpu-dry-run", action="store_true")
    receipt.add_arguments(parser)
    args = parser.parse_args()
    identity = receipt.from_args(args)
    started = time.monotonic()
    server = args.server or os.environ.get("PROBE_SIDECAR_BIN")
    if not server:
        raise SystemExit("no probe-sidecar binary: --server or $PROBE_SIDECAR_BIN")
    dry = args.cpu_dry_run
    if dry:
        import cpu_fakes

        device, shape, where = cpu_fakes.CpuDevice(), model_lib.TINY, "cpu"
        flags = ["--backend=cpu", "--warmup-rows=none"]
    else:
        device, shape, where, flags = worker.CudaDevice(), model_lib.LLAMA_1B, "cuda", None
        # One compiled forward per (batch, tap): more than Dynamo keeps per code object by default.
        for name in ("cache_size_limit", "recompile_limit", "accumulated_cache_size_limit",
                     "accumulated_recompile_limit"):
            if hasattr(torch._dynamo.config, name):
                setattr(torch._dynamo.config, name, 256)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"bench": "decode_loop_windowed", "git": identity,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": "windowed.py " + shlex.join(sys.argv[1:]), "complete": False,
           "records": [], "profiles": [], "notes": []}
    tmp = pathlib.Path(tempfile.mkdtemp())
    env = dict(os.environ)
    process, target, problem = run_lib.start_server(server, env, tmp, flags)
    if problem:
        raise SystemExit(f"probe-sidecar: {problem}")
    try:
        client = TorchClient(target)
        info = client.client.server_info()
        doc.update(device=info.device_name if not dry else device.description(),
                   server_mps=info.mps, torch=torch.__version__, probes=worker.PROBES,
                   prompt_len=worker.PROMPT_LEN)
        if info.mps:
            raise SystemExit("the sidecar is an MPS client: this benchmark measures without MPS")
        if not dry:
            doc["ceilings"] = worker.measure_ceilings()
        model = model_lib.build(shape, where, torch.bfloat16, args.seed)
        weight, bias = worker.probe_weights(model.config.hidden_size, where, args.seed + 1)
        client.client.load_probe_set(worker.PROBE_SET, data=worker.probe_set_bytes(weight, bias),
                                     replace=True)
        bench = Bench(args, doc, device, client, model, weight, bias, dry)
        batches = [int(b) for b in args.batches.split(",")]
        for i, batch in enumerate(batches):
            left = args.budget_s - (time.monotonic() - started)
            if bench.batch_s and left < bench.batch_s:
                doc["notes"].append(f"batch {batch} and after not measured: {left:.0f} s left of "
                                    f"the budget, a batch took {bench.batch_s:.0f} s")
                break
            bench.batch(batch, profile=i == 0)
            windowed_report.write(doc, args.out_dir)
        doc["complete"] = True
        client.close()
    finally:
        run_lib.stop(process)
        doc["sidecar_log_tail"] = run_lib.tail(tmp / "sidecar.log", 5)
        windowed_report.write(doc, args.out_dir)
    print(windowed_report.markdown(doc), flush=True)
    return 1 if windowed_report.failed(doc) else 0


class Bench:
    def __init__(self, args, doc, device, client, model, weight, bias, dry: bool):
        self.args, self.doc, self.device, self.client = args, doc, device, client
        self.model, self.weight, self.bias, self.dry = model, weight, bias, dry
        self.windows = [int(k) for k in args.windows.split(",")]
        self.taps = args.taps.split(",")
        self.batch_s = 0.0

    def batch(self, batch: int, profile: bool) -> None:
        started = time.monotonic()
        steps = self.args.windows_per_block * max(self.windows)
        decoder = model_lib.Decoder(self.model, batch, worker.PROMPT_LEN, steps, ring=2,
                                    seed=self.args.seed + batch)
        for kind in self.taps:
            t0 = time.monotonic()
            base, tapped, taps = self.capture(decoder, kind, batch)
            self.doc["notes"].append(f"batch {batch} {kind}: built and captured in "
                                     f"{time.monotonic() - t0:.0f} s")
            for window in self.windows:
                tap = taps[window]
                record = self.measure(decoder, base, tapped[window], tap, window)
                record.update(shape={"batch": batch, "window": window, "tap": kind,
                                     "mode": "graph", "interleave": "window", "mps": False},
                              variant=f"tap_k{window}_{kind}",
                              check=self.check(decoder, tapped[window], tap, window, batch))
                self.doc["records"].append(record)
                windowed_report.write(self.doc, self.args.out_dir)
            if profile:
                self.doc["profiles"].append(self.profile(batch, kind, base, tapped))
            for tap in taps.values():
                tap.close()
            del base, tapped
        del decoder
        if not self.dry:
            torch.cuda.empty_cache()
        self.batch_s = max(self.batch_s, time.monotonic() - started)

    def new_tap(self, batch: int, window: int):
        where = {"device": "cpu"} if self.dry else {}
        return self.client.tap(worker.PROBE_SET, max_batch=batch, window=window,
                               dtype=self.model.dtype, **where)

    def capture(self, decoder, kind: str, batch: int):
        """(base graphs, {K: tapped graphs}, {K: tap}): two graphs (one per hidden slot) each."""
        device, compile = self.device, not self.dry
        taps = {k: self.new_tap(batch, k) for k in self.windows}

        def graphs(step=None, hook=None):
            pool, out = None, []
            for slot in range(decoder.hidden.shape[0]):
                out.append(device.capture(decoder, slot, hook, pool, step))
                pool = pool or out[-1].pool()
            return out

        if kind == "graph":
            base = graphs()
            tapped = {k: graphs(hook=variants.graph_write(tap, decoder.hidden, device.capturing))
                      for k, tap in taps.items()}
        elif kind == "compiled":
            base = graphs(decoder.compiled(None, compile))
            tapped = {}
            for k, tap in taps.items():
                tapped[k] = graphs(decoder.compiled(tap.ring.write_op, compile))
                # The capture's warm-up steps wrote the ring: back to the first window, where
                # the tap (no step() yet) is.
                tap_op.close_window(tap.ring.raw, tap.ring.layout, 1, 0)
        else:
            raise SystemExit(f"unknown tap {kind!r}: compiled or graph")
        decoder.reset()
        return base, tapped, taps

    def run_block(self, decoder, graphs, tap, steps: int, marks: list, lag: list) -> list[float]:
        """`steps` replays from the decoder's reset state, an event before each and after the
        last (into `marks`); `tap.step()` after each when tapped. Returns the host time of each
        step() call."""
        stream = self.device.current_stream()
        decoder.reset()
        calls = []
        for t in range(steps + 1):
            event = self.device.event()
            event.record(stream)
            marks.append(event)
            lag.append(event)
            if len(lag) > LAG_STEPS:
                lag.pop(0).synchronize()  # the GPU is still LAG_STEPS steps of work behind
            if t == steps:
                break
            graphs[t % 2].replay()
            if tap is not None:
                start = time.perf_counter()
                tap.step()
                calls.append((time.perf_counter() - start) * 1e6)
        return calls

    def measure(self, decoder, base, tapped, tap, window: int) -> dict:
        steps = self.args.windows_per_block * window
        lag: list = []
        for graphs, t in ((tapped, tap), (base, None)):  # warm-up: the sidecar's first Scores
            self.run_block(decoder, graphs, t, WARM_WINDOWS * window, [], lag)
        self.device.synchronize()
        tap.wait_delivered(120)
        list(tap.windows())
        before = types.SimpleNamespace(**vars(tap.stats))
        kinds = interleave.schedule(self.args.sandwiches)
        blocks, calls = [], []
        for kind in kinds:
            marks: list = []
            calls += self.run_block(decoder, tapped if kind == "scored" else base,
                                    tap if kind == "scored" else None, steps, marks, lag)
            blocks.append((kind, marks))
        self.device.synchronize()
        timed = [(kind, [marks[t].elapsed_time(marks[t + 1]) * 1e3
                         for t in range(len(marks) - 1)]) for kind, marks in blocks]
        tap.wait_delivered(120)
        windows = list(tap.windows())
        stats = {k: getattr(tap.stats, k) - getattr(before, k)
                 for k in ("windows_closed", "windows_delivered", "windows_failed",
                           "windows_lost", "windows_dropped")}
        return windowed_report.record(timed, window, decoder.batch, calls, windows, stats)

    def check(self, decoder, tapped, tap, window: int, batch: int) -> dict:
        """One window of the tapped loop, untimed, every step's hidden state kept: its scores
        against float64."""
        hidden = decoder.hidden
        kept = torch.empty((window, batch, hidden.shape[2]), dtype=hidden.dtype,
                           device=hidden.device)
        first = tap.stats.steps
        decoder.reset()
        for t in range(window):
            tapped[t % 2].replay()
            kept[t].copy_(hidden[t % 2])
            tap.step()
        self.device.synchronize()
        tap.wait_delivered(120)
        scores = torch.full((window, batch, self.weight.shape[0]), float("nan"))
        for w in tap.windows():
            for i in range(w.steps):
                t = w.first_step - first + i
                if 0 <= t < window and w.error is None:
                    scores[t].copy_(torch.from_numpy(w.scores[i, :batch]))
        result = variants._check(kept.cpu(), scores,
                                 types.SimpleNamespace(weight=self.weight.cpu(),
                                                       bias=self.bias.cpu()),
                                 variants.SIDECAR_TOL)
        result["rows"] = window * batch
        return result

    def profile(self, batch: int, kind: str, base, tapped) -> dict:
        """The kernels of one replay of each graph, and what a tapped step has that the plain
        one has not."""
        out = {"batch": batch, "tap": kind, "base": self.device.profile(base[0])}
        for k, graphs in tapped.items():
            out[f"k{k}"] = self.device.profile(graphs[0])
        return out


if __name__ == "__main__":
    sys.exit(main())
