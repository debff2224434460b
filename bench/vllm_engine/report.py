"""The vllm_engine benchmark's records, targets and markdown (plain Python + numpy).

records(): one record per (engine, batch) from the counted runs; `kept` is the median over
repetitions of the plugin's tokens/s over `none`'s in the same repetition (the engines ran one
after the other within it), with a bootstrap 95% interval of that median.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np

KEPT_TARGETS = {16: 0.990, 64: 0.997}  # tokens/s kept, every batch
ITL_P99_TARGET = 1.02  # inter-token latency p99 within 2% of the engine without the plugin
BOOTSTRAP = 4000


def _pct(values, q):
    return None if not values else round(float(np.percentile(values, q)), 2)


def _interval(ratios: list[float], seed: int = 0) -> list[float] | None:
    if len(ratios) < 2:
        return None
    rng = np.random.default_rng(seed)
    data = np.asarray(ratios)
    medians = np.median(data[rng.integers(0, len(data), (BOOTSTRAP, len(data)))], axis=1)
    return [round(float(np.percentile(medians, 2.5)), 4),
            round(float(np.percentile(medians, 97.5)), 4)]


def records(runs: list[dict], model: str, configs: dict) -> list[dict]:
    """`configs`: {engine name: its resolved configuration}."""
    counted = [r for r in runs if not r["warmup"]]
    groups: dict[tuple, list[dict]] = {}
    for r in counted:
        groups.setdefault((r["engine"], r["batch"]), []).append(r)
    out = []
    for (engine, batch), group in sorted(groups.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        window, config = group[0]["window"], configs[engine]
        tps = [r["tokens"] / r["wall_s"] for r in group]
        itl = [x for r in group for x in r["itl_us"]]
        ttft = [x for r in group for x in r["ttft_ms"]]
        out.append({
            "bench": "vllm_engine", "impl": "none" if window is None else "plugin",
            "dtype": "bf16",
            "shape": {"model": model, "batch": batch, "window": window,
                      "model_runner": group[0]["runner"],
                      "cudagraph_mode": config["cudagraph_mode"],
                      "async_scheduling": config["async_scheduling"]},
            "graph_us_p50": None, "eager_us_p50": None,
            "tokens_per_s": round(float(np.median(tps)), 1),
            "tokens_per_s_runs": [round(t, 1) for t in tps],
            "itl_us_p50": _pct(itl, 50), "itl_us_p99": _pct(itl, 99),
            "ttft_ms_p50": _pct(ttft, 50), "repetitions": len(group),
            "tokens_missing": sum(r["expected_tokens"] - r["tokens"] for r in group),
        })

    def per_rep(engine, batch):
        return {x["rep"]: x["tokens"] / x["wall_s"] for x in counted
                if x["engine"] == engine and x["batch"] == batch}

    by_cell = {(r["shape"]["batch"], r["shape"]["window"], r["shape"]["model_runner"]): r
               for r in out}
    for r in out:
        if r["impl"] != "plugin":
            continue
        batch = r["shape"]["batch"]
        mine = per_rep(f"plugin K={r['shape']['window']}", batch)
        for runner, field in (("V2", "kept"), ("V1", "kept_vs_v1_runner")):
            base = per_rep(f"none {runner}", batch)
            ratios = [mine[k] / base[k] for k in sorted(mine) if k in base]
            if not ratios:
                continue
            r[field] = round(float(np.median(ratios)), 4)
            r[field + "_interval_95"] = _interval(ratios)
            r[field + "_runs"] = [round(x, 4) for x in ratios]
            none = by_cell.get((batch, None, runner))
            if none and none["itl_us_p99"] and r["itl_us_p99"]:
                r["itl_p99_ratio" + ("" if runner == "V2" else "_vs_v1_runner")] = round(
                    r["itl_us_p99"] / none["itl_us_p99"], 4)
    return out


def targets(doc: dict) -> list[dict]:
    plugin = [r for r in doc["records"] if r.get("impl") == "plugin" and "kept" in r]
    found = []
    for window, threshold in KEPT_TARGETS.items():
        mine = [r for r in plugin if r["shape"]["window"] == window]
        found.append({
            "target": f"K={window}: tokens/s kept >= {threshold} at every batch",
            "measured": {r["shape"]["batch"]: [r["kept"], r["kept_interval_95"],
                                               r.get("kept_vs_v1_runner")] for r in mine},
            "met": bool(mine) and all(r["kept"] >= threshold for r in mine)})
    itl = [r for r in plugin if "itl_p99_ratio" in r]
    found.append({"target": f"inter-token latency p99 within {ITL_P99_TARGET - 1:.0%} of none",
                  "measured": {f"K={r['shape']['window']} b={r['shape']['batch']}":
                               r["itl_p99_ratio"] for r in itl},
                  "met": bool(itl) and all(r["itl_p99_ratio"] <= ITL_P99_TARGET for r in itl)})
    checks = [r for r in doc["records"] if "rows_expected" in r]
    if checks:
        found.append({"target": "every generated token scored once; max rel. error <= 2e-2",
                      "measured": {r["shape"]["model"] + " " + r["shape"]["cudagraph_mode"]:
                                   [r["rows_scored"], r["rows_expected"],
                                    round(r["max_rel_err"], 5)] for r in checks},
                      "met": all(r["rows_scored"] == r["rows_expected"]
                                 and r["max_rel_err"] <= 2e-2 for r in checks)})
    return found


def markdown(doc: dict) -> str:
    c = doc["ceilings"]
    lines = [f"# vLLM engine with and without the probe-sidecar plugin", "",
             f"Device: {doc['device']}; vLLM {doc.get('vllm')}; git {doc['git']}; {doc['date']};"
             f" ceilings (same run): copy {c['copy_gbps']} GB/s, bf16 GEMM {c['bf16_tflops']} "
             f"TFLOP/s. Command: `{doc['command']}`.", "",
             f"Engine: {doc.get('engine_config')}; complete: {doc['complete']}.", "",
             "`kept`: against the engine without the plugin on vLLM's default runner (V2); "
             "`vs V1`: against it on the V1 runner, which the plugin selects.", "",
             "| batch | engine | tokens/s | kept [95% interval] | vs V1 [95%] | ITL p50 µs | "
             "ITL p99 µs | p99 vs none | TTFT p50 ms | reps |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in doc["records"]:
        if "tokens_per_s" not in r:
            continue
        s = r["shape"]
        name = (f"none ({s['model_runner']} runner)" if r["impl"] == "none"
                else f"plugin K={s['window']}")
        kept = "" if "kept" not in r else f"{r['kept']:.4f} {r.get('kept_interval_95')}"
        v1 = ("" if "kept_vs_v1_runner" not in r else
              f"{r['kept_vs_v1_runner']:.4f} {r.get('kept_vs_v1_runner_interval_95')}")
        lines.append(f"| {s['batch']} | {name} | {r['tokens_per_s']} | {kept} | {v1} | "
                     f"{r['itl_us_p50']} | {r['itl_us_p99']} | {r.get('itl_p99_ratio', '')} | "
                     f"{r['ttft_ms_p50']} | {r['repetitions']} |")
    checks = [r for r in doc["records"] if "rows_expected" in r]
    if checks:
        lines += ["", "## Correctness (tests/vllm/test_gpu_vllm.py, the same commit)", "",
                  "Error of a row: the norm of its scores' error over the norm of float64's "
                  "scores (same bf16 weights, transformers); max and median over every row of "
                  "both taps, and the largest single score's error over its row's largest "
                  "score.", "",
                  "| model | CUDA graph mode | async scheduling | rows expected | rows scored | "
                  "max rel. error | median | max element |", "|---|---|---|---|---|---|---|---|"]
        for r in checks:
            s = r["shape"]
            lines.append(f"| {s['model']} | {s['cudagraph_mode']} | {s['async_scheduling']} | "
                         f"{r['rows_expected']} | {r['rows_scored']} | {r['max_rel_err']:.2e} | "
                         f"{r.get('median_rel_err', float('nan')):.2e} | "
                         f"{r.get('max_elementwise_rel_err', float('nan')):.2e} |")
    # plugin.state(): one dict per worker (one here: a single GPU).
    hosts = {name: (state[0] if isinstance(state, list) and state else state or {}).get("host")
             for name, state in (doc.get("plugin_state") or {}).items()}
    hosts = {name: h for name, h in hosts.items() if h}
    if hosts:
        lines += ["", "## The plugin's host time (its own counters, over the whole run)", "",
                  "On the engine's thread: per step (noting the rows, counting, window closes "
                  "included) and per window close; the taps' threads (sending windows, copying "
                  "and folding their scores), which share the interpreter lock with the "
                  "engine's step.", "",
                  "| engine | engine thread µs/step | window close µs | taps' threads µs/window "
                  "| taps' threads µs/step |", "|---|---|---|---|---|"]
        for name, h in hosts.items():
            lines.append(f"| {name} | {h['engine_us_per_step']} | {h['close_us_per_window']} | "
                         f"{h['threads_us_per_window']} | {h['threads_us_per_step']} |")
    lines += ["", "## Targets", ""]
    for t in targets(doc):
        lines.append(f"- {'met' if t['met'] else 'MISSED'}: {t['target']}: {t['measured']}")
    return "\n".join(lines) + "\n"


def write(doc: dict, out_dir: pathlib.Path, correctness: pathlib.Path | None) -> pathlib.Path:
    """vllm_engine.json and .md; the correctness records joined when their file exists."""
    if correctness is not None and correctness.exists():
        doc["records"] = [r for r in doc["records"] if "rows_expected" not in r] + json.loads(
            correctness.read_text())
    doc["targets"] = targets(doc)
    path = out_dir / "vllm_engine.json"
    path.write_text(json.dumps(doc, indent=1) + "\n")
    path.with_suffix(".md").write_text(markdown(doc))
    return path
