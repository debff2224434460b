"""One worker of the decode-loop benchmark: the process that plays the inference server.

run.py starts one worker per MPS setting, after the MPS control daemon (when there is one) and
after the sidecar, with the daemon's environment. The worker builds the model, then for every
batch: prefills, captures the graphs, and runs every variant (variants.py) in both modes,
interleaved and repeated, within its time budget. It appends one JSON line per event to --out
(meta, run, note, error) and flushes each, so a worker stopped at its deadline leaves what it
measured.
"""

from __future__ import annotations

import argparse
import ctypes
import gc
import json
import os
import sys
import time

import torch

import model as model_lib
import variants
from schedule import plan, rotate

PROMPT_LEN = 512
PROBES = 16
PROBE_SET = "decode_loop_p16"
RESERVE_S = 8.0  # kept back from the deadline for teardown
# Untimed steps per variant before the timed runs of a (batch, mode): the first requests
# register buffers and events and capture the sidecar's graphs.
WARM_STEPS = {"graph": 16, "eager": 4}


class Emitter:
    def __init__(self, path: str, mps: bool):
        self._file = open(path, "a")
        self.mps = mps

    def __call__(self, kind: str, **fields) -> None:
        self._file.write(json.dumps({"type": kind, "mps": self.mps, **fields}) + "\n")
        self._file.flush()


class CudaDevice:
    """The CUDA pieces the loop needs (cpu_fakes.CpuDevice stands in for them in a dry run)."""

    name = "cuda"

    def event(self):
        return torch.cuda.Event(enable_timing=True)

    def current_stream(self):
        return torch.cuda.current_stream()

    def synchronize(self) -> None:
        torch.cuda.synchronize()

    def capture(self, decoder, slot, tap, pool, step=None):
        return decoder.capture(slot, tap, pool, step)

    def capturing(self) -> bool:
        return torch.cuda.is_current_stream_capturing()

    def profile(self, graph, replays: int = 20) -> dict:
        """GPU time per kernel over `replays` replays of `graph` (torch.profiler, CUPTI):
        {"replays", "kernels": [[name, count per replay, us per replay], ...] by time}."""
        from torch.profiler import ProfilerActivity, profile

        for _ in range(3):
            graph.replay()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(replays):
                graph.replay()
            torch.cuda.synchronize()
        totals: dict[str, list] = {}
        for event in prof.events():
            if event.device_type.name != "CUDA":
                continue
            entry = totals.setdefault(event.name, [0, 0.0])
            entry[0] += 1
            entry[1] += event.device_time
        kernels = sorted(([name, round(c / replays, 2), round(us / replays, 2)]
                          for name, (c, us) in totals.items()), key=lambda k: -k[2])
        return {"replays": replays, "kernels": kernels}

    def description(self) -> str:
        return torch.cuda.get_device_name()


def driver_mps_enabled(ordinal: int = 0):
    """Whether this process's contexts go through MPS, as the driver says
    (CU_DEVICE_ATTRIBUTE_MPS_ENABLED, 133 in CUDA 13's cuda.h); None if it cannot be asked."""
    try:
        cuda = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    device, value = ctypes.c_int(), ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
        return None
    if cuda.cuDeviceGetAttribute(ctypes.byref(value), 133, device) != 0:
        return None
    return bool(value.value)


def measure_ceilings() -> dict:
    """The copy and bf16 matrix ceilings of this GPU, measured now: a 1 GiB device-to-device copy
    (bytes read + written) and an 8192^3 bf16 matrix product on random data."""

    def seconds(fn, reps: int = 10) -> float:
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) * 1e-3 / reps

    def copy_seconds() -> float:
        src = torch.randn(1 << 28, device="cuda")  # 1 GiB of float32
        dst = torch.empty_like(src)
        return seconds(lambda: dst.copy_(src))

    def gemm_seconds(n: int) -> float:
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
        return seconds(lambda: a @ b)

    n = 8192
    ceilings = dict(copy_gbps=round(2 * (1 << 30) / copy_seconds() / 1e9, 1),
                    bf16_tflops=round(2 * n**3 / gemm_seconds(n) / 1e12, 1))
    torch.cuda.empty_cache()  # the buffers are gone: give their memory back for the decode loop
    return ceilings


def probe_weights(hidden: int, device, seed: int):
    generator = torch.Generator().manual_seed(seed)
    weight = (torch.randn(PROBES, hidden, generator=generator) / hidden**0.5).to(torch.bfloat16)
    bias = (torch.randn(PROBES, generator=generator) * 0.1).to(torch.bfloat16)
    return weight.to(device), bias.to(device)


def probe_set_bytes(weight, bias) -> bytes:
    from safetensors.torch import save

    return save({"weight": weight.cpu().contiguous(), "bias": bias.cpu().contiguous()},
                metadata={"activation": "none"})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--target", required=True, help="the sidecar (unix:///path)")
    parser.add_argument("--mps", type=int, choices=(0, 1), required=True,
                        help="whether this worker runs under MPS (checked against the server)")
    parser.add_argument("--batches", default="1,8,32,64")
    parser.add_argument("--modes", default="graph")
    parser.add_argument("--variants", default=",".join(variants.DEFAULT),
                        help="comma-separated (variants.py): none, in_process, tap_k<K>, "
                             "tap_k<K>_graph, tap_k<K>_host, sidecar_sync, sidecar_async")
    parser.add_argument("--profile", action="store_true",
                        help="profile the plain graphed step's kernels (torch.profiler) at the "
                             "first batch")
    parser.add_argument("--steps", type=int, default=256)
    parser.add_argument("--graph-reps", type=int, default=3)
    parser.add_argument("--eager-reps", type=int, default=3)
    parser.add_argument("--deadline", type=float, required=True, help="time.time() to end by")
    parser.add_argument("--ceilings", action="store_true", help="measure the ceilings first")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", required=True, help="JSON lines, appended")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="a tiny model on the CPU with stand-ins for CUDA and the sidecar")
    args = parser.parse_args()
    emit = Emitter(args.out, bool(args.mps))
    try:
        return run(args, emit)
    except Exception as error:  # recorded, so that the report says why the data stops here
        emit("error", where="worker", message=f"{type(error).__name__}: {error}")
        raise


def run(args, emit) -> int:
    batches = [int(b) for b in args.batches.split(",")]
    modes = [m for m in ("graph", "eager") if m in args.modes.split(",")]
    if args.cpu_dry_run:
        import cpu_fakes

        device, shape, where, dtype = cpu_fakes.CpuDevice(), model_lib.TINY, "cpu", torch.bfloat16
        connect = lambda: cpu_fakes.FakeTorchClient(mps=bool(args.mps))  # noqa: E731
        worker_mps = bool(args.mps)
    else:
        from probe_sidecar.torch import TorchClient

        device, shape, where, dtype = CudaDevice(), model_lib.LLAMA_1B, "cuda", torch.bfloat16
        connect = lambda: TorchClient(args.target)  # noqa: E731
        torch.cuda.init()
        worker_mps = driver_mps_enabled(torch.cuda.current_device())

    client = connect()
    info = client.client.server_info()
    emit("meta", what="server", server_mps=info.mps, worker_mps=worker_mps, backend=info.backend,
         version=info.version, server_git=info.git_commit, device=info.device_name, pid=os.getpid())
    if info.mps != bool(args.mps) or (worker_mps is not None and worker_mps != bool(args.mps)):
        emit("error", where="mps",
             message=f"expected mps={bool(args.mps)}, the server says {info.mps} and this "
                     f"worker's driver says {worker_mps}: refusing to label the results")
        return 3
    if args.ceilings and not args.cpu_dry_run:
        emit("meta", what="ceilings", **measure_ceilings())

    start = time.perf_counter()
    model = model_lib.build(shape, where, dtype, args.seed)
    weight, bias = probe_weights(model.config.hidden_size, where, args.seed + 1)
    client.client.load_probe_set(PROBE_SET, data=probe_set_bytes(weight, bias), replace=True)
    client.close()
    emit("meta", what="model", device=device.description(), params=model_lib.parameter_count(model),
         config={k: shape[k] for k in ("hidden_size", "num_hidden_layers", "num_attention_heads",
                                       "num_key_value_heads", "intermediate_size", "vocab_size")},
         dtype="bf16", prompt_len=PROMPT_LEN, probes=PROBES, attention=model_lib.ATTENTION,
         build_s=round(time.perf_counter() - start, 2), torch=torch.__version__)

    for i, batch in enumerate(batches):
        left = args.deadline - time.time() - RESERVE_S
        if left <= 0:
            emit("note", message=f"batch {batch} skipped: the worker's time is up")
            continue
        share_end = time.time() + left / (len(batches) - i)
        run_batch(args, emit, device, model, weight, bias, batch, modes, share_end, connect,
                  server_mps=info.mps, worker_mps=worker_mps)
    emit("meta", what="done")
    return 0


def run_batch(args, emit, device, model, weight, bias, batch, modes, share_end, connect,
              **labels) -> None:
    # A fresh client (and session) per batch: its buffers are new tensors, and the session's end
    # releases the previous batch's registrations.
    client = connect()
    start = time.perf_counter()
    decoder = model_lib.Decoder(model, batch, PROMPT_LEN, args.steps, ring=2,
                                seed=args.seed + batch)
    where = decoder.hidden.device
    scoring = variants.Scoring(
        weight=weight, bias=bias, probe_set=PROBE_SET,
        rows=torch.arange(batch, dtype=torch.int32, device=where), rows_host=list(range(batch)),
        out=torch.full((2, batch, PROBES), float("nan"), dtype=torch.float32, device=where),
        local=torch.zeros(2, batch, PROBES, dtype=torch.bfloat16, device=where), client=client)
    in_process = scoring.in_process(decoder.hidden)
    chosen = [variants.parse(name) for name in args.variants.split(",")]
    for variant in chosen:
        if variant.impl == "tap":
            try:
                scoring.taps[variant.name] = client.tap(PROBE_SET, max_batch=batch,
                                                        window=variant.window,
                                                        submit=variant.submit)
            except Exception as error:
                emit("error", where=f"b={batch} {variant.name} tap",
                     message=f"{type(error).__name__}: {error}")
    chosen = [v for v in chosen if v.impl != "tap" or v.name in scoring.taps]
    emit("meta", what="prefill", batch=batch, seconds=round(time.perf_counter() - start, 2))
    for j, mode in enumerate(modes):
        graphs = None
        impls = [v for v in chosen if mode == "graph" or v.tap != "graph"]
        if mode == "graph":
            start = time.perf_counter()
            try:
                graphs, pool = {}, None
                hooks = {"plain": None, "in_process": in_process}
                for v in impls:
                    if v.tap == "graph":
                        hooks[v.name] = variants.graph_write(scoring.taps[v.name], decoder.hidden,
                                                             device.capturing)
                for key, hook in hooks.items():  # plain steps, in-process tap, captured writes
                    graphs[key] = []
                    for slot in range(decoder.hidden.shape[0]):
                        graph = device.capture(decoder, slot, hook, pool)
                        pool = pool or graph.pool()
                        graphs[key].append(graph)
            except Exception as error:
                emit("error", where=f"graph b={batch} capture",
                     message=f"{type(error).__name__}: {error}")
                continue
            emit("meta", what="capture", batch=batch,
                 seconds=round(time.perf_counter() - start, 2))
            if args.profile and batch == int(args.batches.split(",")[0]):
                try:
                    emit("profile", batch=batch, **device.profile(graphs["plain"][0]))
                except Exception as error:
                    emit("error", where=f"graph b={batch} profile",
                         message=f"{type(error).__name__}: {error}")
        stepper = variants.Stepper(decoder, mode, graphs, in_process)
        warm = {}
        for v in list(impls):
            steps = max(WARM_STEPS[mode], v.window or 0)  # a tap's first window too
            try:
                run = variants.timed_run(v, steps, stepper, scoring, device)
                warm[v.name] = max(run["wall_s"], run["total_us"] * 1e-6) / run["steps"]
            except Exception as error:
                emit("error", where=f"{mode} b={batch} {v.name} warm-up",
                     message=f"{type(error).__name__}: {error}")
                impls.remove(v)
        if not impls:
            continue
        wanted = args.graph_reps if mode == "graph" else args.eager_reps
        # This mode's part of what is left of the batch's share (graph mode leaves what it does
        # not use to eager mode).
        available = (share_end - time.time()) / (len(modes) - j)
        windows = [v.window for v in impls if v.window]
        steps, reps = plan(warm, [v.name for v in impls], args.steps, wanted, available,
                           multiple=max(windows, default=8))
        if steps < 8:
            emit("note", message=f"{mode} b={batch} skipped: no time left in this batch's share")
            continue
        if (steps, reps) != (args.steps, wanted):
            emit("note", message=f"{mode} b={batch}: {steps} steps x {reps} repeats to fit the "
                                 f"time budget")
        failed = set()
        for rep in range(reps):
            for v in rotate(impls, rep):
                if v.name in failed:
                    continue  # once is enough: a broken variant would only eat the budget
                try:
                    run = variants.timed_run(v, steps, stepper, scoring, device)
                except Exception as error:
                    emit("error", where=f"{mode} b={batch} {v.name} rep {rep}",
                         message=f"{type(error).__name__}: {error}")
                    failed.add(v.name)
                    continue
                emit("run", batch=batch, mode=mode, rep=rep, **labels, **run)
                progress(labels["server_mps"], mode, batch, rep, reps, run, batch)
        del stepper, graphs
    for tap in scoring.taps.values():
        tap.close()
    client.close()
    del decoder, scoring
    gc.collect()
    if device.name == "cuda":
        torch.cuda.empty_cache()


def progress(mps, mode, batch, rep, reps, run, tokens_per_step) -> None:
    mean_us = run["total_us"] / run["steps"]
    tokens_per_s = tokens_per_step / mean_us * 1e6
    line = (f"[mps={'on' if mps else 'off'} {mode:5} b={batch:<2} rep {rep + 1}/{reps}] "
            f"{run['variant']:<19} {mean_us:9.1f} us/step {tokens_per_s:9.0f} tok/s")
    if "call_us" in run:
        calls = run["call_us"]
        line += f"  decode-thread {sum(calls) / len(calls):.1f} us/step wall"
        cpu = run.get("call_cpu_us") or [0]
        line += f" {sum(cpu) / len(cpu):.1f} cpu"
    if run.get("windows"):
        latencies = sorted(w[1] for w in run["windows"] if w[1] is not None)
        if latencies:
            line += f"  window->scores p50 {latencies[len(latencies) // 2] * 1e3:.2f} ms"
    if run.get("window_errors"):
        line += f"  WINDOW ERRORS {run['window_errors'][:2]}"
    if "check" in run and not run["check"]["ok"]:
        line += f"  CHECK FAILED {run['check']}"
    print(line, flush=True)


if __name__ == "__main__":
    sys.exit(main())
