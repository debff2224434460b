#!/usr/bin/env python3
"""Peers of the probe-scoring kernels, timed on the same shapes in the same run.

  torch_two_op  torch index_select + addmm (what a PyTorch user writes)
  torch_addmm   addmm on rows gathered beforehand (cuBLAS alone: the GEMM's own time)
  triton        a fused gather + tl.dot Triton kernel written for this benchmark, autotuned
                over a small set of block sizes and pipeline depths

Each under torch.cuda.CUDAGraph replay (rotating over 8 graphs, each with its own random rows
from a 2 GiB activation pool, so rows are not L2-resident) and eagerly. Device time: a sleep
kernel holds the stream while the timed work is queued, one event pair per repetition, median.
Writes the same results format as probe-score-bench (device, git, date, command, ceilings,
records). The results name their commit through bench/receipt.py: --git or $PROBE_SIDECAR_GIT (or
the checkout); a dirty tree is refused unless --allow-dirty.

  python3 bench/peers/probe_score_peers.py --out FILE.json --shapes-from probe_score_cuda.json
"""
import argparse
import datetime
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import receipt  # noqa: E402  (bench/receipt.py)

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

SLOTS = 8
POOL_BYTES = 2 << 30
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def _prune(configs, named_args, **kwargs):
    """Keep the block shapes that fit the problem (no 128-row tiles for 8 rows)."""
    R, P = named_args["R"], named_args["P"]
    is_fp32 = named_args["x_ptr"].dtype == torch.float32
    max_m = max(16, triton.next_power_of_2(R))
    max_n = max(16, triton.next_power_of_2(P))
    kept = []
    for c in configs:
        bm, bn, bk = c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"], c.kwargs["BLOCK_K"]
        if bm > max_m or bn > max_n:
            continue
        if is_fp32 and (bk > 64 or bm * bn > 64 * 128):
            continue  # fp32 tiles take twice the shared memory
        kept.append(c)
    return kept or [configs[0]]


_CONFIGS = [
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 256}, num_warps=4, num_stages=3),
    triton.Config({"BLOCK_M": 32, "BLOCK_N": 16, "BLOCK_K": 128}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 16, "BLOCK_K": 128}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 64, "BLOCK_K": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=4, num_stages=4),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 128, "BLOCK_K": 64}, num_warps=8, num_stages=3),
    triton.Config({"BLOCK_M": 128, "BLOCK_N": 256, "BLOCK_K": 64}, num_warps=8, num_stages=3),
]


@triton.autotune(configs=_CONFIGS, key=["R", "P", "H"],
                 prune_configs_by={"early_config_prune": _prune}, warmup=5, rep=20)
@triton.jit
def _probe_score_kernel(x_ptr, rows_ptr, w_ptr, b_ptr, out_ptr, R, P, H, stride_x, stride_w,
                        stride_o, IEEE: tl.constexpr, BLOCK_M: tl.constexpr,
                        BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    # out[R, P] = x[rows] @ W^T + b, gathered rows read once per probe tile.
    pid_n = tl.program_id(0)
    pid_m = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m = offs_m < R
    mask_n = offs_n < P
    rows = tl.load(rows_ptr + offs_m, mask=mask_m, other=0).to(tl.int64)
    x_rows = x_ptr + rows[:, None] * stride_x
    w_rows = w_ptr + offs_n[None, :].to(tl.int64) * stride_w
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, H, BLOCK_K):
        offs_k = k + tl.arange(0, BLOCK_K)
        mk = offs_k < H
        a = tl.load(x_rows + offs_k[None, :], mask=mask_m[:, None] & mk[None, :], other=0.0)
        b = tl.load(w_rows + offs_k[:, None], mask=mask_n[None, :] & mk[:, None], other=0.0)
        if IEEE:
            acc += tl.dot(a, b, input_precision="ieee")
        else:
            acc += tl.dot(a, b)
    bias = tl.load(b_ptr + offs_n, mask=mask_n, other=0.0)
    acc += bias[None, :]
    tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_o + offs_n[None, :], acc,
             mask=mask_m[:, None] & mask_n[None, :])


def triton_probe_score(x, rows, w, b, out):
    R, P, H = rows.numel(), w.shape[0], x.shape[1]
    grid = lambda meta: (triton.cdiv(P, meta["BLOCK_N"]), triton.cdiv(R, meta["BLOCK_M"]))
    _probe_score_kernel[grid](x, rows, w, b, out, R, P, H, x.stride(0), w.stride(0),
                              out.stride(0), IEEE=(x.dtype == torch.float32))
    return out


def median(v):
    v = sorted(v)
    n = len(v)
    return v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])


def time_median_us(fn, reps, warmup=3, spin_us_per_rep=8.0):
    """Median device time of fn() over reps, each between its own pair of events."""
    for i in range(warmup):
        fn(i)
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(reps)]
    # ~2 GHz: cycles = µs * 2000.
    torch.cuda._sleep(int((1000 + spin_us_per_rep * reps) * 2000))
    for i in range(reps):
        ev[i][0].record()
        fn(i)
        ev[i][1].record()
    torch.cuda.synchronize()
    return median([a.elapsed_time(b) * 1000.0 for a, b in ev])


def measure(make_fn, reps_hint_us):
    """Eager and graph-replay medians (µs) of make_fn(slot)() over SLOTS slots."""
    fns = [make_fn(k) for k in range(SLOTS)]
    once = time_median_us(lambda i: fns[i % SLOTS](), 3, warmup=1, spin_us_per_rep=60.0)
    reps = int(min(200, max(10, 40000.0 / max(once, 1.0))))
    eager = time_median_us(lambda i: fns[i % SLOTS](), reps, spin_us_per_rep=60.0)
    graphs = []
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for k in range(SLOTS):
            fns[k]()  # warm (and allocator state) on the capture stream
    torch.cuda.current_stream().wait_stream(stream)
    for k in range(SLOTS):
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fns[k]()
        graphs.append(g)
    torch.cuda.synchronize()
    graph = time_median_us(lambda i: graphs[i % SLOTS].replay(), reps, spin_us_per_rep=15.0)
    del graphs
    return graph, eager


def record(impl, dtype, R, H, P, graph_us, eager_us, ceilings, error=None):
    e = 4 if dtype == "fp32" else 2
    min_bytes = R * H * e + P * H * e + R * P * 4 + R * 4
    flops = 2.0 * R * H * P
    rec = {"bench": "probe_score", "impl": impl, "dtype": dtype,
           "shape": {"R": R, "H": H, "P": P}, "graph_us_p50": graph_us, "eager_us_p50": eager_us,
           "gbps": None, "tflops": None, "frac_copy": None, "frac_tflops": None}
    if graph_us:
        rec["gbps"] = min_bytes / (graph_us * 1e-6) / 1e9
        rec["tflops"] = flops / (graph_us * 1e-6) / 1e12
        rec["frac_copy"] = rec["gbps"] / ceilings["copy_gbps"]
        rec["frac_tflops"] = rec["tflops"] / ceilings["bf16_tflops"]
    if error:
        rec["error"] = error
    return rec


def ceilings_now(pool):
    half = POOL_BYTES // 2
    src, dst = pool[:half], pool[half:]
    us = time_median_us(lambda i: dst.copy_(src), 20, spin_us_per_rep=0.0)
    copy_gbps = 2.0 * half / (us * 1e-6) / 1e9
    n = 8192
    a = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    b = torch.rand(n, n, device="cuda", dtype=torch.bfloat16) - 0.5
    us = time_median_us(lambda i: torch.mm(a, b), 10, spin_us_per_rep=0.0)
    return {"copy_gbps": copy_gbps, "bf16_tflops": 2.0 * n ** 3 / (us * 1e-6) / 1e12}


def check_triton(x, rows, w, b):
    """The Triton peer must compute the right thing before it is timed."""
    out = torch.empty(rows.numel(), w.shape[0], device="cuda", dtype=torch.float32)
    triton_probe_score(x, rows, w, b, out)
    ref = torch.addmm(b.double(), x[rows.long()].double(), w.double().t())
    err = ((out.double() - ref).norm() / ref.norm()).item()
    tol = 1e-5 if x.dtype == torch.float32 else 1e-3
    if not err <= tol:
        raise RuntimeError(f"triton peer relative error {err:.3e} > {tol}")
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes-from", help="results JSON whose (dtype, R, H, P) to time")
    receipt.add_arguments(ap)
    args = ap.parse_args()
    git = receipt.from_args(args)  # before any measuring: refuse what could not be written

    if args.shapes_from and os.path.exists(args.shapes_from):
        with open(args.shapes_from) as f:
            src = json.load(f)
        shapes = sorted({(r["dtype"], r["shape"]["R"], r["shape"]["H"], r["shape"]["P"])
                         for r in src["records"]},
                        key=lambda s: (list(DTYPES).index(s[0]), s[2], s[3], s[1]))
    else:
        shapes = [("bf16", R, 4096, P) for R in (1, 64, 8192) for P in (1, 16, 1024)]

    torch.manual_seed(0)
    pool = torch.empty(POOL_BYTES, dtype=torch.uint8, device="cuda")
    ceilings = ceilings_now(pool)
    print(f"device {torch.cuda.get_device_name()}: copy {ceilings['copy_gbps']:.0f} GB/s, "
          f"bf16 GEMM {ceilings['bf16_tflops']:.0f} TFLOP/s", flush=True)

    records = []
    t0 = time.time()
    filled = None
    print(f"{'dtype':5} {'R':>5} {'H':>5} {'P':>5}  {'impl':14} {'graph_us':>10} {'eager_us':>10}")
    for dtype, R, H, P in shapes:
        tdt = DTYPES[dtype]
        e = 4 if dtype == "fp32" else 2
        T = POOL_BYTES // (H * e)
        x = pool.view(tdt)[: T * H].view(T, H)
        if filled != dtype:
            x.uniform_(-1.0, 1.0)
            filled = dtype
        gen = torch.Generator(device="cuda")
        gen.manual_seed(R * 7 + H * 3 + P)
        rows = [torch.randint(0, T, (R,), device="cuda", generator=gen, dtype=torch.int64)
                for _ in range(SLOTS)]
        rows32 = [r.to(torch.int32) for r in rows]
        w = (torch.rand(P, H, device="cuda", dtype=torch.float32) - 0.5).mul_(
            2.0 / math.sqrt(H)).to(tdt)
        b = (torch.rand(P, device="cuda", dtype=torch.float32) - 0.5)
        b_t = b.to(tdt)
        gathered = [x.index_select(0, r) for r in rows]
        out = torch.empty(R, P, device="cuda", dtype=torch.float32)

        impls = {
            "torch_two_op": lambda k: (lambda: torch.addmm(b_t, x.index_select(0, rows[k]), w.t())),
            "torch_addmm": lambda k: (lambda: torch.addmm(b_t, gathered[k], w.t())),
            "triton": lambda k: (lambda: triton_probe_score(x, rows32[k], w, b, out)),
        }
        for impl, make in impls.items():
            try:
                if impl == "triton":
                    check_triton(x, rows32[0], w, b)
                g, ea = measure(make, 0)
                records.append(record(impl, dtype, R, H, P, g, ea, ceilings))
                print(f"{dtype:5} {R:5} {H:5} {P:5}  {impl:14} {g:10.2f} {ea:10.2f}", flush=True)
            except Exception as ex:  # record the failure, keep the other peers
                msg = f"{type(ex).__name__}: {ex}"[:300]
                records.append(record(impl, dtype, R, H, P, None, None, ceilings, error=msg))
                print(f"{dtype:5} {R:5} {H:5} {P:5}  {impl:14} FAILED {msg}", flush=True)
        del gathered, w, b, b_t, out
    print(f"peers took {time.time() - t0:.1f} s", flush=True)

    doc = {"device": torch.cuda.get_device_name(), "git": git,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "ceilings": ceilings, "records": records}
    with open(args.out, "w") as f:
        json.dump(doc, f, indent=1)


if __name__ == "__main__":
    main()
