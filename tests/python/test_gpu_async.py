"""GPU-side ordering and device-resident requests on a real GPU, across two processes (this
torch process and the real server): no host synchronisation on either side, checked against
float64 torch.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1).
"""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file, float64_scores, rel_error  # noqa: E402
from probe_sidecar import ProbeSidecarError  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probesidecar.v1 import score_pb2, tensor_pb2  # noqa: E402

T, H, P = 4096, 4096, 16


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(7)
    weight, bias = bf16_probes(P, H)
    with Sidecar(["--backend=cuda", "--warmup-rows=1,64"]) as server:
        with server.client() as c:
            c.load_probe_set("p16", data=bf16_tensor_file(weight, bias, {"activation": "none"}))
        yield server, weight, bias
        assert server.process.poll() is None, server.log()


def test_slow_producer_on_the_gpu_is_waited_for_without_host_syncs(setup):
    """The client's stream writes new hidden states and rows after a long sleep kernel; the server
    must score those new values, so its stream must wait on the GPU for the ready event. A
    missing wait shows as scores of the previous iteration's data."""
    server, weight, bias = setup
    with TorchClient(server.uds_target) as tc:
        x = torch.empty(T, H, device="cuda", dtype=torch.bfloat16)
        rows = torch.empty(64, device="cuda", dtype=torch.int32)
        out = torch.full((64, P), float("nan"), device="cuda")
        history, expected = [], []
        stream = torch.cuda.current_stream()
        for i in range(40):
            torch.cuda._sleep(2_000_000)  # ~1 ms of GPU time before the writes
            x.normal_()
            rows.copy_(torch.randint(0, T, (64,), device="cuda", dtype=torch.int32))
            handle = tc.score_async(x, rows, "p16", out=out)
            expected.append(float64_scores(x, rows, weight, bias))  # same stream: the same inputs
            handle.wait_stream(stream)  # GPU-side: the scores are written before we copy them
            history.append(out.clone())
            out.fill_(float("nan"))
            assert handle.response().enqueued
        torch.cuda.synchronize()
        for i, (got, want) in enumerate(zip(history, expected)):
            rel = rel_error(got, want)
            assert rel <= 1e-3, f"iteration {i}: relative error {rel:.3g} (stale inputs?)"


def test_async_loop_with_host_rows_and_inline_scores(setup):
    server, weight, bias = setup
    with TorchClient(server.uds_target) as tc:
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        handles, wants = [], []
        for i in range(32):
            rows = np.random.default_rng(i).integers(0, T, 8).tolist()
            handles.append(tc.score_async(x, rows, "p16", request_id=i))
            wants.append(float64_scores(x, rows, weight, bias).cpu().numpy())
        for i, (handle, want) in enumerate(zip(handles, wants)):
            result = handle.result(timeout=60)
            assert result.request_id == i
            np.testing.assert_allclose(result.scores, want, rtol=1e-3, atol=1e-3)
            assert not handle.response().enqueued  # inline scores: answered after the GPU


def test_invalid_device_rows_give_nan_and_a_clear_error(setup):
    server, weight, bias = setup
    with TorchClient(server.uds_target) as tc:
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        rows = torch.tensor([1, T, 2, -5], device="cuda", dtype=torch.int32)
        out = torch.zeros(4, P, device="cuda")
        # Synchronous (no done event): the answer says which rows were bad.
        request = score_pb2.ScoreRequest(probe_set="p16", session_id=tc.session_id)
        request.activations.CopyFrom(tc.tensor_ref(x))
        request.device_rows.CopyFrom(
            tc._buffer_ref(rows, tensor_pb2.DTYPE_INT32, [rows.numel()], 0))
        request.output.CopyFrom(tc.tensor_ref(out))
        torch.cuda.synchronize()
        with pytest.raises(ProbeSidecarError) as error:
            tc.client.call(tc.client.stub.Score, request)
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "2 of the 4 row indices" in error.value.message
        torch.cuda.synchronize()
        assert torch.isnan(out[1]).all() and torch.isnan(out[3]).all()
        want = float64_scores(x, torch.tensor([1, 2], device="cuda"), weight, bias)
        got = out[[0, 2]].double()
        assert rel_error(got, want) <= 1e-3
        # Asynchronous: NaN in the output, and the counter.
        out.zero_()
        tc.score_async(x, rows, "p16", out=out).wait_stream()
        torch.cuda.synchronize()
        assert torch.isnan(out[1]).all() and not torch.isnan(out[0]).any()
        assert "probesidecar_invalid_device_rows_total 4" in server.metrics_text()


def test_another_sessions_events_are_refused(setup):
    server, _, _ = setup
    with TorchClient(server.uds_target) as a, TorchClient(server.uds_target) as b:
        x = torch.randn(64, H, device="cuda", dtype=torch.bfloat16)
        a.score_async(x, [0], "p16").wait()  # creates and registers a's events
        pair = a._event_pools[0]._free[0]
        request = score_pb2.ScoreRequest(probe_set="p16", rows=[0], session_id=b.session_id,
                                         ready_event=pair.ready_id)
        request.activations.CopyFrom(b.tensor_ref(x))
        with pytest.raises(ProbeSidecarError) as error:
            b.client.call(b.client.stub.Score, request)
        assert error.value.code == grpc.StatusCode.PERMISSION_DENIED
        request.ready_event = 10**9
        with pytest.raises(ProbeSidecarError) as error:
            b.client.call(b.client.stub.Score, request)
        assert error.value.code == grpc.StatusCode.NOT_FOUND
