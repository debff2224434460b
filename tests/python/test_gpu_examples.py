"""The Python examples that need a GPU, run as a user would run them against a CUDA-backend
server: decode_loop.py (a CUDA-graphed loop with the tap's write captured) and generate_tap.py
with a CUDA tap. Skipped where torch or a CUDA device is missing."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "client" / "python" / "examples"


def test_examples_on_the_cuda_backend():
    with Sidecar(["--backend=cuda", "--warmup-rows=none"]) as server:
        for name, first in (("decode_loop.py", "64 steps x 8 sequences"),
                            ("generate_tap.py", "60 scored rows (3 windows)")):
            done = subprocess.run([sys.executable, str(EXAMPLES / name), server.uds_target],
                                  capture_output=True, text=True, timeout=300)
            assert done.returncode == 0, name + ":\n" + done.stdout + done.stderr
            assert done.stdout.startswith(first), done.stdout
