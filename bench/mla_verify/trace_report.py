"""Where the sm_90a MLA verify kernels' cycles go, from their in-kernel timestamp traces.

  python3 trace_report.py DIR [--out FILE.md] [--json FILE.json]

Reads every DIR/trace_h<h>_s<s>_b<b>_l<len>_<impl>.bin that `mla-verify-bench --trace-dir DIR`
wrote (a build with -DPROBESIDECAR_MLA_TRACE=ON; the format is in
kernels/mla_verify/mla_verify_trace.h) and prints, per trace and warpgroup, the cycles of one step
(a page, or a pair of pages for the page-pair schedule) averaged over the blocks, split into the
waits the kernel recorded: for a page's TMA boxes (kv), for the request's Q (q), for the other
warpgroup at a named barrier (peer), for its own wgmma (mma), the epilogue of finished requests,
and the rest (issuing wgmma and TMA, softmax, rescaling: the warpgroup's own work). Plain Python 3
with numpy: runs on the GPU machine next to the benchmark.
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import struct
import sys

import numpy as np

HEADER = struct.Struct("<8si7i")  # magic, version, max_blocks, events, h_q, s_q, batch, len, khz
EVENTS = {0: "step", 1: "kv_begin", 2: "kv_end", 3: "q_begin", 4: "q_end", 5: "peer_begin",
          6: "peer_end", 7: "mma_begin", 8: "mma_end", 9: "issue", 10: "epi_begin", 11: "epi_end",
          12: "done"}
WAITS = {1: "kv", 3: "q", 5: "peer", 7: "mma", 10: "epilogue"}  # begin code -> name (end = +1)
NAME = re.compile(r"trace_h(\d+)_s(\d+)_b(\d+)_l(\d+)_(.+)\.bin$")


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    magic, version, blocks, events, h, s, b, length, khz = HEADER.unpack_from(raw)
    if magic != b"MLATRACE" or version != 1:
        raise ValueError(f"{path}: not a version-1 MLA trace")
    data = np.frombuffer(raw, dtype=np.uint32, offset=HEADER.size)
    data = data[: blocks * 2 * events * 2].reshape(blocks, 2, events, 2)
    return {"h_q": h, "s_q": s, "batch": b, "len": length, "khz": khz}, data


def warpgroup_summary(rows):
    """rows: [n, 2] uint32 of one warpgroup (pair 0 excluded). Cycles per wait kind, steps."""
    t = rows[:, 0].astype(np.int64)
    t = t + np.concatenate([[0], np.cumsum(np.diff(t) < 0)]) * (1 << 32)  # 32-bit wrap
    code = (rows[:, 1] >> 24).astype(np.int64)
    step = (rows[:, 1] & 0xFFFFFF).astype(np.int64)
    out = {k: 0 for k in WAITS.values()}
    out["nested"] = 0  # waits inside an epilogue (counted in both)
    opened = {}
    for ti, ci in zip(t.tolist(), code.tolist()):
        if ci in WAITS:
            opened[ci] = ti
        elif ci - 1 in WAITS and ci - 1 in opened:
            took = ti - opened.pop(ci - 1)
            out[WAITS[ci - 1]] += took
            if ci - 1 != 10 and 10 in opened:
                out["nested"] += took
    starts = t[code == 0]
    done = t[code == 12]
    if len(starts) == 0 or len(done) == 0:
        return None
    out["total"] = int(done[-1] - starts[0])
    out["steps"] = int(step.max()) + 1
    step_times = np.diff(starts)
    out["step_median"] = float(np.median(step_times)) if len(step_times) else float(out["total"])
    return out


def summarise(meta, data):
    per_wg = []
    for w in range(2):
        acc, n = {}, 0
        for blk in range(data.shape[0]):
            count = int(data[blk, w, 0, 0])
            if count <= 1:
                continue
            s = warpgroup_summary(data[blk, w, 1:count])
            if s is None:
                continue
            n += 1
            for k, v in s.items():
                acc[k] = acc.get(k, 0) + v
        if n == 0:
            per_wg.append(None)
            continue
        mean = {k: v / n for k, v in acc.items()}
        steps = max(mean["steps"], 1e-9)
        waits = sum(mean[k] for k in WAITS.values()) - mean["nested"]
        row = {"blocks": n, "steps": mean["steps"], "cycles_per_step": mean["total"] / steps,
               "median_step": mean["step_median"], "us_total": mean["total"] / meta["khz"] * 1e3}
        for k in WAITS.values():
            row[k + "_per_step"] = mean[k] / steps
        row["own_work_per_step"] = (mean["total"] - waits) / steps
        per_wg.append(row)
    return per_wg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--out")
    ap.add_argument("--json")
    args = ap.parse_args()
    results = []
    for path in sorted(glob.glob(os.path.join(args.dir, "trace_*.bin"))):
        m = NAME.search(os.path.basename(path))
        if not m:
            continue
        meta, data = read(path)
        meta["impl"] = m.group(5)
        meta["warpgroups"] = summarise(meta, data)
        results.append(meta)
    lines = ["| point | impl | wg | steps/block | cycles/step (median) | kv wait | q wait | peer wait "
             "| mma wait | epilogue | own work | µs in loop |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        point = f"h{r['h_q']} s{r['s_q']} b{r['batch']} {r['len']}"
        for w, s in enumerate(r["warpgroups"]):
            if s is None:
                continue
            lines.append(
                f"| {point} | {r['impl']} | {w} | {s['steps']:.1f} | {s['cycles_per_step']:.0f} "
                f"({s['median_step']:.0f}) | {s['kv_per_step']:.0f} | {s['q_per_step']:.0f} | "
                f"{s['peer_per_step']:.0f} | {s['mma_per_step']:.0f} | "
                f"{s['epilogue_per_step']:.0f} | {s['own_work_per_step']:.0f} | "
                f"{s['us_total']:.1f} |")
    text = ("Cycles per step (a page; a pair of pages for page_pairs) per warpgroup, mean over the "
            "blocks (SM clock, cudaDevAttrClockRate for µs). Waits: kv = a page's TMA boxes not "
            "landed, q = the request's Q, peer = the other warpgroup at a named barrier, mma = "
            "this warpgroup's own wgmma; own work = the rest.\n\n" + "\n".join(lines) + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
