#!/usr/bin/env python3
"""Latency against achieved throughput, from probe-bench results (or bench/report_rpc.py's merged
file), to a PNG: p50 on the left, p99 on the right, one line per (impl, transport, server
label, loop), its points the load sweep (closed loop: --concurrency; open loop: --rate).

    python3 bench/plot_rpc.py bench/results/rpc_score.json --png bench/results/rpc_score.png

Only one (R, P) shape is drawn: --rows/--probes, by default the smallest of each in the file.
Needs matplotlib (on the GPU machine; not a CI requirement).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def series(records: list[dict], rows: int, probes: int) -> dict[tuple, list[dict]]:
    """(impl, transport, label, loop) -> records of the sweep, in sweep order (clients or rate)."""
    lines = defaultdict(list)
    for r in records:
        s = r["shape"]
        if s["R"] != rows or s["P"] != probes:
            continue
        loop = "open" if s.get("rate") is not None else "closed"
        lines[(r["impl"], s["transport"], r.get("server_label") or "", loop)].append(r)
    def load(r):
        return r["shape"].get("rate") or r["shape"].get("concurrency") or 0

    return {k: sorted(v, key=load) for k, v in sorted(lines.items())}


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("inputs", nargs="+", help="probe-bench --out or report_rpc.py --out files")
    parser.add_argument("--png", required=True)
    parser.add_argument("--rows", type=int, help="R to draw (default: the smallest)")
    parser.add_argument("--probes", type=int, help="P to draw (default: the smallest)")
    args = parser.parse_args()

    docs = [json.load(open(path)) for path in args.inputs]
    records = [r for doc in docs for r in doc["records"]]
    if not records:
        raise SystemExit("plot_rpc: no records")
    rows = args.rows or min(r["shape"]["R"] for r in records)
    probes = args.probes or min(r["shape"]["P"] for r in records)
    lines = series(records, rows, probes)
    if not lines:
        raise SystemExit(f"plot_rpc: no records with R={rows}, P={probes}")

    fig, axes = plt.subplots(1, 2, figsize=(14, 5.5), sharex=True)
    for (impl, transport, label, loop), points in lines.items():
        name = f"{impl} {transport}" + (f" [{label}]" if label else "") + f" ({loop} loop)"
        style = {"marker": "o" if loop == "closed" else "s",
                 "linestyle": "-" if loop == "closed" else "--"}
        x = [r["throughput_rps"] for r in points]
        for ax, q in zip(axes, ("p50", "p99")):
            ax.plot(x, [r["latency_us"][q] for r in points], label=name, **style)
    doc = docs[0]
    for ax, q in zip(axes, ("p50", "p99")):
        ax.set_title(f"{q} latency vs achieved throughput, R={rows} P={probes}")
        ax.set_xlabel("achieved throughput (answered calls/s)")
        ax.set_ylabel(f"{q} latency (µs, client side)")
        ax.set_yscale("log")
        ax.grid(True, which="both", alpha=0.3)
    axes[1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle(f"{doc['device']}, git {doc['git'][:12]}, {doc['date']}: open loop latency is "
                 "from each call's scheduled send time", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.png, dpi=120)
    print(f"wrote {args.png}: {len(lines)} lines, R={rows} P={probes}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
