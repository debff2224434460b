"""Faults against the real server (CPU backend): a client killed mid-request, a client that never
cleans up, a probe set unloaded under its requests, and a request that fails as a CUDA error
would (through the test-only fault hook; the real GPU fault needs a GPU)."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import grpc
import numpy as np
import pytest

from conftest import BIN, FAULTS_BIN, Sidecar
from probe_files import ProbeFile
from probe_sidecar import ProbeSidecarError, score_request
from probesidecar.v1 import buffers_pb2
from server_state import answered_by_code, difference, metric, wait_for

# One activation row scored many times over a wide set: 1 M multiply-adds a row, ~5 G/s here.
H, P = 65536, 16
X = np.random.default_rng(0).standard_normal((1, H)).astype(np.float32)
HEAVY_ROWS = 40000  # ~8 s of work
BLOCKER_ROWS = 3000  # ~0.6 s


@pytest.fixture(scope="module")
def probe():
    return ProbeFile(P, H, seed=3)


@pytest.fixture(scope="module")
def sidecar(probe):
    with Sidecar(["--backend=cpu", "--cpu-threads=1"]) as s:
        with s.client() as c:
            c.load_probe_set("wide", data=probe.data)
        yield s
        assert s.process.poll() is None, "the server died:\n" + s.log()


def in_flight(sidecar, rpc: str = "Score") -> float:
    return metric(sidecar, "probesidecar_rpc_in_flight", rpc=rpc)


def start_child(code: str) -> subprocess.Popen:
    """A Python client in a process of its own; it prints 'ready' once its work is under way."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    assert line.strip() == "ready", child.stderr.read()
    return child


def test_a_client_killed_mid_request(sidecar):
    before = answered_by_code(sidecar, "Score")
    cancelled_before = metric(sidecar, "probesidecar_executor_cancelled_requests_total")
    # Three heavy requests from a client that is then killed: one running, two waiting.
    child = start_child(f"""
        import time
        import numpy as np
        from probe_sidecar import Client, score_request
        c = Client({sidecar.uds_target!r})
        x = np.ones((1, {H}), np.float32)
        calls = [c.stub.Score.future(score_request(x, np.zeros({HEAVY_ROWS}, np.int32), "wide"),
                                     timeout=120) for _ in range(3)]
        print("ready", flush=True)
        time.sleep(600)
    """)
    try:
        assert wait_for(lambda: in_flight(sidecar) == 3, 10)
        with sidecar.client() as survivor:
            # A request of another client, queued behind the dead client's work.
            behind = survivor.stub.Score.future(score_request(X, np.zeros(8, np.int32), "wide"),
                                                timeout=60)
            assert wait_for(lambda: in_flight(sidecar) == 4, 10)
            child.send_signal(signal.SIGKILL)
            child.wait(timeout=10)
            # Its three requests stop (the running one between two tasks, the waiting ones when a
            # worker takes them; counted below), and the survivor's is answered.
            assert len(behind.result(timeout=60).scores) == 8 * P * 4
            assert wait_for(lambda: in_flight(sidecar) == 0, 30)
            assert survivor.score(X, [0, 0], "wide").scores.shape == (2, P)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert metric(sidecar, "probesidecar_executor_cancelled_requests_total") == cancelled_before + 3
    assert difference(answered_by_code(sidecar, "Score"), before) == {"OK": 2, "CANCELLED": 3}


def test_a_probe_set_unloaded_while_requests_use_it(sidecar):
    victim = ProbeFile(P, H, seed=4)
    with sidecar.client() as c:
        c.load_probe_set("victim", data=victim.data)
        rows = np.zeros(BLOCKER_ROWS, np.int32)
        # Deadlines far past the work (~1.8 s here, over a minute in a sanitized build on a busy
        # host): what is tested is that they finish correctly, not how fast.
        calls = [c.stub.Score.future(score_request(X, rows, "victim"), timeout=300)
                 for _ in range(3)]
        assert wait_for(lambda: in_flight(sidecar) == 3, 10)
        c.unload_probe_set("victim")  # answers without waiting for the requests: ...
        assert in_flight(sidecar) >= 2  # ... ~1.8 s of them, one thread, still in progress
        with pytest.raises(ProbeSidecarError) as error:
            c.score(X, [0], "victim")
        assert error.value.code == grpc.StatusCode.NOT_FOUND
        assert "victim" not in {s.name for s in c.list_probe_sets()}
        # The requests that held the set finish with its weights, correctly.
        expected = victim.reference(X, [0])[0]
        for call in calls:
            response = call.result(timeout=300)
            scores = np.frombuffer(response.scores, "<f4").reshape(BLOCKER_ROWS, P)
            np.testing.assert_allclose(scores, np.broadcast_to(expected, scores.shape),
                                       rtol=1e-4, atol=1e-4)


def test_a_client_that_never_cleans_up_leaves_nothing_behind(probe):
    # On the CPU backend a client can hold no buffers (refused); what it can hold is a session
    # and a stream. Killed with both open, it must not keep anything alive: a SIGTERM then finds
    # the server idle. (The GPU tests cover buffers of a dead client: test_gpu_ipc.py.)
    s = Sidecar(["--backend=cpu", "--shutdown-grace-seconds=5"]).start()
    try:
        child = start_child(f"""
            import time
            import grpc
            import numpy as np
            from probe_sidecar import Client, score_request
            from probesidecar.v1 import buffers_pb2
            c = Client({s.uds_target!r})
            session = c.stub.OpenSession(buffers_pb2.OpenSessionRequest(
                client_pid=1, labels={{"model": "doomed"}}))
            session_id = next(session).session_id  # held open until the process dies
            buffer = buffers_pb2.RegisterBufferRequest(handle=bytes(64), byte_size=16,
                                                       session_id=session_id)
            try:
                c.stub.RegisterBuffer(buffer)
                raise SystemExit("not refused")
            except grpc.RpcError as e:
                assert e.code() == grpc.StatusCode.FAILED_PRECONDITION, e
            def messages():
                yield score_request(np.ones((1, 4096), np.float32), [0], "demo")
                time.sleep(600)  # never half-closes
            stream = c.stub.ScoreStream(messages())
            next(stream)
            print("ready", flush=True)
            time.sleep(600)
        """)
        child.kill()
        child.wait()
        with s.client() as c:
            listed = c.stub.ListBuffers(buffers_pb2.ListBuffersRequest(), timeout=10)
            assert list(listed.buffers) == []
            assert c.score(np.ones((1, 4096), np.float32), [0], "demo").scores.shape == (1, 4)
        s.signal(signal.SIGTERM)
        assert s.wait(timeout=30) == 0
        # Nothing of the dead client held the drain until the end of its grace period.
        assert "grace period over" not in s.log(), s.log()
    finally:
        s.close()


def test_an_injected_cuda_error_fails_one_request_and_the_next_ones_succeed(monkeypatch):
    # PROBE_SIDECAR_TEST_FAULT_EVERY=N fails every Nth Score as a failed CUDA call would, in the
    # test binary that links the injector. A real CUDA fault needs a GPU: not run here.
    monkeypatch.setenv("PROBE_SIDECAR_TEST_FAULT_EVERY", "4")
    x = np.random.default_rng(1).standard_normal((2, 4096)).astype(np.float32)
    with Sidecar(["--backend=cpu"], binary=FAULTS_BIN) as s, s.client() as c:
        assert "test-only fault hook" in s.log()
        expected = c.score(x, [0, 1], "demo").scores  # request 1
        outcomes = []
        for _ in range(7):  # requests 2..8
            try:
                outcomes.append(c.score(x, [0, 1], "demo").scores)
            except ProbeSidecarError as error:
                outcomes.append(error)
        failed = [i + 2 for i, o in enumerate(outcomes) if isinstance(o, ProbeSidecarError)]
        assert failed == [4, 8]
        for o in outcomes:
            if isinstance(o, ProbeSidecarError):
                assert o.code == grpc.StatusCode.INTERNAL and "cudaErrorLaunchFailure" in o.message
            else:
                np.testing.assert_array_equal(o, expected)
        assert metric(s, "probesidecar_cuda_errors_total") == 2
        # A stream message that fails carries its error, and the stream goes on.
        results = list(c.score_stream(score_request(x, [0, 1], "demo") for _ in range(4)))
        assert [type(r).__name__ for r in results] == ["ScoreResult", "ScoreResult",
                                                       "ScoreResult", "ProbeSidecarError"]
        assert results[3].code == grpc.StatusCode.INTERNAL
        assert metric(s, "probesidecar_cuda_errors_total") == 3
        assert c.score(x, [0, 1], "demo").scores.shape == (2, 4)
        assert s.log().count("failed: INTERNAL") == 3


def test_the_production_binary_has_no_fault_injector(monkeypatch):
    # The injectors are linked into probe-sidecar-test-faults only: the shipped binary holds
    # neither the variables that arm them nor the faulting kernel, and serves every request
    # whatever the environment says.
    armed_by = [b"PROBE_SIDECAR_TEST_FAULT_EVERY", b"PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT",
                b"WriteOutOfBoundsKernel"]
    production, test_binary = BIN.read_bytes(), FAULTS_BIN.read_bytes()
    assert [name for name in armed_by if name in production] == []
    assert [name for name in armed_by if name not in test_binary] == []
    monkeypatch.setenv("PROBE_SIDECAR_TEST_FAULT_EVERY", "1")
    monkeypatch.setenv("PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT", "1")
    x = np.ones((1, 4096), np.float32)
    with Sidecar(["--backend=cpu"]) as s, s.client() as c:
        for _ in range(3):
            assert c.score(x, [0], "demo").scores.shape == (1, 4)
        assert "fault hook" not in s.log()
