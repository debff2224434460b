#!/usr/bin/env python3
"""Joins probe-bench results (one JSON per transport) into bench/results/rpc_score.json and
renders the markdown table with the issue's targets:

  - Score via IPC, p50 at R <= 64: within 1.3x of the bare echo p50 of the same transport and
    payload, measured in the same run;
  - 16 concurrent clients: Score via IPC reaches >= 80% of the echo's throughput.

    python3 bench/report_rpc.py rpc_uds.json rpc_tcp.json --out rpc_score.json --md rpc_score.md
"""

from __future__ import annotations

import argparse
import json


def key(record):
    s = record["shape"]
    return (s["transport"], s["concurrency"], s["R"], s["P"])


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("inputs", nargs="+")
    parser.add_argument("--out", required=True)
    parser.add_argument("--md", required=True)
    parser.add_argument("--command", default="")
    args = parser.parse_args()

    runs = [json.load(open(path)) for path in args.inputs]
    merged = dict(runs[0])
    merged["records"] = [r for run in runs for r in run["records"]]
    merged["command"] = args.command or " ; ".join(run["command"] for run in runs)
    merged["commands"] = [run["command"] for run in runs]
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)

    by = {}
    for r in merged["records"]:
        if r["impl"] in ("echo", "score_ipc", "score_inline"):
            by.setdefault(key(r), {})[r["impl"]] = r

    lines = [
        "# End-to-end RPC latency: Score vs a bare gRPC echo",
        "",
        f"Device: {merged['device']}; git {merged['git']}; {merged['date']}; copy ceiling "
        f"{merged['ceilings'].get('copy_gbps') or 0:.0f} GB/s (same run).",
        "",
        f"Command: `{merged['command']}`",
        "",
        "Client-side latency per call (µs), every call of every client thread; throughput in calls/s.",
        "activations bf16 [16384, 4096] registered over CUDA IPC (score_ipc) or R rows sent inline "
        "(score_inline); echo carries the score_ipc request's size and the response's size.",
        "",
        "| transport | clients | R | P | echo p50 / p99 | score_ipc p50 / p99 | ipc/echo p50 | "
        "score_inline p50 / p99 | echo rps | score_ipc rps | ipc/echo rps | score_inline rps |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    targets = []
    for k in sorted(by):
        transport, clients, rows, probes = k
        row = by[k]
        echo, ipc, inline = row.get("echo"), row.get("score_ipc"), row.get("score_inline")

        def lat(r):
            return f"{r['latency_us']['p50']:.0f} / {r['latency_us']['p99']:.0f}" if r else "–"

        def rps(r):
            return f"{r['throughput_rps']:.0f}" if r else "–"

        ratio_p50 = ipc["latency_us"]["p50"] / echo["latency_us"]["p50"] if echo and ipc else None
        ratio_rps = ipc["throughput_rps"] / echo["throughput_rps"] if echo and ipc else None
        lines.append(
            f"| {transport} | {clients} | {rows} | {probes} | {lat(echo)} | {lat(ipc)} | "
            f"{'%.2fx' % ratio_p50 if ratio_p50 else '–'} | {lat(inline)} | {rps(echo)} | {rps(ipc)} | "
            f"{'%.0f%%' % (100 * ratio_rps) if ratio_rps else '–'} | {rps(inline)} |"
        )
        errors = sum(r.get("errors", 0) for r in row.values())
        if errors:
            targets.append(f"- ERRORS: {errors} failed calls at {k}")
        if ratio_p50 is not None and rows <= 64 and clients == 1:
            ok = ratio_p50 <= 1.3
            targets.append(
                f"- {'met' if ok else 'MISSED'}: p50 score_ipc/echo at {transport}, R={rows}, P={probes}, "
                f"1 client: {ratio_p50:.2f}x (target <= 1.3x)"
            )
        if ratio_rps is not None and clients == 16 and rows <= 64:
            ok = ratio_rps >= 0.8
            targets.append(
                f"- {'met' if ok else 'MISSED'}: throughput score_ipc/echo at {transport}, R={rows}, "
                f"P={probes}, 16 clients: {100 * ratio_rps:.0f}% (target >= 80%)"
            )
    variants = [r for r in merged["records"] if r["impl"] not in ("echo", "score_ipc", "score_inline")]
    if variants:
        lines += ["", "## Server variants (same run)", "",
                  "| impl | transport | clients | R | P | p50 / p99 | rps | default score_ipc p50 |",
                  "|---|---|---|---|---|---|---|---|"]
        for r in variants:
            base = by.get(key(r), {}).get("score_ipc")
            lines.append(
                f"| {r['impl']} | {r['shape']['transport']} | {r['shape']['concurrency']} | {r['shape']['R']} | "
                f"{r['shape']['P']} | {r['latency_us']['p50']:.0f} / {r['latency_us']['p99']:.0f} | "
                f"{r['throughput_rps']:.0f} | {base['latency_us']['p50']:.0f} |" if base else "")
    lines += ["", "## Targets", ""] + targets + [""]
    with open(args.md, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(["## Targets"] + targets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
