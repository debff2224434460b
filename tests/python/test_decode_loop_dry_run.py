"""The decode-loop benchmark end to end on the CPU (run.py --cpu-dry-run): a tiny model with
stand-ins for CUDA and the sidecar, every variant through the real tap code, the results files
rendered. It times nothing real; it proves the benchmark runs and checks its scores."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_every_variant_runs_and_checks_against_float64(tmp_path):
    variants = "none,in_process,tap_k1,tap_k4,tap_k16_graph,tap_k4_host,sidecar_async"
    done = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "decode_loop" / "run.py"), "--cpu-dry-run",
         "--quick", "--budget-s=200", "--allow-dirty", "--mps=both", "--batches=2", "--steps=32", "--profile",
         f"--variants={variants}", f"--out-dir={tmp_path}"],
        capture_output=True, text=True, timeout=400, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    doc = json.loads((tmp_path / "decode_loop.json").read_text())
    seen = {(r["variant"], r["shape"]["mps"]) for r in doc["records"]}
    assert seen == {(v, mps) for v in variants.split(",") for mps in (False, True)}
    for r in doc["records"]:
        if r["impl"] != "none":
            assert r["check"]["ok"] and r["check"]["steps"] > 0, r
        if r["impl"] == "tap":
            windows = r["repeats"] * r["steps"] // r["shape"]["window"]
            assert r["windows"] == windows and r["window_errors"] == 0, r
    assert len(doc["profiles"]) == 2
    assert "## Targets" in (tmp_path / "decode_loop.md").read_text()
