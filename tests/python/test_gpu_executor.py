"""The CUDA executor never blocks gRPC's threads: with every stream slot busy on long requests and
more queued behind them, ServerInfo and health still answer at once, and every queued request
then completes correctly.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1).
"""

from __future__ import annotations

import time


from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file, float64_scores, rel_error  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probesidecar.v1 import score_pb2, sidecar_pb2  # noqa: E402

T, H, P, R = 65536, 8192, 2048, 65536  # one request: a gather + [65536, 8192] x [8192, 2048]
REQUESTS = 48


def test_control_rpcs_answer_while_every_stream_slot_is_busy():
    torch.manual_seed(1)
    weight, bias = bf16_probes(P, H, device="cpu")
    data = bf16_tensor_file(weight, bias, {"activation": "none"})
    with Sidecar(["--backend=cuda", "--cuda-workers=2", "--warmup-rows=1",
                  "--max-message-bytes=128Mi"]) as server, TorchClient(server.uds_target) as tc:
        with server.client(max_message_bytes=128 << 20) as c:
            c.load_probe_set("big", data=data)
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        out = torch.full((R, P), float("nan"), device="cuda")
        rows = torch.randperm(T)[:R].tolist()
        request = score_pb2.ScoreRequest(probe_set="big", rows=rows, session_id=tc.session_id)
        request.activations.CopyFrom(tc.tensor_ref(x))
        request.output.CopyFrom(tc.tensor_ref(out))
        torch.cuda.synchronize()
        started = time.monotonic()
        futures = [tc.client.stub.Score.future(request, timeout=300) for _ in range(REQUESTS)]

        # grpc.health.v1.Health/Check with an empty request (service ""), without needing the
        # grpcio-health-checking package: SERVING is field 1 = 1, i.e. the bytes 08 01.
        health = tc.client.channel.unary_unary("/grpc.health.v1.Health/Check",
                                                request_serializer=lambda _: b"",
                                                response_deserializer=lambda b: b)
        latencies = []
        busy_samples = 0
        while not all(f.done() for f in futures) and len(latencies) < 200:
            t0 = time.monotonic()
            info = tc.client.stub.ServerInfo(sidecar_pb2.ServerInfoRequest(), timeout=10)
            reply = health(None, timeout=10)
            latencies.append(time.monotonic() - t0)
            assert info.backend == "cuda" and reply == b"\x08\x01"
            busy_samples += sum(not f.done() for f in futures) > 2  # slots busy and a queue
            time.sleep(0.002)
        for f in futures:
            f.result()  # raises on any failure
        elapsed = time.monotonic() - started
        torch.cuda.synchronize()
        # Each request wrote the same scores: check a sample of rows against float64.
        ref = float64_scores(x, rows[:256], weight, bias)
        rel = rel_error(out[:256], ref)
        assert rel <= 1e-3, rel
        assert not torch.isnan(out).any()
        worst = max(latencies)
        print(f"{REQUESTS} requests in {elapsed:.2f} s; {len(latencies)} ServerInfo+health pairs "
              f"while busy ({busy_samples} with more than 2 requests waiting): "
              f"p50 {1e3 * sorted(latencies)[len(latencies) // 2]:.2f} ms, max {1e3 * worst:.2f} ms")
        assert busy_samples >= 5, "the requests finished too fast to test anything"
        assert worst < 0.1, f"ServerInfo + health took {worst * 1e3:.1f} ms while the GPU was busy"
