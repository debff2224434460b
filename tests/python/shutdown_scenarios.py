"""The SIGTERM scenarios that test_shutdown.py holds to the promises and bench/shutdown/run.py
times: an idle server with what clients leave open, a loaded one, and one that has just sent a
large response. Each starts its own CPU-backend server and reports what happened; the callers
judge it."""

from __future__ import annotations

import contextlib
import dataclasses
import signal
import socket
import threading
import time

import grpc
import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import Sidecar
from probe_files import ProbeFile
from probe_sidecar import score_request
from server_state import metric, wait_for

H, P = 65536, 16  # 1 M multiply-adds a row: ~0.2 s for the 1000 rows of one request here
X = np.random.default_rng(0).standard_normal((1, H)).astype(np.float32)
REQUEST_SECONDS = 0.2  # the rows of a loaded request are sized to take about this long
CLIENTS = 6
PROBE = ProbeFile(P, H, seed=2)


@dataclasses.dataclass
class Exit:
    """One SIGTERM: seconds from the signal to the process's exit, its exit status, its log, and
    whether its Unix socket file was left behind."""
    seconds: float
    code: int
    log: str
    socket_left: bool


@dataclasses.dataclass
class LoadedExit(Exit):
    drained_ok: int = 0  # calls answered OK after the signal
    codes: frozenset = frozenset()  # the status codes the clients saw
    unanswered: int = 0  # client threads still waiting for an answer 30 s after the exit


@contextlib.contextmanager
def held_open(s: Sidecar):
    """What clients leave open on a server: a health Watch, an idle ScoreStream, an idle channel,
    and a TCP connection that never sends a byte."""
    channel = grpc.insecure_channel(s.uds_target)
    watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
    assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
    pending = threading.Event()
    stream = s.client().stub.ScoreStream(iter(pending.wait, True), timeout=60)
    host, port = s.tcp_target.rsplit(":", 1)
    silent = socket.create_connection((host, int(port)))
    try:
        yield
    finally:
        silent.close()
        stream.cancel()
        watch.cancel()
        channel.close()


def _sigterm(s: Sidecar) -> tuple[float, int]:
    start = time.monotonic()
    s.signal(signal.SIGTERM)
    code = s.wait(timeout=60)
    return time.monotonic() - start, code


def _exit(s: Sidecar, seconds: float, code: int) -> Exit:
    return Exit(seconds, code, s.log(), s.socket.exists())


def idle_exit(grace: float) -> Exit:
    """An idle server that answered one call, holding what clients leave open (held_open)."""
    s = Sidecar(["--backend=cpu", f"--shutdown-grace-seconds={grace}"]).start()
    try:
        with s.client() as c:
            c.server_info()
        with held_open(s):
            seconds, code = _sigterm(s)
        return _exit(s, seconds, code)
    finally:
        s.close()


def large_response_exit(grace: float) -> Exit:
    """One Score whose 1 MiB response the client reads after the server's write would block, the
    client closes its channel, SIGTERM."""
    x = np.random.default_rng(3).standard_normal((1, 4096)).astype(np.float32)
    s = Sidecar(["--backend=cpu", f"--shutdown-grace-seconds={grace}"]).start()
    try:
        with s.client(timeout=60) as c:
            assert c.score(x, np.zeros(65536, np.int32), "demo").scores.shape == (65536, 4)
        seconds, code = _sigterm(s)
        return _exit(s, seconds, code)
    finally:
        s.close()


def rows_for_one_request(s: Sidecar) -> np.ndarray:
    """Rows of probe set 'wide' that one scoring thread of `s` scores in about REQUEST_SECONDS (a
    sanitized build is ~12x slower than a release one)."""
    with s.client(timeout=60) as c:
        c.score(X, np.zeros(100, np.int32), "wide")  # warm
        timings = []
        for _ in range(3):  # the fastest: a hiccup must not shrink the load below the grace
            start = time.monotonic()
            c.score(X, np.zeros(100, np.int32), "wide")
            timings.append(time.monotonic() - start)
        per_row = min(timings) / 100
    return np.zeros(max(10, min(4000, int(REQUEST_SECONDS / per_row))), np.int32)


def loaded_exit(grace: float, rows: np.ndarray | None = None) -> tuple[LoadedExit, np.ndarray]:
    """One scoring thread, CLIENTS clients keeping two requests of `rows` each in flight (sized
    with rows_for_one_request when None), SIGTERM once the server holds all of them. Returns the
    exit and the rows used."""
    s = Sidecar(["--backend=cpu", "--cpu-threads=1", f"--shutdown-grace-seconds={grace}"])
    s.start()
    try:
        with s.client() as c:
            c.load_probe_set("wide", data=PROBE.data)
        if rows is None:
            rows = rows_for_one_request(s)
        answers: list[tuple[float, grpc.StatusCode]] = []
        lock = threading.Lock()

        def traffic():
            # Each client keeps two ~0.2 s requests in flight; with one scoring thread ~2.4 s of
            # work waits at any time, more than the grace period, while the request running when
            # the signal comes finishes in it even on a host five times slower.
            request = score_request(X, rows, "wide")
            with s.client(timeout=30) as c:
                pending = [c.stub.Score.future(request, timeout=30) for _ in range(2)]
                while pending:
                    try:
                        pending.pop(0).result()
                        code = grpc.StatusCode.OK
                    except grpc.RpcError as error:
                        code = error.code()
                    with lock:
                        answers.append((time.monotonic(), code))
                    if code == grpc.StatusCode.OK:
                        pending.append(c.stub.Score.future(request, timeout=30))

        threads = [threading.Thread(target=traffic) for _ in range(CLIENTS)]
        with held_open(s):
            for t in threads:
                t.start()
            # Every client's two requests are in the server (one scoring, the rest queued).
            assert wait_for(lambda: metric(s, "probesidecar_rpc_in_flight", rpc="Score")
                            == 2 * CLIENTS, 30), "the clients' requests did not all arrive"
            signalled = time.monotonic()
            seconds, code = _sigterm(s)
            for t in threads:
                t.join(timeout=30)
        with lock:
            codes = frozenset(code for _, code in answers)
            drained = sum(1 for at, code in answers
                          if at > signalled and code == grpc.StatusCode.OK)
        return LoadedExit(seconds, code, s.log(), s.socket.exists(), drained_ok=drained,
                          codes=codes, unanswered=sum(t.is_alive() for t in threads)), rows
    finally:
        s.close()
