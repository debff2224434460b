"""Limits and overload against the real server (CPU backend, one scoring thread): the executor's
queue is bounded by --max-queued-requests and refuses at once past it; a request whose deadline
passes while it waits is not run (DEADLINE_EXCEEDED, counted); a request whose caller cancels —
waiting or running — frees the worker at once, and every call is answered exactly once."""

from __future__ import annotations


import grpc
import numpy as np
import pytest

from conftest import Sidecar
from probe_files import ProbeFile
from probe_sidecar import score_request
from server_state import SAFETY_S, answered_by_code, cpu_seconds, difference, metric, wait_for

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


def server_cpu(sidecar) -> float:
    return cpu_seconds(sidecar.process.pid)


def in_flight(sidecar, rpc: str = "Score") -> float:
    return metric(sidecar, "probesidecar_rpc_in_flight", rpc=rpc)


def queued(sidecar) -> float:
    return metric(sidecar, "probesidecar_executor_queued_requests")


# CPU time the server spends only by scoring: validating a request and answering a scrape cost
# well under a millisecond each.
SCORING_CPU_SECONDS = 0.1


def wait_scoring_alone(sidecar, rpc: str, cpu_before: float):
    """Waits until exactly one call of `rpc` is in progress, nothing waits in the queue, and the
    server has spent SCORING_CPU_SECONDS of CPU since `cpu_before` (read before the call was
    sent): the call holds the only scoring thread and is being scored, past its validation."""
    assert wait_for(lambda: in_flight(sidecar, rpc) == 1 and queued(sidecar) == 0
                    and server_cpu(sidecar) - cpu_before >= SCORING_CPU_SECONDS, SAFETY_S, 0.05)


def assert_serves(client):
    assert client.score(X, SMALL, "slow").scores.shape == (64, P)


def test_a_full_queue_refuses_at_once_and_names_the_flag(sidecar, client):
    assert metric(sidecar, "probesidecar_executor_queue_capacity") == 2
    cpu_before = server_cpu(sidecar)
    running = send(client, HEAVY, timeout=SAFETY_S)
    wait_scoring_alone(sidecar, "Score", cpu_before)
    waiting = [send(client, SMALL, timeout=SAFETY_S) for _ in range(2)]
    assert wait_for(lambda: queued(sidecar) == 2, SAFETY_S)
    # Refused, not queued until a worker is free: a call that waited would be scored once the
    # running one is cancelled, and answer OK.
    with pytest.raises(grpc.RpcError) as refused:
        client.stub.Score(score_request(X, SMALL, "slow"), timeout=10)
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "--max-queued-requests" in refused.value.details()
    # The admission limit (--max-concurrent-requests, 256) was not what refused it.
    assert in_flight(sidecar) == 3
    running.cancel()
    for call in waiting:
        assert len(call.result(timeout=SAFETY_S).scores) == len(SMALL) * P * 4
    assert wait_for(lambda: in_flight(sidecar) == 0, SAFETY_S)


def test_a_request_past_its_deadline_does_not_run(sidecar, client):
    before = answered_by_code(sidecar, "Score")
    expired_before = metric(sidecar, "probesidecar_executor_expired_requests_total")
    cpu_before = server_cpu(sidecar)
    blocker = send(client, BLOCKER, timeout=SAFETY_S)
    wait_scoring_alone(sidecar, "Score", cpu_before)
    late = send(client, HEAVY, timeout=0.2)  # waits behind the blocker past its deadline
    assert late.exception(timeout=10).code() == grpc.StatusCode.DEADLINE_EXCEEDED
    assert len(blocker.result(timeout=SAFETY_S).scores) == len(BLOCKER) * P * 4
    assert_serves(client)
    # The executor dropped the late request when it took it: it never ran.
    assert metric(sidecar, "probesidecar_executor_expired_requests_total") == expired_before + 1
    assert difference(answered_by_code(sidecar, "Score"), before) == {"OK": 2,
                                                                       "DEADLINE_EXCEEDED": 1}


def test_cancelling_frees_the_worker_whether_waiting_or_running(sidecar, client):
    before = answered_by_code(sidecar, "Score")
    cancelled_before = metric(sidecar, "probesidecar_executor_cancelled_requests_total")
    # Waiting: skipped when the worker takes it.
    cpu_before = server_cpu(sidecar)
    blocker = send(client, BLOCKER, timeout=SAFETY_S)
    wait_scoring_alone(sidecar, "Score", cpu_before)
    waiting = send(client, HEAVY, timeout=SAFETY_S)
    assert wait_for(lambda: queued(sidecar) == 1, SAFETY_S)
    waiting.cancel()
    assert len(blocker.result(timeout=SAFETY_S).scores) == len(BLOCKER) * P * 4
    assert_serves(client)
    # Running: stopped between two tasks (a task is ~2 M multiply-adds, well under a millisecond).
    cpu_before = server_cpu(sidecar)
    running = send(client, HEAVY, timeout=SAFETY_S)
    wait_scoring_alone(sidecar, "Score", cpu_before)
    running.cancel()
    assert wait_for(lambda: in_flight(sidecar) == 0, SAFETY_S)
    assert_serves(client)
    # Both were dropped by the executor (skipped, stopped early): had either run to its end, it
    # would be answered CANCELLED all the same but not counted here.
    assert metric(sidecar, "probesidecar_executor_cancelled_requests_total") == cancelled_before + 2
    assert difference(answered_by_code(sidecar, "Score"), before) == {"OK": 3, "CANCELLED": 2}


def test_a_cancelled_stream_frees_the_worker(sidecar, client):
    before = answered_by_code(sidecar, "ScoreStream")
    cancelled_before = metric(sidecar, "probesidecar_executor_cancelled_requests_total")
    requests = iter([score_request(X, HEAVY, "slow")])
    cpu_before = server_cpu(sidecar)
    stream = client.stub.ScoreStream(requests, timeout=SAFETY_S)
    wait_scoring_alone(sidecar, "ScoreStream", cpu_before)
    stream.cancel()
    assert wait_for(lambda: in_flight(sidecar, "ScoreStream") == 0, SAFETY_S)
    assert_serves(client)
    # Stopped by the executor between two tasks, not run to its end (~8 s).
    assert metric(sidecar, "probesidecar_executor_cancelled_requests_total") == cancelled_before + 1
    assert difference(answered_by_code(sidecar, "ScoreStream"), before) == {"CANCELLED": 1}
