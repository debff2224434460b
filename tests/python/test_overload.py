"""Limits and overload against the real server (CPU backend, one scoring thread): the executor's
queue is bounded by --max-queued-requests and refuses at once past it; a request whose deadline
passes while it waits is not run (DEADLINE_EXCEEDED, counted); a request whose caller cancels —
waiting or running — frees the worker at once, and every call is answered exactly once."""

from __future__ import annotations

import time

import grpc
import numpy as np
import pytest

from conftest import Sidecar
from probe_files import ProbeFile
from probe_sidecar import score_request
from server_state import answered_by_code, difference, metric, wait_for

# A row of this set is 1 M multiply-adds (the CPU scorer does ~5 G a second on one thread here);
# requests of many rows of one activation row are heavy yet quick to validate and to answer.
H, P = 65536, 16
HEAVY = np.zeros(40000, np.int32)  # ~8 s of work if it ran to the end
BLOCKER = np.zeros(3000, np.int32)  # ~0.6 s
SMALL = np.zeros(64, np.int32)


@pytest.fixture(scope="module")
def sidecar():  # overrides conftest's; its `client` fixture then talks to this one
    with Sidecar(["--backend=cpu", "--cpu-threads=1", "--max-queued-requests=2"]) as s:
        with s.client() as c:
            c.load_probe_set("slow", data=ProbeFile(P, H, seed=2).data)
        yield s
        assert s.process.poll() is None, "the server died:\n" + s.log()


X = np.random.default_rng(0).standard_normal((1, H)).astype(np.float32)


def send(client, rows, timeout: float):
    return client.stub.Score.future(score_request(X, rows, "slow"), timeout=timeout)


def in_flight(sidecar) -> float:
    return metric(sidecar, "probesidecar_rpc_in_flight", rpc="Score")


def queued(sidecar) -> float:
    return metric(sidecar, "probesidecar_executor_queued_requests")


def wait_running_alone(sidecar):
    """Waits until exactly one Score is in progress and none waits: it holds the only thread."""
    assert wait_for(lambda: in_flight(sidecar) == 1 and queued(sidecar) == 0, 10)
    time.sleep(0.05)  # past its validation (a millisecond), into the executor


def assert_serves_promptly(client):
    start = time.monotonic()
    assert client.score(X, SMALL, "slow").scores.shape == (64, P)
    assert time.monotonic() - start < 1.5, "the worker was still busy with work nobody waits for"


def test_a_full_queue_refuses_at_once_and_names_the_flag(sidecar, client):
    assert metric(sidecar, "probesidecar_executor_queue_capacity") == 2
    running = send(client, HEAVY, timeout=60)
    wait_running_alone(sidecar)
    waiting = [send(client, SMALL, timeout=60) for _ in range(2)]
    assert wait_for(lambda: queued(sidecar) == 2, 10)
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as refused:
        client.stub.Score(score_request(X, SMALL, "slow"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-queued-requests" in refused.value.details()
    assert time.monotonic() - start < 0.5  # refused at once, not after waiting
    # The admission limit (--max-concurrent-requests, 256) was not what refused it.
    assert in_flight(sidecar) == 3
    running.cancel()
    for call in waiting:
        assert len(call.result(timeout=5).scores) == len(SMALL) * P * 4
    assert wait_for(lambda: in_flight(sidecar) == 0, 5)


def test_a_request_past_its_deadline_does_not_run(sidecar, client):
    before = answered_by_code(sidecar, "Score")
    expired_before = metric(sidecar, "probesidecar_executor_expired_requests_total")
    blocker = send(client, BLOCKER, timeout=30)
    wait_running_alone(sidecar)
    late = send(client, HEAVY, timeout=0.2)  # waits behind the blocker past its deadline
    assert late.exception(timeout=10).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(blocker.result(timeout=30).scores) == len(BLOCKER) * P * 4
    # Had the late request run, the next one would wait ~8 s behind it.
    assert_serves_promptly(client)
    assert metric(sidecar, "probesidecar_executor_expired_requests_total") == expired_before + 1
    assert difference(answered_by_code(sidecar, "Score"), before) == {"OK": 2,
                                                                       "DEADLINE_EXCEEDED": 1}


def test_cancelling_frees_the_worker_whether_waiting_or_running(sidecar, client):
    before = answered_by_code(sidecar, "Score")
    cancelled_before = metric(sidecar, "probesidecar_executor_cancelled_requests_total")
    # Waiting: skipped when the worker takes it.
    blocker = send(client, BLOCKER, timeout=30)
    wait_running_alone(sidecar)
    waiting = send(client, HEAVY, timeout=60)
    assert wait_for(lambda: queued(sidecar) == 1, 10)
    waiting.cancel()
    assert len(blocker.result(timeout=30).scores) == len(BLOCKER) * P * 4
    assert_serves_promptly(client)
    # Running: stopped between two tasks (a task is ~2 M multiply-adds, well under a millisecond).
    running = send(client, HEAVY, timeout=60)
    wait_running_alone(sidecar)
    time.sleep(0.2)
    start = time.monotonic()
    running.cancel()
    assert wait_for(lambda: in_flight(sidecar) == 0, 5)
    assert time.monotonic() - start < 1.0
    assert_serves_promptly(client)
    # Each answered exactly once, as CANCELLED.
    assert metric(sidecar, "probesidecar_executor_cancelled_requests_total") == cancelled_before + 2
    assert difference(answered_by_code(sidecar, "Score"), before) == {"OK": 3, "CANCELLED": 2}


def test_a_cancelled_stream_frees_the_worker(sidecar, client):
    before = answered_by_code(sidecar, "ScoreStream")
    requests = iter([score_request(X, HEAVY, "slow")])
    stream = client.stub.ScoreStream(requests, timeout=60)
    assert wait_for(lambda: metric(sidecar, "probesidecar_rpc_in_flight", rpc="ScoreStream") == 1,
                    10)
    time.sleep(0.2)
    stream.cancel()
    assert wait_for(
        lambda: metric(sidecar, "probesidecar_rpc_in_flight", rpc="ScoreStream") == 0, 1.0)
    assert_serves_promptly(client)
    assert difference(answered_by_code(sidecar, "ScoreStream"), before) == {"CANCELLED": 1}
