"""The window-interleaved decode-loop benchmark (bench/decode_loop/windowed.py): its arithmetic on
synthetic step times where the answer is known (interleave.py, windowed_report.py), and the whole
benchmark on the CPU against the real sidecar (--cpu-dry-run: every line runs, the scores are
checked against float64, nothing real is timed)."""

from __future__ import annotations

import json
import os
import pathlib
import random
import subprocess
import sys
import types

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench" / "decode_loop"))

import interleave  # noqa: E402
import windowed_report  # noqa: E402

K = 4


def blocks(sandwiches: int, base_us: float, extra_by_position: list[float], *, drift: float = 0.0,
           noise: float = 0.0, windows: int = 3, seed: int = 0) -> list:
    """Blocks in schedule order: every step base_us (+ drift per block, + noise), a tapped step
    extra_by_position[position in its window] more."""
    rng = random.Random(seed)
    out = []
    for i, kind in enumerate(interleave.schedule(sandwiches)):
        steps = []
        for t in range(windows * K):
            us = base_us + drift * i + rng.uniform(-noise, noise)
            if kind == "scored":
                us += extra_by_position[t % K]
            steps.append(us)
        out.append((kind, steps))
    return out


def test_the_schedule_alternates_and_starts_and_ends_without_the_tap():
    assert interleave.schedule(2) == ["base", "scored", "base", "scored", "base"]


def test_kept_is_exact_without_noise_and_a_linear_drift_cancels():
    extra = [20.0, 5.0, 1.0, 1.0]  # the close and Score after it, then the write alone
    data = blocks(4, 1000.0, extra, drift=3.0)
    ratios = interleave.sandwich_ratios(data, K)
    for i, r in enumerate(ratios):
        base = 1000.0 + 3.0 * (2 * i + 1)  # the tapped block's own index: its neighbours' mean
        assert r == pytest.approx(base / (base + sum(extra) / K), rel=1e-12)
    where = interleave.decompose(data, K)
    assert where["steady_us_per_step"] == pytest.approx(1.0)
    assert where["total_us_per_window"] == pytest.approx(27.0, abs=0.01)
    assert where["after_close_us_per_window"] == pytest.approx(23.0, abs=0.01)
    assert where["extra_us_by_position"] == pytest.approx(extra, abs=0.01)


def test_the_first_window_of_a_block_is_not_counted():
    data = blocks(1, 1000.0, [0.0] * K)
    data[1][1][:K] = [5000.0] * K  # the previous loop's last Score, in the first window
    assert interleave.sandwich_ratios(data, K) == [pytest.approx(1.0)]
    with pytest.raises(ValueError):
        interleave.counted_mean_us([1.0] * K, K)  # one window: nothing to count


def test_the_interval_holds_the_truth_and_narrows_with_more_blocks():
    truth = 1000.0 / 1003.0
    widths = []
    for sandwiches in (4, 32):
        data = blocks(sandwiches, 1000.0, [3.0] * K, noise=20.0, seed=sandwiches)
        kept, (lo, hi) = interleave.median_interval(interleave.sandwich_ratios(data, K))
        assert lo <= kept <= hi and lo <= truth <= hi
        widths.append(hi - lo)
    assert widths[1] < widths[0]


def test_a_record_and_its_targets():
    data = blocks(3, 1000.0, [20.0, 0.5, 0.5, 0.5])  # kept 0.99465: K=16 met, K=64 not
    windows = [types.SimpleNamespace(host_memory_latency_s=s, latency_s=2 * s)
               for s in (0.001, 0.002, 0.004)]
    r = windowed_report.record(data, K, 8, [10.0, 10.0, 10.0, 300.0] * 6, windows,
                               {"windows_failed": 0, "windows_lost": 0})
    assert r["kept"] == pytest.approx(1000.0 / 1005.375, abs=1e-5)
    assert r["step_call_us"]["closing_p50"] == 300.0 and r["step_call_us"]["p50"] == 10.0
    assert r["window_to_host_memory_ms"] == {"p50": 2.0, "p99": 4.0, "n": 3}
    assert r["base_tokens_per_s"] == pytest.approx(8000.0)
    doc = {"git": "0" * 40, "date": "d", "command": "c", "complete": True, "records": []}
    for window in (16, 64):
        doc["records"].append(dict(r, shape={"batch": 8, "window": window, "tap": "compiled"},
                                   variant=f"tap_k{window}_compiled",
                                   check={"ok": True, "max_rel_err": 1e-6}))
    got = {t["target"]: t["ok"] for t in windowed_report.targets(doc)}
    assert got == {"compiled tap, K=16: kept >= 0.99 at every batch": True,
                   "compiled tap, K=64: kept >= 0.997 at every batch": False,
                   "compiled tap, K=64: scores in host memory <= 5.0 ms after the window's "
                   "close, p99": True}
    assert windowed_report.failed(doc) == []
    doc["records"][0]["check"] = {"ok": False}
    assert len(windowed_report.failed(doc)) == 1
    assert "MISSED" in windowed_report.markdown(doc)


def test_the_benchmark_runs_on_the_cpu_and_checks_its_scores(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    server = os.environ.get("PROBE_SIDECAR_BIN")
    if not server:
        pytest.skip("PROBE_SIDECAR_BIN is not set")
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "decode_loop" / "windowed.py"), "--cpu-dry-run",
         f"--server={server}", "--batches=2,3", "--windows=4,8", "--sandwiches=2",
         "--windows-per-block=2", "--allow-dirty", f"--out-dir={tmp_path}"],
        capture_output=True, text=True, timeout=300, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "decode_loop_windowed.json").read_text())
    seen = {(r["shape"]["tap"], r["shape"]["batch"], r["shape"]["window"]) for r in doc["records"]}
    assert seen == {(t, b, k) for t in ("compiled", "graph") for b in (2, 3) for k in (4, 8)}
    for r in doc["records"]:
        assert r["check"]["ok"] and r["check"]["rows"] == r["shape"]["window"] * r["shape"]["batch"]
        assert r["sandwiches"] == 2 and r["tap"]["windows_lost"] == 0
        # Every tapped block's windows were scored (and those of the warm-up before them).
        assert r["tap"]["windows_delivered"] == 2 * 2
    assert doc["complete"] and len(doc["profiles"]) == 2
    assert "| compiled | 2 | 4 |" in (tmp_path / "decode_loop_windowed.md").read_text()
