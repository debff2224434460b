"""windowed.py's records, targets and markdown, in plain Python (CI checks them without torch).

A record (bench "decode_loop", impl "tap") holds, per (tap, batch, K): `kept` (tokens/s with the
tap over tokens/s without, the median over sandwiches) and `kept_interval` (its bootstrap 95%
interval), the step times behind it, where a window's extra time lands (interleave.decompose),
the host time of the tap's step() calls, the GPU and host latency from a window's close to its
scores, the tap's window counts, and the float64 check of one window.
"""

from __future__ import annotations

import json
import math
import pathlib
import statistics

import interleave

TARGETS = {16: 0.990, 64: 0.997}  # kept, at every batch
LATENCY_TARGET_MS = 5.0  # a K=64 window's scores in host memory after its close on the GPU, p99


def _pct(values, q: float):
    values = sorted(v for v in values if v is not None and not math.isnan(v))
    if not values:
        return None
    return values[min(len(values) - 1, max(0, math.ceil(q / 100 * len(values)) - 1))]


def _r(x, digits: int = 2):
    return None if x is None else round(x, digits)


def record(blocks: list, window: int, batch: int, calls: list[float], windows: list,
           stats: dict) -> dict:
    """The record of one measurement: `blocks` [(kind, per-step µs)] in schedule order, the host
    µs of each tapped step() call, the windows the tap delivered meanwhile, its counts."""
    ratios = interleave.sandwich_ratios(blocks, window)
    kept, interval = interleave.median_interval(ratios)
    means = {kind: [interleave.counted_mean_us(s, window) for k, s in blocks if k == kind]
             for kind in ("base", "scored")}
    base_us, scored_us = (statistics.median(means[k]) for k in ("base", "scored"))
    closing = calls[window - 1::window]
    others = [c for i, c in enumerate(calls) if i % window != window - 1]
    gpu_ms = [w.host_memory_latency_s * 1e3 for w in windows
              if getattr(w, "host_memory_latency_s", None) is not None]
    host_ms = [w.latency_s * 1e3 for w in windows]
    return {
        "bench": "decode_loop", "impl": "tap", "dtype": "bf16",
        "kept": round(kept, 5), "kept_interval": [round(x, 5) for x in interval],
        "sandwiches": len(ratios), "kept_per_sandwich": [round(x, 5) for x in ratios],
        "kept_spread": round(max(ratios) - min(ratios), 5),
        "base_step_us": round(base_us, 2), "tapped_step_us": round(scored_us, 2),
        "base_tokens_per_s": round(batch / base_us * 1e6, 1),
        "tapped_tokens_per_s": round(batch / scored_us * 1e6, 1),
        "counted_steps_per_block": len(blocks[0][1]) - window,
        "where": interleave.decompose(blocks, window),
        "step_call_us": {"p50": _r(_pct(others, 50)), "p99": _r(_pct(others, 99)),
                         "closing_p50": _r(_pct(closing, 50)),
                         "closing_p99": _r(_pct(closing, 99))},
        "window_to_host_memory_ms": {"p50": _r(_pct(gpu_ms, 50), 3),
                                     "p99": _r(_pct(gpu_ms, 99), 3), "n": len(gpu_ms)},
        "window_to_delivery_ms": {"p50": _r(_pct(host_ms, 50), 3),
                                  "p99": _r(_pct(host_ms, 99), 3), "n": len(host_ms)},
        "tap": stats,
    }


def targets(doc: dict) -> list[dict]:
    """Per tap: kept >= TARGETS[K] at every batch measured (by the median; the interval's lower
    bound beside it), and the K=64 windows' p99 latency to host memory."""
    out = []
    recs = doc.get("records", [])
    for tap in sorted({r["shape"]["tap"] for r in recs}):
        for window, threshold in TARGETS.items():
            rows = [r for r in recs if r["shape"]["tap"] == tap and r["shape"]["window"] == window]
            if not rows:
                continue
            values = {r["shape"]["batch"]: [r["kept"], r["kept_interval"][0]] for r in rows}
            out.append({"target": f"{tap} tap, K={window}: kept >= {threshold} at every batch",
                        "ok": all(v[0] >= threshold for v in values.values()),
                        "value": values})
        rows = [r for r in recs if r["shape"]["tap"] == tap and r["shape"]["window"] == 64]
        p99 = [r["window_to_host_memory_ms"]["p99"] for r in rows]
        if p99 and all(v is not None for v in p99):
            out.append({"target": f"{tap} tap, K=64: scores in host memory <= "
                                  f"{LATENCY_TARGET_MS} ms after the window's close, p99",
                        "ok": max(p99) <= LATENCY_TARGET_MS,
                        "value": {r["shape"]["batch"]: r["window_to_host_memory_ms"]["p99"]
                                  for r in rows}})
    return out


def failed(doc: dict) -> list[str]:
    """Why the run failed: a score check, a failed or lost window; a missed target is reported,
    not a failure."""
    reasons = []
    for r in doc.get("records", []):
        label = f"{r['variant']} b={r['shape']['batch']}"
        if not r.get("check", {}).get("ok"):
            reasons.append(f"{label}: scores off float64 ({r.get('check')})")
        if r["tap"].get("windows_failed") or r["tap"].get("windows_lost"):
            reasons.append(f"{label}: windows failed or lost ({r['tap']})")
    return reasons


def markdown(doc: dict) -> str:
    ceilings = doc.get("ceilings") or {}
    lines = ["# Decode loop: the tap's cost, windows interleaved", "",
             f"Device: {doc.get('device')}; git {doc['git']}; {doc['date']}; torch "
             f"{doc.get('torch')}; no MPS (the sidecar in its own context); ceilings (same run): "
             f"copy {ceilings.get('copy_gbps')} GB/s, bf16 GEMM {ceilings.get('bf16_tflops')} "
             f"TFLOP/s. Command: `{doc['command']}`.", "",
             "Per (tap, batch, K): blocks of windows without the tap and with it, alternating "
             "(none, tapped, none, ...), each from the same decoder state; every step timed by "
             "CUDA events; a block's first window not counted (the other loop's last Score runs "
             "in it). `kept`: the loop without the tap's step time over the tapped loop's, per "
             "tapped block against the mean of the blocks either side, median over blocks "
             "[bootstrap 95% interval]. `write`: extra µs in every step (the second half of a "
             "window); `close+Score`: the rest of a window's extra time (its close and the "
             "sidecar's Score, time-sliced against the steps after it). `to host`: GPU time from a "
             "window's close to its scores in host memory, p50/p99; `delivered`: host time from "
             "step() closing it to its delivery, p99.", "",
             "| tap | batch | K | none µs/step | tapped µs/step | kept [95%] | spread | blocks | "
             "write µs/step | close+Score µs/window | step() µs p50 / closing p50 | to host ms "
             "p50 / p99 | delivered ms p99 | check |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in sorted(doc.get("records", []), key=lambda r: (r["shape"]["tap"], r["shape"]["batch"],
                                                           r["shape"]["window"])):
        s, w, c = r["shape"], r["where"], r["step_call_us"]
        lo, hi = r["kept_interval"]
        check = r.get("check", {})
        lines.append(
            f"| {s['tap']} | {s['batch']} | {s['window']} | {r['base_step_us']:.1f} | "
            f"{r['tapped_step_us']:.1f} | {r['kept']:.4f} [{lo:.4f}, {hi:.4f}] | "
            f"{r['kept_spread']:.4f} | {r['sandwiches']} | {w['steady_us_per_step']:.2f} | "
            f"{w['after_close_us_per_window']:.1f} | {c['p50']} / {c['closing_p50']} | "
            f"{r['window_to_host_memory_ms']['p50']} / {r['window_to_host_memory_ms']['p99']} | "
            f"{r['window_to_delivery_ms']['p99']} | "
            f"{'ok' if check.get('ok') else 'FAILED'} {_r(check.get('max_rel_err'), 7)} |")
    lines += ["", "## Targets", ""]
    for t in targets(doc):
        lines.append(f"- {'met' if t['ok'] else 'MISSED'}: {t['target']}: {t['value']}")
    for reason in failed(doc):
        lines.append(f"- FAILED: {reason}")
    for p in doc.get("profiles", []):
        lines += ["", f"## Kernels of one step: {p['tap']} loop, batch {p['batch']}", "",
                  "GPU µs per replay (torch.profiler); the tapped graphs' kernels that the "
                  "graph without the tap lacks, or runs a different number of times:", ""]
        base = {k[0]: k for k in p["base"]["kernels"]}
        total = sum(k[2] for k in p["base"]["kernels"])
        lines.append(f"- without the tap: {len(base)} kernels, {total:.1f} µs")
        for key in sorted(k for k in p if k.startswith("k")):
            kernels = p[key]["kernels"]
            extra = [k for k in kernels if k[0] not in base or base[k[0]][1] != k[1]]
            gone = [name for name in base if name not in {k[0] for k in kernels}]
            lines.append(f"- K={key[1:]}: {sum(k[2] for k in kernels):.1f} µs; added or changed: "
                         + (", ".join(f"`{k[0][:90]}` x{k[1]} {k[2]} µs" for k in extra) or "none")
                         + ("; gone: " + ", ".join(f"`{n[:90]}`" for n in gone) if gone else ""))
    if doc.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if not doc.get("complete"):
        lines += ["", "**Incomplete**: the run stopped before its last measurement."]
    return "\n".join(lines) + "\n"


def write(doc: dict, out_dir: pathlib.Path) -> None:
    doc["targets"] = targets(doc)
    (out_dir / "decode_loop_windowed.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "decode_loop_windowed.md").write_text(markdown(doc))
