"""gRPC's threads never wait for scoring work: with the CPU backend's only thread busy on long
requests and more queued behind it, ServerInfo, ListProbeSets and health answer, again and again,
while requests wait for it; the queued requests then all complete."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import Sidecar
from probe_files import safetensors_bytes
from server_state import SAFETY_S

H, P, R, REQUESTS = 4096, 256, 256, 8


def test_control_rpcs_answer_while_the_executor_is_busy():
    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((P, H)) / H**0.5).astype(np.float32)
    bias = rng.standard_normal(P).astype(np.float32)
    x = rng.standard_normal((R, H)).astype(np.float32)
    data = safetensors_bytes({"weight": (weight, "fp32"), "bias": (bias, "fp32")})
    with Sidecar(["--backend=cpu", "--cpu-threads=1"]) as server, \
            server.client(timeout=SAFETY_S) as c:
        c.load_probe_set("wide", data=data)
        health = health_pb2_grpc.HealthStub(c.channel)
        with ThreadPoolExecutor(REQUESTS) as pool:
            started = time.monotonic()
            futures = [pool.submit(c.score, x, list(range(R)), "wide") for _ in range(REQUESTS)]
            # Rounds of control RPCs whose ServerInfo was answered while requests waited for the
            # scoring thread.
            rounds = 0
            while not all(f.done() for f in futures):
                info = c.server_info()
                c.list_probe_sets()
                health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                rounds += info.queued_requests > 0
            results = [f.result() for f in futures]
        elapsed = time.monotonic() - started
    ref = (x.astype(np.float64) @ weight.T.astype(np.float64)) + bias
    for r in results:
        np.testing.assert_allclose(r.scores, ref, rtol=1e-4, atol=1e-4)
    # One thread scoring 8 x [256, 4096] x [4096, 256]: the control RPCs answered again and again
    # while requests waited for it (one that waited for the scoring would find none waiting).
    assert rounds >= 10, f"only {rounds} rounds answered while requests waited, in {elapsed:.2f} s"
