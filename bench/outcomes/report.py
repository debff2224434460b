#!/usr/bin/env python3
"""What counting probe outcomes costs, from `probe-score-bench --sweep outcomes` results, as a
markdown table: per shape, the dispatcher's path alone and with the outcome count as the server
runs it (fused into the scoring kernels), the medians over interleaved rounds, the added µs and % and whether it is within the
target (≤ 1 µs or ≤ 1%, whichever is larger); beside it, the count kernel after the scoring kernels
(what the server ran before the count was fused) and the floor of any kernel after them.

    python3 bench/outcomes/report.py bench/results/outcomes.json --out bench/results/outcomes.md

Plain Python 3: runs here and on the GPU machine.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import receipt  # noqa: E402

BASE = "dispatch"
FUSED = "dispatch+fused"  # what the server runs
FUSED_PUBLISH = "dispatch+fused_publish"  # a synchronous request with a device output
KERNEL = "dispatch+outcomes_pdl"  # the count kernel alone after the scoring kernels
OFF_PUBLISH = "dispatch+off_publish"  # a set whose outcomes are not counted, publishing
EMPTY = "dispatch+empty_pdl"  # the floor of any kernel after the scoring kernels


def p50(recs: dict, impl: str) -> float | None:
    return recs.get(impl, {}).get("graph_us_p50")


def delta(value: float | None, base: float) -> str:
    return "— | —" if value is None else f"{value:.2f} | {value - base:+.2f}"


def rounds(recs: dict, impl: str) -> str:
    return " ".join(f"{x:.2f}" for x in recs.get(impl, {}).get("graph_us_rounds", []))


def within_target(base: float, added: float) -> bool:
    return added <= max(1.0, 0.01 * base)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results")
    ap.add_argument("--out", required=True)
    ap.add_argument("--allow-dirty", action="store_true")
    args = ap.parse_args()
    with open(args.results) as f:
        doc = json.load(f)
    receipt.check(receipt.identify(doc.get("git") or ""), args.allow_dirty)
    by_shape: dict[tuple, dict] = {}
    for r in doc["records"]:
        key = (r["dtype"], r["shape"]["R"], r["shape"]["H"], r["shape"]["P"])
        by_shape.setdefault(key, {})[r["impl"]] = r
    lines = [
        "# Probe outcomes: what counting costs the scoring graph",
        "",
        f"Device: **{doc['device']}**, git `{doc['git']}`, {doc['date']}.  ",
        f"Command: `{doc['command']}` → `{os.path.basename(args.results)}`; rendered by "
        f"`bench/outcomes/report.py`.",
        "",
        "Device time per graph replay (µs, median of the per-round medians; each round times every "
        "variant once, in a rotating order; bf16 activations, H = 4096, sigmoid scores, 20 bucket "
        "bounds, rows random over a 2 GiB pool). `score`: the dispatcher's path alone. `counted`: "
        "the outcome count as the server runs it: fused into the kernels that write the scores "
        "(each block tallies its scores in shared memory and adds them to the counters once). "
        "`+publish`: that for a synchronous request with a device output, where the count kernel "
        "follows to publish the request's non-finite count. `count kernel`: the count kernel alone "
        "after the scoring kernels, as a programmatic dependent (what the server ran before the "
        "count was fused). `off, publish`: a set whose outcomes are not counted "
        "(`--probe-outcomes=off` or its load's choice), a synchronous device output: the count "
        "kernel publishing the non-finite count and counting nothing (an asynchronous one has no "
        "count at all: its graph is `score`'s). `floor`: one block that waits for the scoring "
        "kernels and exits, as a programmatic dependent: what any kernel after them costs at "
        "least. Δ against `score`; the target is Δ ≤ 1 µs or ≤ 1%, whichever is larger. R = 1024 "
        "is the Score of a tap's window (16 decode steps of a batch of 64).",
        "",
        "| R | P | path | score | counted | Δ | Δ % | target | +publish | Δ | count kernel | Δ "
        "| off, publish | Δ | floor Δ | rounds score / counted |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    worst = 0.0
    for key in sorted(by_shape, key=lambda k: (k[3], k[1])):
        recs = by_shape[key]
        base, fused = p50(recs, BASE), p50(recs, FUSED)
        if base is None or fused is None:
            continue
        added = fused - base
        worst = max(worst, added)
        empty = p50(recs, EMPTY)
        lines.append(
            f"| {key[1]} | {key[3]} | {recs[BASE].get('path', '')} | {base:.2f} | {fused:.2f} | "
            f"{added:+.2f} | {100 * added / base:+.1f}% | "
            f"{'yes' if within_target(base, added) else '**no**'} | "
            f"{delta(p50(recs, FUSED_PUBLISH), base)} | {delta(p50(recs, KERNEL), base)} | "
            f"{delta(p50(recs, OFF_PUBLISH), base)} | "
            f"{'—' if empty is None else f'{empty - base:+.2f}'} | "
            f"{rounds(recs, BASE)} / {rounds(recs, FUSED)} |")
    spread = []
    for recs in by_shape.values():
        rounds = recs.get("dispatch", {}).get("graph_us_rounds", [])
        if len(rounds) > 1:
            spread.append(max(rounds) - min(rounds))
    lines += ["", f"Largest added time (counted): {worst:+.2f} µs. The run-to-run spread of `score` "
              f"alone (max - min over its rounds) was {statistics.median(spread):.2f} µs in the "
              f"median shape, {max(spread):.2f} µs at most." if spread else ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
