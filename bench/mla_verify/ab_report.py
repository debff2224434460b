#!/usr/bin/env python3
"""The report of ab.sh: builds of mla-verify-bench (a, b, c, ...), several passes each, on one GPU.

Per point and build after the first: its graph-replay time over A's, the median over passes (each
pass's time against the same pass's A), and A's own spread (its slowest pass over its fastest).
Summaries per build: the geometric mean over points, by h_q and batch, and the points where it is
more than 2% faster or slower than A.

    ab_report.py OUT_DIR [--out ab.md] [--json ab.json]
"""
from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys
from collections import defaultdict

from report import geomean, key

Key = tuple[int, int, int, int]  # h_q, s_q, batch, seqlen


def load_side(out_dir: str, side: str) -> tuple[dict[int, dict[Key, float]], dict]:
    """Pass number -> point -> graph-replay p50 (µs) of the dispatched sm_90a path; and the
    first pass's header (device, git, ceilings)."""
    passes: dict[int, dict[Key, float]] = {}
    header: dict = {}
    for path in sorted(glob.glob(os.path.join(out_dir, f"ab_{side}_*.json"))):
        m = re.search(rf"ab_{side}_(\d+)\.json$", path)
        if not m:
            continue
        with open(path) as f:
            doc = json.load(f)
        if not header:
            header = {k: doc.get(k) for k in ("device", "git", "date", "ceilings")}
        times: dict[Key, float] = {}
        for r in doc.get("records", []):
            if r.get("bench") != "mla_verify" or not r.get("graph_us_p50"):
                continue
            times[key(r)] = float(r["graph_us_p50"])
        passes[int(m.group(1))] = times
    return passes, header


def compare(a: dict[int, dict[Key, float]], b: dict[int, dict[Key, float]]) -> list[dict]:
    rows = []
    points = sorted(set().union(*[set(t) for t in a.values()]) if a else set())
    for k in points:
        ratios = [b[p][k] / a[p][k] for p in sorted(a) if p in b and k in a[p] and k in b[p]]
        a_times = [a[p][k] for p in a if k in a[p]]
        if not ratios:
            continue
        rows.append({
            "h_q": k[0], "s_q": k[1], "batch": k[2], "seqlen": k[3],
            "a_us": statistics.median(a_times),
            "b_us": statistics.median([b[p][k] for p in b if k in b[p]]),
            "ratio": statistics.median(ratios),
            "ratio_min": min(ratios), "ratio_max": max(ratios),
            "a_spread": max(a_times) / min(a_times),
        })
    return rows


def render(rows: list[dict], ha: dict, hb: dict, passes: int, side: str = "b") -> str:
    ratios = [r["ratio"] for r in rows]
    faster = [r for r in rows if r["ratio"] < 0.98]
    slower = [r for r in rows if r["ratio"] > 1.02]
    B = side.upper()
    out = [
        f"# MLA verify: build {B} against build A (ab.sh)",
        "",
        f"- A: `{ha.get('git')}`; {B}: `{hb.get('git')}`; {ha.get('device')}, {ha.get('date')}",
        f"- {passes} passes, the builds' order rotated; {len(rows)} points; time = graph-replay "
        f"p50 of the dispatched sm_90a path; ratio = median over passes of {B} / A in the same pass",
        f"- **geomean {B} / A {geomean(ratios):.3f}** (range {min(ratios):.3f}-{max(ratios):.3f}); "
        f"{B} > 2% faster at {len(faster)}, > 2% slower at {len(slower)}",
        f"- A's own spread (slowest / fastest pass): median "
        f"{statistics.median(r['a_spread'] for r in rows):.3f}, worst "
        f"{max(r['a_spread'] for r in rows):.3f}",
        "",
        f"| group | points | geomean {B} / A | range |",
        "|---|---|---|---|",
    ]
    groups: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        groups[f"h_q={r['h_q']}, batch {r['batch']}"].append(r["ratio"])
    for g in sorted(groups, key=lambda g: [int(x) for x in re.findall(r"\d+", g)]):
        v = groups[g]
        out.append(f"| {g} | {len(v)} | {geomean(v):.3f} | {min(v):.3f}-{max(v):.3f} |")
    out += ["", f"| h_q | s_q | batch | keys | A µs | {B} µs | {B} / A | passes' {B} / A | A spread |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(
            f"| {r['h_q']} | {r['s_q']} | {r['batch']} | {r['seqlen']} | {r['a_us']:.1f} | "
            f"{r['b_us']:.1f} | {r['ratio']:.3f} | {r['ratio_min']:.3f}-{r['ratio_max']:.3f} | "
            f"{r['a_spread']:.3f} |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--out", help="markdown report (default: stdout)")
    ap.add_argument("--json", help="the per-point rows as JSON")
    args = ap.parse_args(argv)
    a, ha = load_side(args.out_dir, "a")
    texts, doc = [], {"a": ha, "builds": {}}
    for side in "bcdef":
        b, hb = load_side(args.out_dir, side)
        if not b:
            continue
        rows = compare(a, b)
        if not rows:
            print(f"ab_report: no points common to a and {side} in {args.out_dir}",
                  file=sys.stderr)
            return 1
        texts.append(render(rows, ha, hb, len(a), side))
        doc["builds"][side] = {"header": hb, "rows": rows}
        print(texts[-1].split("\n")[4])
    if not texts:
        print(f"ab_report: no build to compare with a in {args.out_dir}", file=sys.stderr)
        return 1
    text = "\n".join(texts)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    else:
        sys.stdout.write(text)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
