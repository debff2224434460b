"""--devices and --device against the real binary, on any host: refusals exit 2 naming the flag,
--help says what they do, and on the CPU backend (no device) ServerInfo lists no device and the
GPU families keep their one unlabelled series. The GPU cases: test_gpu_devices.py (one GPU) and
test_gpu_two_devices.py (two)."""

from __future__ import annotations

import subprocess

import numpy as np
import pytest

from conftest import BIN, Sidecar
from server_state import samples


@pytest.mark.parametrize("args, fragment", [
    (["--devices=0,0"], "--devices=0,0: device 0 is listed twice"),
    (["--devices="], "--devices=: expected all, or device ordinals"),
    (["--devices=0;1"], "--devices=0;1: expected all"),
    (["--device=1", "--devices=0"], "--devices after --device"),
    (["--device=0,1"], "--device=0,1: one device ordinal"),
    (["--device=all"], "--device=all: expected a device ordinal"),
])
def test_bad_device_flags_exit_2_naming_the_flag(args, fragment):
    run = subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=30)
    assert run.returncode == 2, run.stderr
    assert fragment in run.stderr, run.stderr


def test_help_documents_devices_and_device():
    out = subprocess.run([str(BIN), "--help"], capture_output=True, text=True, timeout=30).stdout
    assert "--devices=all|N[,N...]" in out
    assert "or all the process sees (default 0)" in out
    assert "--device=N\n      The same as --devices=N (one device)." in out


@pytest.mark.parametrize("flags", [["--backend=cpu", "--devices=all"],
                                   ["--backend=cpu", "--devices=3,5"]])
def test_the_cpu_backend_serves_whatever_devices_say_and_reports_none(flags):
    with Sidecar(flags) as s, s.client() as c:
        info = c.server_info()
        assert info.backend == "cpu"
        assert list(info.devices) == []
        assert c.score(np.ones((2, 4096), np.float32), [1], "demo").scores.shape == (1, 4)
        scraped = samples(s)
        for name in ("probesidecar_device_memory_bytes", "probesidecar_registered_buffers",
                     "probesidecar_graph_cache_entries", "probesidecar_stream_slots_parked"):
            assert scraped[(name, ())] == 0, name  # one series, no device label
        assert not any(key[0] == "probesidecar_device_up" for key in scraped)
