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
MODES = ("graph",)


def run(variant, batch, mode, mps, step_us, rep=0, call_us=None, check_ok=True, windows=None):
    impl = "tap" if variant.startswith("tap_") else variant
    window = int(variant.split("_")[1][1:]) if impl == "tap" else None
    line = dict(type="run", impl=impl, variant=variant, batch=batch, mode=mode, mps=mps, rep=rep,
                steps=len(step_us), total_us=sum(step_us), step_us=step_us, server_mps=mps,
                worker_mps=mps, window=window, tap="graph" if variant.endswith("_graph") else
                "eager" if impl == "tap" else None, submit="gpu" if impl == "tap" else None)
    if call_us is not None:
        line["call_us"] = [x * 10 for x in call_us]  # wall: waits included
        line["call_cpu_us"] = call_us
    if impl == "tap":
        # One window per `window` steps: 0.5 ms to device memory, 0.6 ms to host memory.
        line["windows"] = windows if windows is not None else [
            [window, 0.0005, 0.0006, 0.003]] * max(1, len(step_us) // window)
    if impl != "none":
        line["check"] = dict(steps=2, max_rel_err=1e-7 if check_ok else 0.5, tolerance=1e-3,
                             ok=check_ok)
    return line


def grid(cost_us, slow_cell=None, mps_cost_us=300.0):
    """Every (variant, batch, mode, mps) cell, two repeats; step times of `none` 1000 µs without
    MPS (1000 + mps_cost_us with), each variant adding cost_us[variant] (plus 50 µs more in
    slow_cell for tap_k16)."""
    lines = []
    for mps in (True, False):
        for mode in MODES:
            for batch in BATCHES:
                for variant, cost in cost_us.items():
                    slow = variant == "tap_k16" and (batch, mode, mps) == slow_cell
                    extra = (50.0 if slow else 0.0) + (mps_cost_us if mps else 0.0)
                    for rep in range(2):
                        calls = [2.0, 2.5, 3.0] if variant.startswith("tap") else None
                        lines.append(run(variant, batch, mode, mps,
                                         [1000.0 + cost + extra] * 64, rep=rep, call_us=calls))
    return lines


COSTS = {"none": 0.0, "in_process": 1.0, "tap_k1": 100.0, "tap_k16": 5.0, "tap_k64": 1.5,
         "tap_k16_graph": 4.0}


def doc_of(lines):
    return results.document(lines, git="0" * 40, date="2026-12-01T00:00:00Z", command="python3 x")


def target(doc, prefix):
    return next(t for t in doc["targets"] if t["target"].startswith(prefix))


def test_percentile_interpolates_like_numpy():
    assert results.percentile([4, 1, 3, 2], 50) == 2.5
    assert results.percentile([1, 2, 3, 4], 99) == pytest.approx(3.97)
    assert results.percentile([7], 99) == 7
    assert results.percentile([], 50) is None


def test_records_carry_throughput_kept_fractions_and_latency():
    records = results.aggregate([
        run("none", 8, "graph", False, [1000.0] * 16),
        run("none", 8, "graph", True, [1300.0] * 16),
        run("tap_k16", 8, "graph", True, [1310.0] * 16, call_us=[1.0, 2.0, 3.0]),
    ])
    none, none_mps, tapped = records
    assert none["impl"] == "none" and none["shape"] == {"batch": 8, "mode": "graph", "mps": False}
    assert none["tokens_per_s"] == pytest.approx(8000.0)
    assert none["kept"] is None and none["kept_vs_no_mps"] == 1.0
    assert none_mps["kept_vs_no_mps"] == pytest.approx(1000 / 1300, abs=1e-4)
    assert tapped["shape"] == {"batch": 8, "mode": "graph", "mps": True, "window": 16,
                               "tap": "eager", "submit": "gpu"}
    assert tapped["added_us_per_step"] == pytest.approx(10.0)
    assert tapped["kept"] == pytest.approx(1300 / 1310, abs=1e-4)
    assert tapped["kept_vs_no_mps"] == pytest.approx(1000 / 1310, abs=1e-4)
    assert tapped["decode_cpu_us_per_step"]["mean"] == 2.0
    assert tapped["decode_wall_us_per_step"]["mean"] == 20.0
    # A row written first in a 16-step window waits 15 steps of 1.31 ms, then 0.5 ms.
    assert tapped["score_latency_ms"]["p99"] == pytest.approx(15 * 1.31 + 0.5, rel=1e-2)
    assert tapped["window_to_host_memory_ms"] == {"p50": 0.6, "p99": 0.6}
    assert tapped["bench"] == "decode_loop" and tapped["dtype"] == "bf16"


def test_targets_met_when_every_cell_meets_them():
    doc = doc_of(grid(COSTS))
    assert target(doc, "no MPS: tap_k16 keeps")["met"] is True
    assert target(doc, "no MPS: tap_k16 keeps")["measured"]["graph b=8"] == pytest.approx(
        1000 / 1005, abs=1e-4)
    assert target(doc, "no MPS: tap_k64 keeps")["met"] is True
    assert target(doc, "no MPS: tap_k16_graph keeps")["met"] is True
    assert target(doc, "moonshot")["met"] is True
    assert target(doc, "decode-thread")["met"] is True
    assert target(doc, "scores in host memory")["met"] is True
    assert target(doc, "every scored step")["met"] is True
    assert results.failed(doc) == []


def test_kept_is_judged_against_the_loop_without_mps():
    """Under MPS the taps add almost nothing to an MPS step, but the MPS step itself is slower:
    the targets are judged without MPS, and vs-no-MPS shows what MPS costs."""
    doc = doc_of(grid(COSTS, mps_cost_us=300.0))
    mps_tap = next(r for r in doc["records"] if r["variant"] == "tap_k16" and r["shape"]["mps"])
    assert mps_tap["kept"] == pytest.approx(1300 / 1305, abs=1e-4)
    assert mps_tap["kept_vs_no_mps"] == pytest.approx(1000 / 1305, abs=1e-4)


def test_one_slow_cell_fails_its_target():
    doc = doc_of(grid(COSTS, slow_cell=(8, "graph", False)))
    kept = target(doc, "no MPS: tap_k16 keeps")
    assert kept["met"] is False
    assert kept["measured"]["graph b=8"] == pytest.approx(1000 / 1055, abs=1e-4)
    assert target(doc, "no MPS: tap_k64 keeps")["met"] is True


def test_a_target_is_not_met_where_it_was_not_measured():
    lines = [line for line in grid(COSTS)
             if not (line["variant"] == "tap_k64" and line["batch"] == 8)]
    kept = target(doc_of(lines), "no MPS: tap_k64 keeps")
    assert kept["met"] is False and "graph b=8" in kept["missing"]


def test_slow_decode_thread_and_late_host_scores_fail_their_targets():
    lines = grid(COSTS)
    for line in lines:
        if line["variant"] == "tap_k16_graph":
            line["call_cpu_us"] = [4.0, 5.0]
        if line["variant"] == "tap_k64":
            line["windows"] = [[64, 0.0005, 0.0030, 0.004]]
    doc = doc_of(lines)
    assert target(doc, "decode-thread")["met"] is False
    assert target(doc, "scores in host memory")["met"] is False


def test_failed_checks_window_errors_and_empty_runs_fail_the_run():
    lines = grid(COSTS)
    lines.append(run("tap_k4", 64, "graph", False, [2000.0] * 8, check_ok=False))
    assert any("check failed" in reason for reason in results.failed(doc_of(lines)))
    lines = grid(COSTS)
    lines[-1]["window_errors"] = ["NOT_FOUND: gone"]
    assert any("tap windows failed" in reason for reason in results.failed(doc_of(lines)))
    errors = grid(COSTS) + [dict(type="error", mps=True, where="graph b=8 capture", message="boom")]
    assert results.failed(doc_of(errors)) == ["MPS on: graph b=8 capture: boom"]
    assert results.failed(doc_of([])) == ["no timed run finished"]


def test_document_markdown_and_the_mps_profile():
    kernels_off = [["gemm", 100, 900.0], ["rsqrt", 33, 39.0]]
    kernels_on = [["gemm", 100, 901.0], ["rsqrt", 33, 82.0]]
    lines = grid(COSTS) + [
        dict(type="meta", mps=False, what="ceilings", copy_gbps=4300.0, bf16_tflops=790.0),
        dict(type="meta", mps=False, what="model", device="NVIDIA H200", params=1_235_814_400,
             config={"hidden_size": 2048}, dtype="bf16", prompt_len=512, probes=16),
        dict(type="note", mps=True, message="graph b=64: 64 steps x 1 repeats to fit"),
        dict(type="profile", mps=False, batch=1, replays=20, kernels=kernels_off),
        dict(type="profile", mps=True, batch=1, replays=20, kernels=kernels_on),
    ]
    doc = doc_of(lines)
    assert doc["device"] == "NVIDIA H200" and doc["git"] == "0" * 40
    assert doc["ceilings"] == {"copy_gbps": 4300.0, "bf16_tflops": 790.0}
    assert doc["notes"] == ["MPS on: graph b=64: 64 steps x 1 repeats to fit"]
    assert len(doc["records"]) == 2 * len(BATCHES) * len(COSTS)
    json.dumps(doc, allow_nan=False)  # valid JSON: no NaN anywhere
    md = results.markdown(doc)
    assert "| graph | off | 8 | tap_k16 | 7960 | 0.9950 | 0.9950 | 5.0 |" in md
    assert "## Targets" in md and "NOT met" not in md and "Partial" not in md
    assert "| `rsqrt` | 33 | 39.0 | 82.0 | 2.10 |" in md
    doc["complete"] = False
    assert "**Partial results**" in results.markdown(doc)


def test_a_line_cut_short_is_dropped(tmp_path):
    path = tmp_path / "runs.jsonl"
    path.write_text(json.dumps(run("none", 1, "graph", True, [1.0])) + "\n{\"type\": \"ru")
    assert [line["impl"] for line in results.read_lines(str(path))] == ["none"]
