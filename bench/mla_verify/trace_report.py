"""Where the sm_90a MLA verify kernels' cycles go, from their in-kernel timestamp traces.

  python3 trace_report.py DIR [--out FILE.md] [--json FILE.json] [--timeline FILE.txt]

Reads every DIR/trace_h<h>_s<s>_b<b>_l<len>_<impl>.bin that `mla-verify-bench --trace-dir DIR`
wrote (a build with -DPROBESIDECAR_MLA_TRACE=ON; the format is in
kernels/mla_verify/mla_verify_trace.h) and prints, per trace and warpgroup, the cycles of one step
(a page, or a pair of pages for the page-pair schedule) averaged over the blocks, split into the
waits the kernel recorded: for a page's TMA boxes (kv), for the request's Q (q), for the other
warpgroup at a named barrier (peer), for its own wgmma (mma), the epilogue of finished requests,
and the rest (issuing wgmma and TMA, softmax, rescaling: the warpgroup's own work); and per trace
where a block's time outside its loop goes (waiting for the plan kernel, the prologue until the
first step, the spread of the blocks' start and end times); and which blocks end last (their SM,
range and row tile, their waits and own work) and what a block's end goes with (Pearson r against
its page-box waits, its own work, the end of the other block on its TPC, the end of its range's
other row tiles). --timeline: the first events of block
0, both warpgroups, as text. Plain Python 3 with numpy: runs on the GPU machine next to the
benchmark.
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
          12: "done", 13: "grid_wait_end"}
FIRST_EVENT = 2  # pair 0: {pairs used, SM}; pair 1: {globaltimer at start, at end}
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
    grid = t[code == 13]
    if len(starts) == 0 or len(done) == 0:
        return None
    out["total"] = int(done[-1] - starts[0])
    out["grid_wait"] = int(grid[0]) if len(grid) else 0
    out["prologue"] = int(starts[0] - (grid[0] if len(grid) else 0))
    out["steps"] = int(step.max()) + 1
    step_times = np.diff(starts)
    out["step_median"] = float(np.median(step_times)) if len(step_times) else float(out["total"])
    return out


def own_cycles(s):
    """A warpgroup summary's cycles outside the waits it recorded (its own work)."""
    return s["total"] - (sum(s[k] for k in WAITS.values()) - s["nested"])


def block_summaries(data):
    """warpgroup_summary of each block's two warpgroups (None where one recorded nothing)."""
    out = []
    for b in range(data.shape[0]):
        per_wg = []
        for w in range(2):
            count = int(data[b, w, 0, 0])
            per_wg.append(warpgroup_summary(data[b, w, FIRST_EVENT:count])
                          if count > FIRST_EVENT else None)
        out.append(per_wg)
    return out


def block_rows(meta, data, summaries):
    """One row per block that recorded (warpgroup 0): its SM, its row tile and range (blockIdx.x,
    .y), its start and end (µs from the first start, globaltimer) and, per warpgroup, the cycles it
    waited for page boxes and its own work, per step."""
    row_tiles = (meta["h_q"] * meta["s_q"] + 63) // 64
    rows, base = [], None
    for b in range(data.shape[0]):
        if int(data[b, 0, 0, 0]) <= FIRST_EVENT:
            continue
        t0, t1 = int(data[b, 0, 1, 0]), int(data[b, 0, 1, 1])
        base = t0 if base is None else base
        start = ((t0 - base + (1 << 31)) % (1 << 32)) - (1 << 31)
        end = ((t1 - base + (1 << 31)) % (1 << 32)) - (1 << 31)
        row = {"block": b, "sm": int(data[b, 0, 0, 1]), "tile": b % row_tiles,
               "range": b // row_tiles, "start_us": start / 1e3, "end_us": end / 1e3}
        for w, s in enumerate(summaries[b]):
            if s is None:
                continue
            steps = max(s["steps"], 1)
            row[f"wg{w}_kv_per_step"] = s["kv"] / steps
            row[f"wg{w}_own_per_step"] = own_cycles(s) / steps
            row["steps"] = s["steps"]
        rows.append(row)
    if rows:
        first = min(r["start_us"] for r in rows)
        for r in rows:
            r["start_us"] -= first
            r["end_us"] -= first
    return rows


def block_span(rows):
    """µs from the first block's start to the last block's end (globaltimer), and the spread of
    the blocks' starts and ends (block_rows: times from the first start)."""
    if not rows:
        return None
    start = [r["start_us"] for r in rows]
    end = [r["end_us"] for r in rows]
    return {"span_us": max(end) - min(start), "start_spread_us": max(start) - min(start),
            "end_spread_us": max(end) - min(end),
            "mean_block_us": float(np.mean([b - a for a, b in zip(start, end)]))}


def late_blocks(rows, show=6):
    """Why some blocks end late: the correlation of a block's end with its waits for page boxes
    and with its own work (both warpgroups, per step), with the end of the other block on its TPC
    (SMs 2k and 2k + 1) and with the end of the other row tiles of its range; and the blocks that
    end last and first."""
    if len(rows) < 4:
        return None
    end = np.array([r["end_us"] for r in rows])

    def corr(values):
        v = np.array(values, dtype=np.float64)
        ok = np.isfinite(v)
        if ok.sum() < 4 or np.std(v[ok]) == 0 or np.std(end[ok]) == 0:
            return None
        return float(np.corrcoef(end[ok], v[ok])[0, 1])

    def per_step(r, key):
        return sum(r.get(f"wg{w}_{key}_per_step", 0.0) for w in range(2))

    by_sm = {r["sm"]: r["end_us"] for r in rows}
    by_range = {}
    for r in rows:
        by_range.setdefault(r["range"], []).append((r["block"], r["end_us"]))
    tpc = [by_sm.get(r["sm"] ^ 1, np.nan) for r in rows]
    peers = [np.mean([e for b, e in by_range[r["range"]] if b != r["block"]])
             if len(by_range[r["range"]]) > 1 else np.nan for r in rows]
    order = sorted(rows, key=lambda r: r["end_us"])
    keep = ("block", "sm", "range", "tile", "start_us", "end_us", "steps", "wg0_kv_per_step",
            "wg1_kv_per_step", "wg0_own_per_step", "wg1_own_per_step")
    return {"blocks": len(rows),
            "corr_end_kv_wait": corr([per_step(r, "kv") for r in rows]),
            "corr_end_own_work": corr([per_step(r, "own") for r in rows]),
            "corr_end_tpc_partner_end": corr(tpc),
            "corr_end_range_peers_end": corr(peers),
            "last": [{k: r.get(k) for k in keep} for r in order[::-1][:show]],
            "first": [{k: r.get(k) for k in keep} for r in order[:show]]}


def late_lines(point, impl, late):
    def fmt(v):
        return "–" if v is None else f"{v:+.2f}"
    lines = [f"{point} {impl}: {late['blocks']} blocks; a block's end against: its page-box waits "
             f"{fmt(late['corr_end_kv_wait'])}, its own work {fmt(late['corr_end_own_work'])}, "
             f"its TPC partner's end {fmt(late['corr_end_tpc_partner_end'])}, its range's other "
             f"row tiles' end {fmt(late['corr_end_range_peers_end'])} (Pearson r)"]
    for label in ("last", "first"):
        for r in late[label]:
            lines.append(
                f"  {label:5s} block {r['block']:4d} sm {r['sm']:3d} range {r['range']:3d} tile "
                f"{r['tile']:2d} end {r['end_us']:8.1f} µs, {r.get('steps') or 0} steps, kv "
                f"wait/step {r.get('wg0_kv_per_step') or 0:.0f}+{r.get('wg1_kv_per_step') or 0:.0f}"
                f", own/step {r.get('wg0_own_per_step') or 0:.0f}+"
                f"{r.get('wg1_own_per_step') or 0:.0f} cycles")
    return lines


def timeline(data, khz, limit=120):
    lines = []
    for w in range(2):
        count = int(data[0, w, 0, 0])
        rows = data[0, w, FIRST_EVENT:min(count, FIRST_EVENT + limit)]
        lines.append(f"  warpgroup {w} ({count - FIRST_EVENT} events; cycles since block start):")
        for ti, ev in rows.tolist():
            lines.append(f"    {ti:9d} {EVENTS.get(ev >> 24, ev >> 24):14s} step {ev & 0xFFFFFF}")
    return lines


def summarise(meta, summaries):
    per_wg = []
    for w in range(2):
        acc, n = {}, 0
        for per_block in summaries:
            s = per_block[w]
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
        row = {"blocks": n, "steps": mean["steps"], "cycles_per_step": mean["total"] / steps,
               "median_step": mean["step_median"], "us_total": mean["total"] / meta["khz"] * 1e3}
        for k in WAITS.values():
            row[k + "_per_step"] = mean[k] / steps
        row["own_work_per_step"] = own_cycles(mean) / steps
        row["grid_wait_us"] = mean["grid_wait"] / meta["khz"] * 1e3
        row["prologue_us"] = mean["prologue"] / meta["khz"] * 1e3
        per_wg.append(row)
    return per_wg


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--out")
    ap.add_argument("--json")
    ap.add_argument("--timeline")
    args = ap.parse_args()
    results, timelines = [], []
    for path in sorted(glob.glob(os.path.join(args.dir, "trace_*.bin"))):
        m = NAME.search(os.path.basename(path))
        if not m:
            continue
        meta, data = read(path)
        meta["impl"] = m.group(5)
        summaries = block_summaries(data)
        rows = block_rows(meta, data, summaries)
        meta["warpgroups"] = summarise(meta, summaries)
        meta["blocks"] = block_span(rows)
        meta["late_blocks"] = late_blocks(rows)
        results.append(meta)
        timelines += [f"{os.path.basename(path)}:"] + timeline(data, meta["khz"])
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
    lines += ["", "| point | impl | blocks: first start to last end µs | start spread µs | end spread "
              "µs | mean block µs | waiting for the plan µs | prologue µs (to the first step) |",
              "|---|---|---|---|---|---|---|---|"]
    for r in results:
        b, w0 = r["blocks"], r["warpgroups"][0]
        if b is None or w0 is None:
            continue
        lines.append(f"| h{r['h_q']} s{r['s_q']} b{r['batch']} {r['len']} | {r['impl']} | "
                     f"{b['span_us']:.1f} | {b['start_spread_us']:.1f} | {b['end_spread_us']:.1f} | "
                     f"{b['mean_block_us']:.1f} | {w0['grid_wait_us']:.2f} | {w0['prologue_us']:.2f} |")
    late = []
    for r in results:
        if r["late_blocks"] is not None:
            late += late_lines(f"h{r['h_q']} s{r['s_q']} b{r['batch']} {r['len']}", r["impl"],
                               r["late_blocks"])
    if late:
        lines += ["", "Which blocks end last, and what goes with it:", "", "```", *late, "```"]
    text = ("Cycles per step (a page; a pair of pages for page_pairs) per warpgroup, mean over the "
            "blocks (SM clock, cudaDevAttrClockRate for µs). Waits: kv = a page's TMA boxes not "
            "landed, q = the request's Q, peer = the other warpgroup at a named barrier, mma = "
            "this warpgroup's own wgmma; own work = the rest. Second table: the tile kernel's "
            "blocks in time (globaltimer), and what a block spends before its loop.\n\n" +
            "\n".join(lines) + "\n")
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    if args.timeline:
        with open(args.timeline, "w") as f:
            f.write("\n".join(timelines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
