"""Configured limits: message size, rows, scores size, concurrency."""

from __future__ import annotations

import threading
import urllib.request

import grpc
import numpy as np
import pytest

from conftest import Sidecar
from probe_files import ProbeFile
from probe_sidecar import ProbeSidecarError
from server_state import SAFETY_S, wait_for


@pytest.fixture(scope="module")
def small_limits():
    with Sidecar(["--backend=cpu", "--max-message-bytes=1Mi", "--max-rows=1000"]) as s:
        with s.client(max_message_bytes=64 << 20) as c:
            c.load_probe_set("wide", data=ProbeFile(512, 8, seed=1).data)
        yield s


def test_oversized_request_is_resource_exhausted(small_limits):
    with small_limits.client(max_message_bytes=64 << 20) as c:
        x = np.zeros((300, 1024), np.float32) + 1.0  # 1.2 MB of activations
        with pytest.raises(ProbeSidecarError) as error:
            c.score(x, [0], "wide")
        assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        # and the server keeps serving
        assert c.score(np.ones((1, 8), np.float32), [0], "wide").scores.shape == (1, 512)


def test_too_many_rows(small_limits):
    with small_limits.client() as c:
        with pytest.raises(ProbeSidecarError) as error:
            c.score(np.ones((1, 8), np.float32), np.zeros(1001, np.int32), "wide")
        assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-rows" in error.value.message


def test_scores_over_the_message_limit(small_limits):
    with small_limits.client() as c:
        with pytest.raises(ProbeSidecarError) as error:
            c.score(np.ones((1, 8), np.float32), np.zeros(600, np.int32), "wide")  # 1.2 MB out
        assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-message-bytes" in error.value.message


def test_probe_file_over_the_size_limit():
    with Sidecar(["--backend=cpu", "--max-probe-file-bytes=4096"]) as s, s.client() as c:
        with pytest.raises(ProbeSidecarError) as error:
            c.load_probe_set("big", data=ProbeFile(4, 512, seed=1).data)
        assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED


def _in_flight(sidecar) -> float:
    text = urllib.request.urlopen(f"http://{sidecar.metrics_address}/metrics", timeout=5).read().decode()
    for line in text.splitlines():
        if line.startswith('probesidecar_rpc_in_flight{rpc="Score"}'):
            return float(line.split()[-1])
    return 0.0


def test_concurrency_limit():
    with Sidecar(["--backend=cpu", "--max-concurrent-requests=1", "--cpu-threads=1"]) as s:
        with s.client() as c:
            c.load_probe_set("slow", data=ProbeFile(256, 4096, seed=2).data)
        x = np.random.default_rng(0).standard_normal((64, 4096)).astype(np.float32)
        slow_result = {}

        def slow():
            with s.client(timeout=SAFETY_S) as c:
                slow_result["r"] = c.score(x, np.arange(2000) % 64, "slow")  # ~2 G multiply-adds

        thread = threading.Thread(target=slow)
        thread.start()
        assert wait_for(lambda: _in_flight(s) >= 1, SAFETY_S), "the slow request never started"
        with s.client() as c:
            with pytest.raises(ProbeSidecarError) as error:
                c.score(x, [0], "slow")
        thread.join()
        assert error.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "--max-concurrent-requests" in error.value.message
        assert slow_result["r"].scores.shape == (2000, 256)
        with s.client() as c:  # the slot is free again
            assert c.score(x, [0], "slow").scores.shape == (1, 256)
