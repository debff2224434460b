"""The decode-loop benchmark's results logic (bench/decode_loop/results.py) on synthetic runs: the
records, the targets and the failure reasons. No torch, no GPU."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "decode_loop"))
import results  # noqa: E402

BATCHES = (1, 8)
MODES = ("graph", "eager")


def run(impl, batch, mode, mps, step_us, rep=0, call_us=None, check_ok=True):
    line = dict(type="run", impl=impl, batch=batch, mode=mode, mps=mps, rep=rep,
                steps=len(step_us), ring=None if impl == "none" else 2, total_us=sum(step_us),
                step_us=step_us, server_mps=mps, worker_mps=mps)
    if call_us is not None:
        line["call_us"] = call_us
    if impl != "none":
        line["check"] = dict(steps=2, max_rel_err=1e-7 if check_ok else 0.5, tolerance=1e-3,
                             ok=check_ok)
    return line


def grid(cost_us, slow_cell=None):
    """Every (impl, batch, mode, mps) cell, two repeats; step times of `none` 1000 µs, each
    variant adding cost_us[impl] (plus 50 µs more in slow_cell for sidecar_async)."""
    lines = []
    for mps in (True, False):
        for mode in MODES:
            for batch in BATCHES:
                for impl, cost in cost_us.items():
                    slow = impl == "sidecar_async" and (batch, mode, mps) == slow_cell
                    extra = 50.0 if slow else 0.0
                    for rep in range(2):
                        calls = [10.0, 12.0, 14.0] if impl.startswith("sidecar") else None
                        lines.append(run(impl, batch, mode, mps, [1000.0 + cost + extra] * 4,
                                         rep=rep, call_us=calls))
    return lines


COSTS = {"none": 0.0, "in_process": 10.0, "sidecar_sync": 500.0, "sidecar_async": 5.0}


def doc_of(lines):
    return results.document(lines, git="0" * 40, date="2026-12-01T00:00:00Z", command="python3 x")


def target(doc, prefix):
    return next(t for t in doc["targets"] if t["target"].startswith(prefix))


def test_percentile_interpolates_like_numpy():
    assert results.percentile([4, 1, 3, 2], 50) == 2.5
    assert results.percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert results.percentile([7], 99) == 7
    assert results.percentile([], 50) is None


def test_records_carry_throughput_added_time_and_kept_fraction():
    records = results.aggregate([
        run("none", 8, "graph", True, [1000.0, 1000.0, 1000.0, 1000.0]),
        run("sidecar_async", 8, "graph", True, [1010.0, 1010.0, 1020.0, 1000.0],
            call_us=[10.0, 20.0, 30.0]),
    ])
    none, scored = records
    assert none["impl"] == "none" and none["shape"] == {"batch": 8, "mode": "graph", "mps": True}
    assert none["tokens_per_s"] == pytest.approx(8000.0)
    assert none["kept"] is None and none["added_us_per_step"] is None
    assert scored["mean_step_us"] == pytest.approx(1010.0)
    assert scored["added_us_per_step"] == pytest.approx(10.0)
    assert scored["kept"] == pytest.approx(1000 / 1010, abs=1e-4)
    assert scored["step_us"]["p50"] == pytest.approx(1010.0)
    assert scored["score_call_us"] == {"p50": 20.0, "p99": pytest.approx(29.8)}
    assert scored["bench"] == "decode_loop" and scored["dtype"] == "bf16"
    assert scored["graph_us_p50"] is None and scored["eager_us_p50"] is None


def test_targets_met_when_every_cell_meets_them():
    doc = doc_of(grid(COSTS))
    assert target(doc, "MPS: sidecar_async keeps")["met"] is True
    assert target(doc, "MPS: sidecar_async is never slower")["met"] is True
    assert target(doc, "client CPU")["met"] is True
    assert target(doc, "client CPU")["measured"]["graph b=8 mps=on"] == 12.0
    assert target(doc, "without MPS")["met"] is None  # stated, not judged
    assert target(doc, "every scored step")["met"] is True
    assert results.failed(doc) == []


def test_one_slow_cell_fails_both_mps_targets():
    doc = doc_of(grid(COSTS, slow_cell=(8, "eager", True)))
    kept = target(doc, "MPS: sidecar_async keeps")
    assert kept["met"] is False
    assert kept["measured"]["eager b=8"] == pytest.approx(1000 / 1055, abs=1e-4)
    assert target(doc, "MPS: sidecar_async is never slower")["met"] is False
    # The same slowness without MPS is stated, not failed.
    without = doc_of(grid(COSTS, slow_cell=(8, "eager", False)))
    assert target(without, "MPS: sidecar_async keeps")["met"]


def test_a_target_is_not_met_where_it_was_not_measured():
    lines = [line for line in grid(COSTS) if not (line["mode"] == "eager" and line["batch"] == 8)]
    kept = target(doc_of(lines), "MPS: sidecar_async keeps")
    assert kept["met"] is False and "eager b=8" in kept["missing"]


def test_a_missing_in_process_cell_fails_only_the_comparison_with_it():
    lines = [line for line in grid(COSTS)
             if not (line["impl"] == "in_process" and line["batch"] == 1 and line["mps"])]
    doc = doc_of(lines)
    assert target(doc, "MPS: sidecar_async keeps")["met"] is True
    versus = target(doc, "MPS: sidecar_async is never slower")
    assert versus["met"] is False and versus["missing"] == ["graph b=1", "eager b=1"]


def test_slow_client_calls_fail_the_cpu_target():
    lines = grid(COSTS)
    for line in lines:
        if line["impl"] == "sidecar_async":
            line["call_us"] = [30.0, 31.0, 32.0]
    assert target(doc_of(lines), "client CPU")["met"] is False


def test_failed_checks_errors_and_empty_runs_fail_the_run():
    lines = grid(COSTS)
    lines.append(run("sidecar_sync", 64, "graph", False, [2000.0] * 4, check_ok=False))
    assert any("check failed" in reason for reason in results.failed(doc_of(lines)))
    errors = grid(COSTS) + [dict(type="error", mps=True, where="graph b=8 capture", message="boom")]
    assert results.failed(doc_of(errors)) == ["MPS on: graph b=8 capture: boom"]
    assert results.failed(doc_of([])) == ["no timed run finished"]


def test_document_and_markdown():
    lines = grid(COSTS) + [
        dict(type="meta", mps=False, what="ceilings", copy_gbps=4300.0, bf16_tflops=790.0),
        dict(type="meta", mps=False, what="model", device="NVIDIA H200", params=1_235_814_400,
             config={"hidden_size": 2048}, dtype="bf16", prompt_len=512, probes=16),
        dict(type="note", mps=True, message="eager b=64: 64 steps x 1 repeats to fit"),
    ]
    doc = doc_of(lines)
    assert doc["device"] == "NVIDIA H200" and doc["git"] == "0" * 40
    assert doc["ceilings"] == {"copy_gbps": 4300.0, "bf16_tflops": 790.0}
    assert doc["notes"] == ["MPS on: eager b=64: 64 steps x 1 repeats to fit"]
    assert len(doc["records"]) == 2 * 2 * 2 * len(COSTS)
    json.dumps(doc, allow_nan=False)  # valid JSON: no NaN anywhere
    md = results.markdown(doc)
    assert "| graph | on | 8 | sidecar_async | 7960 | 0.995 | 5.0 |" in md
    assert "## Targets" in md and "NOT met" not in md and "Partial" not in md
    doc["complete"] = False
    assert "**Partial results**" in results.markdown(doc)


def test_a_line_cut_short_is_dropped(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(run("none", 1, "graph", True, [1.0])) + "\n{\"type\": \"ru")
    assert [line["impl"] for line in results.read_lines(str(path))] == ["none"]
