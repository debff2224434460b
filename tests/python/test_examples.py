"""The Python examples in client/python/examples, run as a user would run them, against the real
server. generate_tap.py runs on the CPU backend here; decode_loop.py needs a GPU
(test_gpu_examples.py)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from conftest import Sidecar

pytest.importorskip("torch")
pytest.importorskip("transformers")

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "client" / "python" / "examples"


def run_example(name: str, target: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(EXAMPLES / name), target], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, CUDA_VISIBLE_DEVICES=""))


def test_generate_tap_on_the_cpu_backend():
    with Sidecar(["--backend=cpu"]) as server:
        done = run_example("generate_tap.py", server.uds_target)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("60 scored rows (3 windows) for 3 sequences of 20 new tokens")
