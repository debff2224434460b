#!/usr/bin/env python3
"""Joins probe-bench results (one JSON per transport or server binary) into
bench/results/rpc_score.json and renders the markdown table with the targets:

  - unary Score via IPC, p50 at R <= 64, one client: within 1.3x of the bare unary echo p50 of
    the same transport and payload, measured in the same run;
  - ScoreStream via IPC (ping-pong), p50 at R <= 64, one client: within 1.3x of the bare bidi
    echo ping-pong (echo_stream);
  - 16 concurrent clients: Score via IPC reaches >= 80% of the echo's throughput.

Records with a --server-label (e.g. "before" and "after": two server binaries measured in one
run) are compared label against label. Every input must name the same full commit (receipts:
bench/receipt.py); a +dirty one is refused unless --allow-dirty.

    python3 bench/report_rpc.py rpc_uds.json rpc_tcp.json --out rpc_score.json --md rpc_score.md
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import receipt  # noqa: E402

RATIO_TARGET = 1.3
THROUGHPUT_TARGET = 0.8


def load_key(record: dict) -> tuple:
    """Closed loop: ("c", clients); open loop: ("rate", rate, arrivals)."""
    s = record["shape"]
    if s.get("rate") is not None:
        return ("rate", s["rate"], s.get("arrivals", "poisson"))
    return ("c", s["concurrency"])


def key(record: dict) -> tuple:
    s = record["shape"]
    return (s["transport"], load_key(record), s["R"], s["P"])


def label_of(record: dict) -> str:
    return record.get("server_label") or ""


def error_count(record: dict) -> int:
    errors = record.get("errors", 0)
    return sum(errors.values()) if isinstance(errors, dict) else int(errors)


def lat(record: dict | None, q: str = "p50") -> float | None:
    return record["latency_us"][q] if record else None


def fmt_lat(record: dict | None) -> str:
    return f"{lat(record):.0f} / {lat(record, 'p99'):.0f}" if record else "–"


def fmt_rps(record: dict | None) -> str:
    return f"{record['throughput_rps']:.0f}" if record else "–"


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a and b else None


def fmt_ratio(r: float | None) -> str:
    return f"{r:.2f}x" if r else "–"


def load_text(load: tuple) -> str:
    return f"c={load[1]}" if load[0] == "c" else f"{load[1]:g}/s {load[2]}"


def identity_of(runs: list[dict], allow_dirty: bool) -> str:
    commits = {run.get("git") for run in runs}
    if len(commits) != 1:
        raise SystemExit(f"report_rpc: the inputs name different commits: {sorted(map(str, commits))}")
    commit = commits.pop()
    if not commit:
        raise SystemExit("report_rpc: the inputs name no commit (run probe-bench with --git)")
    return receipt.check(receipt.identify(commit), allow_dirty)


class Index:
    """Records by (label, impl, key); the echo baselines are shared by every label."""

    def __init__(self, records: list[dict]):
        self.by = {}
        for r in records:
            self.by.setdefault((label_of(r), r["impl"], key(r)), r)
        self.labels = list(dict.fromkeys(label_of(r) for r in records if not r["impl"].startswith("echo")))

    def get(self, label: str, impl: str, k: tuple) -> dict | None:
        found = self.by.get((label, impl, k))
        if found is None and impl.startswith("echo"):
            found = next((r for (l, i, kk), r in self.by.items() if i == impl and kk == k), None)
        return found

    def keys(self, label: str, impls: tuple[str, ...], closed: bool) -> list[tuple]:
        ks = {k for (l, i, k) in self.by if i in impls and (l == label or i.startswith("echo"))}
        return sorted(k for k in ks if (k[1][0] == "c") == closed)


def unary_table(ix: Index, label: str, targets: list[str]) -> list[str]:
    lines = ["| transport | clients | R | P | echo p50 / p99 | score_ipc p50 / p99 | ipc/echo p50 | "
             "score_inline p50 / p99 | echo rps | score_ipc rps | ipc/echo rps | score_inline rps |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in ix.keys(label, ("echo", "score_ipc", "score_inline"), closed=True):
        transport, (_, clients), rows, probes = k
        echo, ipc, inline = (ix.get(label, i, k) for i in ("echo", "score_ipc", "score_inline"))
        if not (ipc or inline):
            continue
        r50 = ratio(lat(ipc), lat(echo))
        rrps = ratio(ipc and ipc["throughput_rps"], echo and echo["throughput_rps"])
        lines.append(f"| {transport} | {clients} | {rows} | {probes} | {fmt_lat(echo)} | {fmt_lat(ipc)} | "
                     f"{fmt_ratio(r50)} | {fmt_lat(inline)} | {fmt_rps(echo)} | {fmt_rps(ipc)} | "
                     f"{'%.0f%%' % (100 * rrps) if rrps else '–'} | {fmt_rps(inline)} |")
        where = f"{transport}, R={rows}, P={probes}" + (f", server {label}" if label else "")
        if r50 is not None and rows <= 64 and clients == 1:
            targets.append(f"- {'met' if r50 <= RATIO_TARGET else 'MISSED'}: p50 score_ipc/echo at "
                           f"{where}, 1 client: {r50:.2f}x (target <= {RATIO_TARGET}x)")
        if rrps is not None and rows <= 64 and clients == 16:
            targets.append(f"- {'met' if rrps >= THROUGHPUT_TARGET else 'MISSED'}: throughput "
                           f"score_ipc/echo at {where}, 16 clients: {100 * rrps:.0f}% "
                           f"(target >= {100 * THROUGHPUT_TARGET:.0f}%)")
    return lines


def stream_table(ix: Index, label: str, targets: list[str]) -> list[str]:
    lines = ["| transport | clients | R | P | echo_stream p50 / p99 | score_stream_ipc p50 / p99 | "
             "stream/echo_stream p50 | score_stream (inline) p50 / p99 | echo (unary) p50 | "
             "score_ipc (unary) p50 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for k in ix.keys(label, ("echo_stream", "score_stream_ipc", "score_stream"), closed=True):
        transport, (_, clients), rows, probes = k
        echo_s, ipc_s, inline_s = (ix.get(label, i, k)
                                   for i in ("echo_stream", "score_stream_ipc", "score_stream"))
        if not (ipc_s or inline_s):
            continue
        echo, ipc = ix.get(label, "echo", k), ix.get(label, "score_ipc", k)
        r50 = ratio(lat(ipc_s), lat(echo_s))
        lines.append(f"| {transport} | {clients} | {rows} | {probes} | {fmt_lat(echo_s)} | "
                     f"{fmt_lat(ipc_s)} | {fmt_ratio(r50)} | {fmt_lat(inline_s)} | "
                     f"{'%.0f' % lat(echo) if echo else '–'} | {'%.0f' % lat(ipc) if ipc else '–'} |")
        if r50 is not None and rows <= 64 and clients == 1:
            where = f"{transport}, R={rows}, P={probes}" + (f", server {label}" if label else "")
            targets.append(f"- {'met' if r50 <= RATIO_TARGET else 'MISSED'}: p50 "
                           f"score_stream_ipc/echo_stream at {where}, 1 client: {r50:.2f}x "
                           f"(target <= {RATIO_TARGET}x)")
    return lines


def open_loop_table(records: list[dict]) -> list[str]:
    rows = [r for r in records if load_key(r)[0] == "rate"]
    if not rows:
        return []
    lines = ["", "## Open loop (latency from each call's scheduled send time)", "",
             "| server | impl | transport | R | P | arrivals | offered rps | achieved rps | not sent | "
             "p50 | p90 | p99 | p99.9 | send lag p99 | errors |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(rows, key=lambda r: (label_of(r), r["impl"], key(r))):
        s, q = r["shape"], r["latency_us"]
        lines.append(f"| {label_of(r) or '–'} | {r['impl']} | {s['transport']} | {s['R']} | {s['P']} | "
                     f"{s['arrivals']} | {r['offered_rps']:.0f} | {r['throughput_rps']:.0f} | "
                     f"{r['not_sent']} | {q['p50']:.0f} | {q['p90']:.0f} | {q['p99']:.0f} | "
                     f"{q['p99_9']:.0f} | {r['send_lag_us']['p99']:.0f} | {error_count(r)} |")
    return lines


def labels_table(ix: Index, records: list[dict]) -> list[str]:
    """The same (impl, transport, load, R, P) measured against differently labelled servers."""
    if len(ix.labels) < 2:
        return []
    first = ix.labels[0]
    lines = ["", "## Server binaries compared (same run, by --server-label)", "",
             f"p50 / p99 µs per label; the ratio is each p50 over the p50 of "
             f"'{first or '(no label)'}'.", "",
             "| impl | transport | load | R | P | " + " | ".join(
                 f"{label or '(no label)'}" for label in ix.labels) + " |",
             "|---|---|---|---|---|" + "---|" * len(ix.labels)]
    seen = set()
    for r in records:
        k = (r["impl"], key(r))
        if r["impl"].startswith("echo") or k in seen:
            continue
        seen.add(k)
        found = [ix.by.get((label, r["impl"], key(r))) for label in ix.labels]
        if sum(f is not None for f in found) < 2:
            continue
        base = lat(found[0])
        cells = [f"{fmt_lat(f)} ({fmt_ratio(ratio(lat(f), base))})" if f else "–" for f in found]
        transport, load, rows, probes = key(r)
        lines.append(f"| {r['impl']} | {transport} | {load_text(load)} | {rows} | {probes} | "
                     + " | ".join(cells) + " |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("inputs", nargs="+", help="probe-bench --out files")
    parser.add_argument("--out", required=True)
    parser.add_argument("--md", required=True)
    parser.add_argument("--command", default="", help="the command that produced the inputs")
    parser.add_argument("--allow-dirty", action="store_true",
                        help="accept inputs measured from a dirty tree (marked +dirty)")
    args = parser.parse_args()

    runs = [json.load(open(path)) for path in args.inputs]
    merged = dict(runs[0])
    merged["git"] = identity_of(runs, args.allow_dirty)
    merged["records"] = [r for run in runs for r in run["records"]]
    merged["command"] = args.command or " ; ".join(run["command"] for run in runs)
    merged["commands"] = [run["command"] for run in runs]
    merged["ceilings"] = next((run["ceilings"] for run in runs
                               if (run.get("ceilings") or {}).get("copy_gbps")), runs[0]["ceilings"])
    merged["servers"] = [run.get("server") for run in runs]
    merged.pop("server", None)
    with open(args.out, "w") as f:
        json.dump(merged, f, indent=1)
        f.write("\n")

    records = merged["records"]
    ix = Index(records)
    ceilings = merged["ceilings"] or {}
    lines = [
        "# End-to-end RPC latency: Score vs a bare gRPC echo",
        "",
        f"Device: {merged['device']}; git {merged['git']}; {merged['date']}; ceilings (same run): "
        f"copy {ceilings.get('copy_gbps') or 0:.0f} GB/s, bf16 GEMM "
        f"{ceilings.get('bf16_tflops') or 0:.0f} TFLOP/s.",
        "",
        f"Command: `{merged['command']}`",
        "",
        "Client-side latency per call (µs), every call of every client thread; throughput in answered "
        "calls/s. Activations bf16 [16384, 4096] registered over CUDA IPC (*_ipc) or R rows sent "
        "inline; echo carries the score_ipc request's size and the response's size.",
    ]
    targets: list[str] = []
    for label in ix.labels or [""]:
        title = f" — server '{label}'" if label else ""
        lines += ["", f"## Unary: Score vs echo (closed loop){title}", ""]
        lines += unary_table(ix, label, targets)
        stream = stream_table(ix, label, targets)
        if len(stream) > 2:
            lines += ["", f"## ScoreStream vs bidi echo ping-pong (closed loop){title}", ""] + stream
    lines += open_loop_table(records)
    lines += labels_table(ix, records)
    for r in records:
        if error_count(r):
            s = r["shape"]
            targets.append(f"- ERRORS: {r['impl']} {s['transport']} {load_text(load_key(r))} R={s['R']} "
                           f"P={s['P']}: {r['errors']} {r.get('first_errors', r.get('first_error', ''))}")
    lines += ["", "## Targets", ""] + targets + [""]
    with open(args.md, "w") as f:
        f.write("\n".join(lines))
    print("\n".join(["## Targets"] + targets))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
