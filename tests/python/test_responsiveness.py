"""gRPC's threads never wait for scoring work: with the CPU backend's only thread busy on long
requests and more queued behind it, ServerInfo, ListProbeSets and health answer at once; the
queued requests then all complete, and the queue stage shows they waited."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import Sidecar
from probe_files import safetensors_bytes

H, P, R, REQUESTS = 4096, 256, 256, 8


def test_control_rpcs_answer_while_the_executor_is_busy():
    rng = np.random.default_rng(3)
    weight = (rng.standard_normal((P, H)) / H**0.5).astype(np.float32)
    bias = rng.standard_normal(P).astype(np.float32)
    x = rng.standard_normal((R, H)).astype(np.float32)
    data = safetensors_bytes({"weight": (weight, "fp32"), "bias": (bias, "fp32")})
    with Sidecar(["--backend=cpu", "--cpu-threads=1"]) as server, server.client() as c:
        c.load_probe_set("wide", data=data)
        health = health_pb2_grpc.HealthStub(c.channel)
        with ThreadPoolExecutor(REQUESTS) as pool:
            started = time.monotonic()
            futures = [pool.submit(c.score, x, list(range(R)), "wide") for _ in range(REQUESTS)]
            latencies = []
            while not all(f.done() for f in futures):
                t0 = time.monotonic()
                c.server_info()
                c.list_probe_sets()
                health.Check(health_pb2.HealthCheckRequest(), timeout=10)
                latencies.append(time.monotonic() - t0)
                time.sleep(0.005)
            results = [f.result() for f in futures]
        elapsed = time.monotonic() - started
    ref = (x.astype(np.float64) @ weight.T.astype(np.float64)) + bias
    for r in results:
        np.testing.assert_allclose(r.scores, ref, rtol=1e-4, atol=1e-4)
    # One thread scoring 8 x [256, 4096] x [4096, 256]: the requests take long enough that the
    # control RPCs above really overlapped them.
    assert len(latencies) >= 10, f"only {len(latencies)} probes in {elapsed:.2f} s"
    worst = max(latencies)
    assert worst < 0.25, f"ServerInfo + ListProbeSets + health took {worst * 1e3:.0f} ms"
