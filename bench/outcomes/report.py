#!/usr/bin/env python3
"""What counting probe outcomes costs, from `probe-score-bench --sweep outcomes` results, as a
markdown table: per shape, the dispatcher's path alone and followed by the outcome count (in
stream order, and as a programmatic dependent: what the server's graph runs), the medians over
interleaved rounds, the added µs and % and whether it is within the target (≤ 1 µs or ≤ 1%,
whichever is larger).

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

VARIANTS = ["dispatch", "dispatch+outcomes", "dispatch+outcomes_pdl"]
PUBLISH = "dispatch+outcomes_pdl_publish"  # a synchronous request with a device output
OFF_PUBLISH = "dispatch+off_publish"  # the same for a set whose outcomes are not counted
EMPTY = "dispatch+empty_pdl"  # the floor of any kernel after the scoring kernels


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
        "variant once, in a rotating order; bf16 activations, H = 4096, sigmoid scores, rows "
        "random over a 2 GiB pool). `score`: the dispatcher's path alone. `+count`: followed by "
        "the outcome count in stream order. `+count (pdl)`: followed by it as a programmatic "
        "dependent, as the server's graph runs it. `+publish`: that, with the request's "
        "non-finite count published (what only a synchronous request with a device output asks "
        "for). `off`: a set whose outcomes are not counted (`--probe-outcomes=off` or its load's "
        "choice): with an asynchronous device output its graph is `score`'s (Δ 0: no count "
        "kernel); `off, publish`: a synchronous device output, the count kernel publishing the "
        "non-finite count and counting nothing. `floor`: one block that waits for the scoring "
        "kernels and exits, as a programmatic dependent: what any kernel after them costs at "
        "least. Δ against `score`; the target is Δ ≤ 1 µs or ≤ 1%, whichever is larger. R = 1024 "
        "is the Score of a tap's window (16 decode steps of a batch of 64).",
        "",
        "| R | P | path | score | +count | Δ | +count (pdl) | Δ | Δ % (pdl) | target | +publish "
        "| off, publish | Δ | floor Δ | rounds score / +count (pdl) |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    worst = 0.0
    for key in sorted(by_shape, key=lambda k: (k[3], k[1])):
        recs = by_shape[key]
        if not all(v in recs for v in VARIANTS):
            continue
        base, plain, pdl = (recs[v]["graph_us_p50"] for v in VARIANTS)
        d_plain, d_pdl = plain - base, pdl - base
        ok = within_target(base, d_pdl)
        worst = max(worst, d_pdl)
        rounds = " ".join(f"{x:.2f}" for x in recs["dispatch"].get("graph_us_rounds", []))
        rounds_pdl = " ".join(
            f"{x:.2f}" for x in recs["dispatch+outcomes_pdl"].get("graph_us_rounds", []))
        publish = recs.get(PUBLISH, {}).get("graph_us_p50")
        off = recs.get(OFF_PUBLISH, {}).get("graph_us_p50")
        empty = recs.get(EMPTY, {}).get("graph_us_p50")
        lines.append(
            f"| {key[1]} | {key[3]} | {recs['dispatch'].get('path', '')} | {base:.2f} | "
            f"{plain:.2f} | {d_plain:+.2f} | {pdl:.2f} | {d_pdl:+.2f} | "
            f"{100 * d_pdl / base:+.1f}% | {'yes' if ok else '**no**'} | "
            f"{'—' if publish is None else f'{publish:.2f}'} | "
            f"{'—' if off is None else f'{off:.2f} | {off - base:+.2f}'}"
            f"{' | —' if off is None else ''} | "
            f"{'—' if empty is None else f'{empty - base:+.2f}'} | {rounds} / {rounds_pdl} |")
    spread = []
    for recs in by_shape.values():
        rounds = recs.get("dispatch", {}).get("graph_us_rounds", [])
        if len(rounds) > 1:
            spread.append(max(rounds) - min(rounds))
    lines += ["", f"Largest added time (pdl): {worst:+.2f} µs. The run-to-run spread of `score` "
              f"alone (max - min over its rounds) was {statistics.median(spread):.2f} µs in the "
              f"median shape, {max(spread):.2f} µs at most." if spread else ""]
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
