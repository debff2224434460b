"""The decode-loop benchmark's results: the workers' JSON lines (one per timed run) become
records in the project's results format, the issue's targets with their measured values, a
markdown table and a plot.

Plain Python (the plot needs matplotlib, and is skipped without it): tests/python checks it on
synthetic runs.
"""

from __future__ import annotations

import json
import math
import statistics

IMPLS = ("none", "in_process", "sidecar_sync", "sidecar_async", "sidecar_async_ring1")
MODES = ("graph", "eager")
KEPT_TARGET = 0.98  # under MPS, sidecar_async keeps >= 98% of the no-scoring throughput
CALL_TARGET_US = 25.0  # client CPU time per score_async call, p50


def percentile(values, q: float) -> float | None:
    """The q-th percentile (0..100), linearly interpolated between order statistics (numpy's
    default method)."""
    ordered = sorted(values)
    if not ordered:
        return None
    position = (len(ordered) - 1) * q / 100
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def _p50_p99(values) -> dict | None:
    return None if not values else {"p50": _r(percentile(values, 50)),
                                     "p99": _r(percentile(values, 99))}


def _r(x, digits: int = 2):
    return None if x is None else round(x, digits)


def read_lines(path: str) -> list[dict]:
    """The workers' JSON lines; a last line cut short (a worker stopped mid-write) is dropped."""
    lines = []
    with open(path) as f:
        for text in f:
            try:
                lines.append(json.loads(text))
            except json.JSONDecodeError:
                pass
    return lines


def aggregate(runs: list[dict]) -> list[dict]:
    """One record per (impl, batch, mode, mps) from its timed runs.

    tokens_per_s is the median over repeats of batch x steps / the run's total time; step_us
    p50/p99 pool every step of every repeat; mean_step_us is the median over repeats of a run's
    total / steps. added_us_per_step and kept compare with `none` of the same batch, mode and
    MPS setting.
    """
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        key = (run["impl"], run["batch"], run["mode"], bool(run["mps"]))
        groups.setdefault(key, []).append(run)
    records = []
    for (impl, batch, mode, mps), group in groups.items():
        tokens = [batch * r["steps"] / (r["total_us"] * 1e-6) for r in group]
        means = [r["total_us"] / r["steps"] for r in group]
        steps = [x for r in group for x in r["step_us"]]
        record = {
            "bench": "decode_loop", "impl": impl, "dtype": "bf16",
            "shape": {"batch": batch, "mode": mode, "mps": mps},
            "graph_us_p50": None, "eager_us_p50": None,
            "tokens_per_s": _r(statistics.median(tokens), 1),
            "tokens_per_s_runs": [_r(t, 1) for t in tokens],
            "step_us": {"p50": _r(percentile(steps, 50)), "p99": _r(percentile(steps, 99))},
            "mean_step_us": _r(statistics.median(means)),
            "steps": group[0]["steps"], "repeats": len(group), "ring": group[0].get("ring"),
            "server_mps": group[0].get("server_mps"), "worker_mps": group[0].get("worker_mps"),
            "added_us_per_step": None, "kept": None,
        }
        calls = [x for r in group for x in r.get("call_us", [])]
        if calls:
            # Wall time of the call on the decode thread: for sidecar_async the client's CPU cost
            # per request; for sidecar_sync the whole blocking call (host sync + RPC).
            record["score_call_us"] = _p50_p99(calls)
        waits = [x for r in group for x in r.get("wait_us", [])]
        if waits:
            record["wait_stream_call_us"] = _p50_p99(waits)
        if any("event_pair_reused_before_wait" in r for r in group):
            record["event_pair_reused_before_wait"] = sum(
                r.get("event_pair_reused_before_wait", 0) for r in group)
        checks = [r["check"] for r in group if "check" in r]
        if checks:
            errors = [c["max_rel_err"] for c in checks]
            record["check"] = {
                "steps": sum(c["steps"] for c in checks),
                "max_rel_err": None if None in errors else max(errors),
                "tolerance": checks[0]["tolerance"],
                "ok": all(c["ok"] for c in checks),
            }
        records.append(record)
    baseline = {_cell(r): r for r in records if r["impl"] == "none"}
    for record in records:
        none = baseline.get(_cell(record))
        if none is not None and record["impl"] != "none":
            record["added_us_per_step"] = _r(record["mean_step_us"] - none["mean_step_us"])
            record["kept"] = _r(record["tokens_per_s"] / none["tokens_per_s"], 4)
    records.sort(key=_order)
    return records


def _cell(record: dict) -> tuple:
    s = record["shape"]
    return (s["batch"], s["mode"], s["mps"])


def _order(record: dict) -> tuple:
    s = record["shape"]
    impl = IMPLS.index(record["impl"]) if record["impl"] in IMPLS else len(IMPLS)
    return (MODES.index(s["mode"]) if s["mode"] in MODES else 2, not s["mps"], s["batch"], impl)


def _find(records, impl, batch, mode, mps):
    for r in records:
        if r["impl"] == impl and _cell(r) == (batch, mode, mps):
            return r
    return None


def _label(record: dict, mps: bool = True) -> str:
    batch, mode, on = _cell(record)
    return f"{mode} b={batch}" + (f" mps={'on' if on else 'off'}" if mps else "")


def targets(records: list[dict], batches=(1, 8, 32, 64), modes=MODES) -> list[dict]:
    """The issue's targets, each with its measured values and whether it is met. A cell that was
    not measured counts as not met: a target is claimed only where it was measured."""
    kept, versus, kept_missing, versus_missing = {}, {}, [], []
    for mode in modes:
        for batch in batches:
            scored = _find(records, "sidecar_async", batch, mode, True)
            tap = _find(records, "in_process", batch, mode, True)
            if scored is None or scored["kept"] is None:
                kept_missing.append(f"{mode} b={batch}")
            else:
                kept[f"{mode} b={batch}"] = scored["kept"]
            if scored is None or tap is None:
                versus_missing.append(f"{mode} b={batch}")
            else:
                versus[f"{mode} b={batch}"] = _r(scored["tokens_per_s"] / tap["tokens_per_s"], 4)
    calls = {_label(r): r["score_call_us"]["p50"] for r in records
             if r["impl"] == "sidecar_async" and r.get("score_call_us")}
    cost = {_label(r, mps=False): {"kept": r["kept"], "added_us_per_step": r["added_us_per_step"]}
            for r in records if r["impl"] == "sidecar_async" and not r["shape"]["mps"]}
    checked = [r for r in records if "check" in r]
    return [{
        "target": "MPS: sidecar_async keeps >= 98% of no-scoring tokens/s, every batch and mode",
        "measured": kept, "missing": kept_missing,
        "met": bool(kept) and not kept_missing and all(v >= KEPT_TARGET for v in kept.values()),
    }, {
        "target": "MPS: sidecar_async is never slower than in_process (tokens/s ratio >= 1)",
        "measured": versus, "missing": versus_missing,
        "met": bool(versus) and not versus_missing and all(v >= 1.0 for v in versus.values()),
    }, {
        "target": "client CPU time per score_async call <= 25 us p50",
        "measured": calls, "missing": [] if calls else ["no sidecar_async run"],
        "met": bool(calls) and all(v <= CALL_TARGET_US for v in calls.values()),
    }, {
        "target": "without MPS: the cost is measured and stated (sidecar_async)",
        "measured": cost, "missing": [] if cost else ["no run without MPS"], "met": None,
    }, {
        "target": "every scored step checked agrees with float64 scores of the same hidden states",
        "measured": {f"{r['impl']} {_label(r)}": r["check"]["max_rel_err"] for r in checked},
        "missing": [] if checked else ["no check ran"],
        "met": bool(checked) and all(r["check"]["ok"] for r in checked),
    }]


def noise(records: list[dict]) -> dict:
    """Per mode, the largest spread of `none`'s tokens/s between repeats of one cell ((max - min)
    / median): a difference between variants smaller than this is not resolved by the run."""
    spread = {}
    for r in records:
        runs = r["tokens_per_s_runs"]
        if r["impl"] == "none" and len(runs) > 1:
            value = (max(runs) - min(runs)) / statistics.median(runs)
            mode = r["shape"]["mode"]
            spread[mode] = _r(max(spread.get(mode, 0.0), value), 4)
    return spread


def document(lines: list[dict], *, git: str, date: str, command: str) -> dict:
    """The results file: the project's format plus the model, the method, notes and errors."""
    runs = [line for line in lines if line["type"] == "run"]
    metas = [line for line in lines if line["type"] == "meta"]
    records = aggregate(runs)
    ceilings = next(({"copy_gbps": m["copy_gbps"], "bf16_tflops": m["bf16_tflops"]}
                     for m in metas if m.get("what") == "ceilings"),
                    {"copy_gbps": None, "bf16_tflops": None})
    model = next((m for m in metas if m.get("what") == "model"), {})
    servers = [m for m in metas if m.get("what") == "server"]
    batches = sorted({r["shape"]["batch"] for r in records}) or [1, 8, 32, 64]
    modes = [m for m in MODES if any(r["shape"]["mode"] == m for r in records)] or list(MODES)
    return {
        "device": model.get("device"),
        "git": git, "date": date, "command": command, "ceilings": ceilings,
        "model": {k: model.get(k) for k in ("params", "config", "dtype", "prompt_len", "probes",
                                            "attention", "torch")},
        "servers": [{k: s.get(k) for k in ("mps", "server_mps", "worker_mps", "version",
                                           "server_git", "device")} for s in servers],
        "records": records,
        "targets": targets(records, batches, modes),
        "none_repeat_spread": noise(records),
        "notes": [f"MPS {'on' if line.get('mps') else 'off'}: {line['message']}"
                  for line in lines if line["type"] == "note"],
        "errors": [f"MPS {'on' if line.get('mps') else 'off'}: {line['where']}: {line['message']}"
                   for line in lines if line["type"] == "error"],
    }


def failed(doc: dict) -> list[str]:
    """Why the run fails: errors, no timed run at all, or a scored step whose check failed."""
    reasons = list(doc["errors"])
    if not doc["records"]:
        reasons.append("no timed run finished")
    for r in doc["records"]:
        if "check" in r and not r["check"]["ok"]:
            reasons.append(f"check failed: {r['impl']} {_cell(r)}: {r['check']}")
    return reasons


def _fmt(x, spec: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def markdown(doc: dict) -> str:
    model = doc["model"]
    ceilings = doc["ceilings"]
    config = model.get("config") or {}
    lines = [
        "# Decode loop: probe scoring every step, in process and through the sidecar",
        "",
        f"Device: {doc['device']}; git {doc['git']}; {doc['date']}; ceilings (same run): copy "
        f"{_fmt(ceilings['copy_gbps'], '.0f')} GB/s, bf16 GEMM "
        f"{_fmt(ceilings['bf16_tflops'], '.0f')} TFLOP/s.",
        "",
        f"Command: `{doc['command']}`",
        "",
    ]
    if doc.get("complete") is False:
        lines += ["**Partial results**: written while the run was still going (or it was stopped "
                  "before its end).", ""]
    lines += [
        f"Model: a Llama-style `transformers` model with random weights, "
        f"{_fmt((model.get('params') or 0) / 1e9, '.2f')}B parameters (hidden "
        f"{config.get('hidden_size')}, {config.get('num_hidden_layers')} layers, "
        f"{config.get('num_attention_heads')}/{config.get('num_key_value_heads')} heads, vocab "
        f"{config.get('vocab_size')}), bf16, static KV cache; a {model.get('prompt_len')}-token "
        f"random prompt, then greedy decoding. Probes: P={model.get('probes')} over the final-norm "
        "hidden state of every sequence at every step.",
        "",
        "Modes: `graph` replays a CUDA graph of one decode step (argmax and the next ids inside); "
        "`eager` runs the same step through the model's forward. The host never waits for the GPU "
        "inside the loop unless the variant does (`sidecar_sync`). Variants run interleaved "
        "(each repeat in a rotated order) and repeated; tokens/s is the median over repeats, "
        "step p50/p99 pool all steps (CUDA events between steps). `kept` = tokens/s over `none`'s "
        "(same batch, mode, MPS); `added` = mean step time minus `none`'s. `call` is the wall time "
        "of the client call on the decode thread (score_async: its CPU cost; score: the whole "
        "blocking call). Scored variants copy the hidden state and the scores of 8 steps per "
        "run into a history on the GPU (checked after the run against float64 scores of the same "
        "hidden states); `none` copies nothing. Without MPS the two processes' contexts are "
        "time-sliced.",
        "",
        "| mode | MPS | batch | impl | tokens/s | kept | added µs/step | step p50 µs "
        "| step p99 µs | call p50 / p99 µs | steps x repeats | check (max rel err) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        s = r["shape"]
        call = r.get("score_call_us")
        check = r.get("check")
        checked = "—" if not check else (("ok " if check["ok"] else "FAILED ")
                                        + _fmt(check["max_rel_err"], ".1e", "NaN"))
        lines.append(
            f"| {s['mode']} | {'on' if s['mps'] else 'off'} | {s['batch']} | {r['impl']} | "
            f"{_fmt(r['tokens_per_s'], '.0f')} | {_fmt(r['kept'], '.3f')} | "
            f"{_fmt(r['added_us_per_step'])} | {_fmt(r['step_us']['p50'])} | "
            f"{_fmt(r['step_us']['p99'])} | "
            f"{'—' if not call else _fmt(call['p50']) + ' / ' + _fmt(call['p99'])} | "
            f"{r['steps']} x {r['repeats']} | "
            f"{checked} |")
    lines += ["", "## Targets", ""]
    for t in doc["targets"]:
        state = {True: "met", False: "NOT met", None: "stated"}[t["met"]]
        lines.append(f"- **{t['target']}**: {state}.")
        if t["measured"]:
            lines.append("  " + "; ".join(f"{k}: {_value(v)}" for k, v in t["measured"].items()))
        if t["missing"]:
            lines.append("  Not measured: " + ", ".join(t["missing"]) + ".")
    if doc["none_repeat_spread"]:
        lines.append("- Noise: the largest spread of `none`'s tokens/s between repeats of a cell "
                     "(max - min over median): " + "; ".join(
                         f"{mode} {100 * v:.1f}%" for mode, v in doc["none_repeat_spread"].items())
                     + ". Differences smaller than that are not resolved.")
    reuse = [r for r in doc["records"] if r.get("event_pair_reused_before_wait")]
    if reuse:
        lines += ["", "## Event-pair reuse", "",
                  "Requests that were given the IPC event pair of an earlier request whose scores "
                  "the stream had not yet waited for (the client reuses a pair once the server "
                  "has answered). The earlier wait then waits for the later request too: correct, "
                  "but it costs the overlap the second hidden-state slot is there for.", ""]
        for r in reuse:
            s = r["shape"]
            lines.append(f"- {r['impl']} {_label(r)}: {r['event_pair_reused_before_wait']} of "
                         f"{r['steps'] * r['repeats']} requests")
    if doc["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if doc["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in doc["errors"]]
    return "\n".join(lines) + "\n"


def _value(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x, '.3f') if k == 'kept' else _fmt(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 0.01 else f"{v:.3f}" if v < 10 else f"{v:.1f}"
    return "—" if v is None else str(v)


def plot(doc: dict, path: str) -> bool:
    """tokens/s per variant against batch, one panel per mode x MPS setting; False without
    matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    panels = [(mode, mps) for mode in MODES for mps in (True, False)]
    fig, axes = plt.subplots(2, 2, figsize=(11, 8), squeeze=False)
    for ax, (mode, mps) in zip(axes.flat, panels):
        for impl in IMPLS:
            points = sorted((r["shape"]["batch"], r["tokens_per_s"]) for r in doc["records"]
                            if r["impl"] == impl and _cell(r)[1:] == (mode, mps))
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=impl)
        ax.set_title(f"{mode}, MPS {'on' if mps else 'off'}")
        ax.set_xscale("log", base=2)
        batches = sorted({r["shape"]["batch"] for r in doc["records"]})
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_yscale("log")
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens/s")
        ax.grid(True, which="both", alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"Decode loop with probe scoring ({doc['device']}, git {doc['git'][:12]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
