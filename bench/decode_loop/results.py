"""The decode-loop benchmark's results: the workers' JSON lines (one per timed run) become
records in the project's results format, the decode loop's targets (targets() below: the
fraction of the untapped loop's tokens/s each tap keeps) with their measured values, a
markdown table and a plot.

Plain Python (the plot needs matplotlib, and is skipped without it): tests/python checks it on
synthetic runs.
"""

from __future__ import annotations

import json
import math
import statistics

IMPLS = ("none", "in_process", "tap", "sidecar_sync", "sidecar_async")
MODES = ("graph", "eager")
# Issue targets: tokens/s kept against the loop without MPS and without scoring, no MPS.
KEPT_TARGETS = {16: 0.993, 64: 0.998}
KEPT_MOONSHOT = 0.995  # the graph-captured tap at K=16
DECODE_CPU_TARGET_US = 3.0  # decode-thread time per step, amortised, K=16
HOST_P99_TARGET_MS = 2.0  # scores in host memory after their window closes, p99


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


def _key(run: dict) -> tuple:
    return (run.get("variant", run["impl"]), run["batch"], run["mode"], bool(run["mps"]))


def aggregate(runs: list[dict]) -> list[dict]:
    """One record per (variant, batch, mode, mps) from its timed runs.

    tokens_per_s is the median over repeats of batch x steps / the run's total time; step_us
    p50/p99 pool every step of every repeat; mean_step_us is the median over repeats of a run's
    total / steps. `kept` compares with `none` of the same batch, mode and MPS setting,
    `kept_vs_no_mps` with `none` of the same batch and mode without MPS (the loop a user runs
    without the sidecar); added_us_per_step is against the former.
    """
    groups: dict[tuple, list[dict]] = {}
    for run in runs:
        groups.setdefault(_key(run), []).append(run)
    records = []
    for (name, batch, mode, mps), group in groups.items():
        first = group[0]
        tokens = [batch * r["steps"] / (r["total_us"] * 1e-6) for r in group]
        means = [r["total_us"] / r["steps"] for r in group]
        steps = [x for r in group for x in r["step_us"]]
        shape = {"batch": batch, "mode": mode, "mps": mps}
        if first["impl"] == "tap":
            shape.update(window=first["window"], tap=first["tap"], submit=first["submit"])
        record = {
            "bench": "decode_loop", "impl": first["impl"], "variant": name, "dtype": "bf16",
            "shape": shape, "graph_us_p50": None, "eager_us_p50": None,
            "tokens_per_s": _r(statistics.median(tokens), 1),
            "tokens_per_s_runs": [_r(t, 1) for t in tokens],
            "step_us": {"p50": _r(percentile(steps, 50)), "p99": _r(percentile(steps, 99))},
            "mean_step_us": _r(statistics.median(means)),
            "steps": first["steps"], "repeats": len(group),
            "server_mps": first.get("server_mps"), "worker_mps": first.get("worker_mps"),
            "added_us_per_step": None, "kept": None, "kept_vs_no_mps": None,
        }
        # On the decode thread per step: a tap's write (when eager) and step(); the whole
        # score_async or blocking score call otherwise. CPU time of the thread (what the calls
        # cost the host) and wall time (which also counts waits, e.g. for a free host copy).
        for field, name in (("call_cpu_us", "decode_cpu_us_per_step"),
                            ("call_us", "decode_wall_us_per_step")):
            calls = [x for r in group for x in r.get(field, [])]
            if calls:
                record[name] = {"mean": _r(statistics.fmean(calls)), **_p50_p99(calls)}
        if first["impl"] == "tap":
            record.update(_latencies(group))
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
    baseline = {(r["shape"]["batch"], r["shape"]["mode"], r["shape"]["mps"]): r
                for r in records if r["impl"] == "none"}
    for record in records:
        s = record["shape"]
        none = baseline.get((s["batch"], s["mode"], s["mps"]))
        if none is not None and record["impl"] != "none":
            record["added_us_per_step"] = _r(record["mean_step_us"] - none["mean_step_us"])
            record["kept"] = _r(record["tokens_per_s"] / none["tokens_per_s"], 4)
        plain = baseline.get((s["batch"], s["mode"], False))
        if plain is not None:
            record["kept_vs_no_mps"] = _r(record["tokens_per_s"] / plain["tokens_per_s"], 4)
    records.sort(key=_order)
    return records


def _latencies(group: list[dict]) -> dict:
    """A tap's score latency, from its runs' windows ([steps, device s, host memory s, host-clock
    s] each). A row written at position j of an n-step window waits n - 1 - j steps for the
    window to close, then the window's latency: per row, in steps and in ms (steps at the run's
    mean step time), to the scores in device memory and in host memory."""
    device_ms, host_ms, in_steps, window_host_ms, delivered_ms = [], [], [], [], []
    errors = 0
    for run in group:
        step_ms = run["total_us"] / run["steps"] * 1e-3
        for n, device_s, host_s, clock_s in run.get("windows", []):
            if device_s is None:  # a host ring (dry run): no GPU clock
                continue
            window_host_ms.append(host_s * 1e3)
            delivered_ms.append(clock_s * 1e3)
            for j in range(n):
                wait = n - 1 - j
                device_ms.append(wait * step_ms + device_s * 1e3)
                host_ms.append(wait * step_ms + host_s * 1e3)
                in_steps.append(wait + device_s * 1e3 / step_ms)
        errors += len(run.get("window_errors", []))
    return {
        "score_latency_ms": _p50_p99(device_ms),
        "host_score_latency_ms": _p50_p99(host_ms),
        "score_latency_steps": _p50_p99(in_steps),
        # From the window's close on the GPU to its scores in host memory, and host time from
        # step() closing it to the delivery thread having them (the host may run ahead of the
        # GPU by several steps: that wait is in the second).
        "window_to_host_memory_ms": _p50_p99(window_host_ms),
        "window_delivered_ms": _p50_p99(delivered_ms),
        "windows": sum(len(r.get("windows", [])) for r in group),
        "window_errors": errors,
    }


def _cell(record: dict) -> tuple:
    s = record["shape"]
    return (s["batch"], s["mode"], s["mps"])


def _order(record: dict) -> tuple:
    s = record["shape"]
    impl = IMPLS.index(record["impl"]) if record["impl"] in IMPLS else len(IMPLS)
    return (MODES.index(s["mode"]) if s["mode"] in MODES else 2, s["mps"], s["batch"], impl,
            s.get("tap") or "", s.get("submit") or "", s.get("window") or 0)


def _find(records, variant, batch, mode, mps):
    for r in records:
        if r["variant"] == variant and _cell(r) == (batch, mode, mps):
            return r
    return None


def _label(record: dict, mps: bool = True) -> str:
    batch, mode, on = _cell(record)
    return f"{mode} b={batch}" + (f" mps={'on' if on else 'off'}" if mps else "")


def _kept_target(records, variant, threshold, batches, modes) -> dict:
    measured, missing = {}, []
    for mode in modes:
        for batch in batches:
            r = _find(records, variant, batch, mode, False)
            if r is None or r["kept_vs_no_mps"] is None:
                missing.append(f"{mode} b={batch}")
            else:
                measured[f"{mode} b={batch}"] = r["kept_vs_no_mps"]
    return {"target": f"no MPS: {variant} keeps >= {threshold:.1%} of the no-MPS no-scoring "
                      f"tokens/s, every batch",
            "measured": measured, "missing": missing,
            "met": bool(measured) and not missing and all(v >= threshold
                                                          for v in measured.values())}


def targets(records: list[dict], batches=(1, 8, 32, 64), modes=("graph",)) -> list[dict]:
    """The decode loop's targets, each with its measured values and whether it is met. A cell that was
    not measured counts as not met: a target is claimed only where it was measured."""
    graph_modes = [m for m in modes if m == "graph"] or list(modes)
    out = [_kept_target(records, f"tap_k{k}", v, batches, graph_modes)
           for k, v in KEPT_TARGETS.items()]
    out.append(_kept_target(records, "tap_k16_graph", KEPT_TARGETS[16], batches, ["graph"]))
    moonshot = _kept_target(records, "tap_k16_graph", KEPT_MOONSHOT, batches, ["graph"])
    moonshot["target"] = "moonshot: " + moonshot["target"]
    out.append(moonshot)
    cpu = {f"{r['variant']} {_label(r)}": r["decode_cpu_us_per_step"]["mean"] for r in records
           if r["variant"] in ("tap_k16", "tap_k16_graph") and r.get("decode_cpu_us_per_step")}
    graph_cpu = {k: v for k, v in cpu.items() if "graph" in k.split()[0]}
    out.append({"target": f"decode-thread time per step <= {DECODE_CPU_TARGET_US:g} us at K=16, "
                          "amortised (graph-captured tap: step() only)",
                "measured": cpu, "missing": [] if graph_cpu else ["no tap_k16_graph run"],
                "met": bool(graph_cpu) and all(v <= DECODE_CPU_TARGET_US
                                               for v in graph_cpu.values())})
    host = {f"{r['variant']} {_label(r)}": r["window_to_host_memory_ms"]["p99"] for r in records
            if r["impl"] == "tap" and r.get("window_to_host_memory_ms")}
    out.append({"target": f"scores in host memory <= {HOST_P99_TARGET_MS:g} ms after their "
                          "window closes, p99",
                "measured": host, "missing": [] if host else ["no tap run"],
                "met": bool(host) and all(v <= HOST_P99_TARGET_MS for v in host.values())})
    checked = [r for r in records if "check" in r]
    out.append({
        "target": "every scored step checked agrees with float64 scores of the same hidden states",
        "measured": {f"{r['variant']} {_label(r)}": r["check"]["max_rel_err"] for r in checked},
        "missing": [] if checked else ["no check ran"],
        "met": bool(checked) and all(r["check"]["ok"] for r in checked)})
    return out


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
        "profiles": [{k: line[k] for k in ("mps", "batch", "replays", "kernels")}
                     for line in lines if line["type"] == "profile"],
        "none_repeat_spread": noise(records),
        "notes": [f"MPS {'on' if line.get('mps') else 'off'}: {line['message']}"
                  for line in lines if line["type"] == "note"],
        "errors": [f"MPS {'on' if line.get('mps') else 'off'}: {line['where']}: {line['message']}"
                   for line in lines if line["type"] == "error"],
    }


def failed(doc: dict) -> list[str]:
    """Why the run fails: errors, no timed run at all, a scored step whose check failed, or a tap
    window that failed."""
    reasons = list(doc["errors"])
    if not doc["records"]:
        reasons.append("no timed run finished")
    for r in doc["records"]:
        if "check" in r and not r["check"]["ok"]:
            reasons.append(f"check failed: {r['variant']} {_cell(r)}: {r['check']}")
        if r.get("window_errors"):
            reasons.append(f"{r['window_errors']} tap windows failed: {r['variant']} {_cell(r)}")
    return reasons


def _fmt(x, spec: str = ".1f", none: str = "—") -> str:
    return none if x is None else format(x, spec)


def _pair(d, spec: str = ".1f") -> str:
    return "—" if not d else f"{_fmt(d.get('p50'), spec)} / {_fmt(d.get('p99'), spec)}"


def markdown(doc: dict) -> str:
    model = doc["model"]
    ceilings = doc["ceilings"]
    config = model.get("config") or {}
    lines = [
        "# Decode loop: what probe scoring costs, in process and through the sidecar's tap",
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
        "`graph` replays a CUDA graph of one decode step (argmax and the next ids inside). "
        "Variants (bench/decode_loop/variants.py): `none`; `in_process` (`addmm` inside the "
        "step); `tap_k<K>`: the sidecar through TorchClient.tap, one write of the step's rows "
        "into the tap's ring after each replay and one Score per window of K steps; `_graph`: "
        "the write captured inside the step's graph; `_host`: each window sent once its writes "
        "have landed. Variants run interleaved (each repeat in a rotated order) and repeated; "
        "tokens/s is the median over repeats, step p50/p99 pool all steps (CUDA events between "
        "steps). `kept` = tokens/s over `none`'s with the same MPS setting; **`vs no MPS`** = "
        "over `none`'s without MPS: what the loop keeps of what it runs today without the "
        "sidecar. `decode thread` = CPU time of the decode thread per step in the variant's calls "
        "(a tap's write and step(), amortised over its windows; the JSON also has their wall "
        "time). Score latency: "
        "from a row's step to its scores in device memory (p50 / p99 over rows); window -> host: "
        "from a window's close on the GPU to its scores in host memory. Scored variants copy 8 "
        "steps' hidden states on the GPU into a history, checked after the run against float64.",
        "",
        "| mode | MPS | batch | variant | tokens/s | kept | vs no MPS | added µs/step "
        "| step p50 / p99 µs | decode thread µs/step | score latency ms | window -> host ms "
        "| steps x repeats | check (max rel err) |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in doc["records"]:
        s = r["shape"]
        check = r.get("check")
        checked = "—" if not check else (("ok " if check["ok"] else "FAILED ")
                                        + _fmt(check["max_rel_err"], ".1e", "NaN"))
        cpu = r.get("decode_cpu_us_per_step")
        lines.append(
            f"| {s['mode']} | {'on' if s['mps'] else 'off'} | {s['batch']} | {r['variant']} | "
            f"{_fmt(r['tokens_per_s'], '.0f')} | {_fmt(r['kept'], '.4f')} | "
            f"{_fmt(r['kept_vs_no_mps'], '.4f')} | {_fmt(r['added_us_per_step'])} | "
            f"{_pair(r['step_us'])} | {'—' if not cpu else _fmt(cpu['mean'], '.2f')} | "
            f"{_pair(r.get('score_latency_ms'), '.2f')} | "
            f"{_pair(r.get('window_to_host_memory_ms'), '.2f')} | "
            f"{r['steps']} x {r['repeats']} | {checked} |")
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
                         f"{mode} {100 * v:.2f}%" for mode, v in doc["none_repeat_spread"].items())
                     + ". Differences smaller than that are not resolved.")
    lines += profile_table(doc.get("profiles") or [])
    if doc["notes"]:
        lines += ["", "## Notes", ""] + [f"- {n}" for n in doc["notes"]]
    if doc["errors"]:
        lines += ["", "## Errors", ""] + [f"- {e}" for e in doc["errors"]]
    return "\n".join(lines) + "\n"


def profile_table(profiles: list[dict], top: int = 15) -> list[str]:
    """MPS off against on: GPU time per kernel in one replay of the plain graphed step."""
    by_mps = {bool(p["mps"]): p for p in profiles}
    if not by_mps:
        return []
    off, on = by_mps.get(False), by_mps.get(True)
    tables = {k: {name: (count, us) for name, count, us in p["kernels"]}
              for k, p in by_mps.items()}
    total = {k: sum(us for _, us in t.values()) for k, t in tables.items()}
    count = {k: sum(c for c, _ in t.values()) for k, t in tables.items()}
    reference = off or on
    lines = ["", "## One graphed step's kernels, MPS off and on", "",
             f"torch.profiler (CUPTI) over {reference['replays']} replays of the plain step at "
             f"batch {reference['batch']}: GPU time per replay. Kernels: "
             + "; ".join(f"MPS {'on' if k else 'off'} {count[k]:.0f} per step, "
                         f"{total[k]:.0f} µs" for k in sorted(tables)) + ".", "",
             "| kernel | per step | MPS off µs | MPS on µs | on / off |", "|---|---|---|---|---|"]
    names = [k[0] for k in reference["kernels"][:top]]
    for name in names:
        c, us_off = tables.get(False, {}).get(name, (None, None))
        c_on, us_on = tables.get(True, {}).get(name, (None, None))
        ratio = None if not us_off or us_on is None else us_on / us_off
        short = name if len(name) <= 70 else name[:67] + "..."
        lines.append(f"| `{short}` | {_fmt(c if c is not None else c_on, '.0f')} | "
                     f"{_fmt(us_off)} | {_fmt(us_on)} | {_fmt(ratio, '.2f')} |")
    return lines


def _value(v) -> str:
    if isinstance(v, dict):
        return ", ".join(f"{k} {_fmt(x)}" for k, x in v.items())
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 0.01 else f"{v:.4f}" if v < 10 else f"{v:.1f}"
    return "—" if v is None else str(v)


def plot(doc: dict, path: str) -> bool:
    """Tokens/s kept against the no-MPS no-scoring loop, per variant against batch, one panel per
    MPS setting (graph mode); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, 2, figsize=(12, 5), squeeze=False, sharey=True)
    variants = sorted({r["variant"] for r in doc["records"] if r["impl"] != "none"})
    batches = sorted({r["shape"]["batch"] for r in doc["records"]})
    for ax, mps in zip(axes.flat, (False, True)):
        for variant in variants:
            points = sorted((r["shape"]["batch"], r["kept_vs_no_mps"]) for r in doc["records"]
                            if r["variant"] == variant and _cell(r)[1:] == ("graph", mps)
                            and r["kept_vs_no_mps"] is not None)
            if points:
                ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", label=variant)
        ax.set_title(f"graph mode, MPS {'on' if mps else 'off'}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(batches, [str(b) for b in batches])
        ax.minorticks_off()
        ax.set_xlabel("batch")
        ax.set_ylabel("tokens/s kept vs. no MPS, no scoring")
        ax.grid(True, alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=8)
    fig.suptitle(f"Decode loop with probe scoring ({doc['device']}, git {doc['git'][:12]})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
