"""Zero-copy serving on a real GPU: a torch process owns bf16 hidden states, registers them over
CUDA IPC, and scores them through the CUDA backend; float64 torch is the reference.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1).
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time

import grpc
import numpy as np
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar, sidecar_fixture  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file, float64_scores, rel_error  # noqa: E402
from probe_sidecar import ProbeSidecarError  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probe_sidecar.results import score_result  # noqa: E402
from probesidecar.v1 import buffers_pb2, score_pb2  # noqa: E402

H = 4096


def reference(x: torch.Tensor, rows, weight, bias, activation="none") -> torch.Tensor:
    """The float64 scores, through the probe set's activation."""
    scores = float64_scores(x, rows, weight, bias)
    return torch.sigmoid(scores) if activation == "sigmoid" else scores


sidecar = sidecar_fixture("--backend=cuda", "--warmup-rows=1,64")


@pytest.fixture(scope="module")
def probe_sets(sidecar):
    torch.manual_seed(0)
    sets = {}
    with sidecar.client() as c:
        for name, p, activation in [("p1", 1, "none"), ("p16", 16, "sigmoid"), ("p128", 128, "none"),
                                    ("p1024", 1024, "none")]:
            weight, bias = bf16_probes(p, H)
            c.load_probe_set(name, data=bf16_tensor_file(weight, bias, {"activation": activation}))
            sets[name] = (weight, bias, activation)
    return sets


@pytest.fixture
def tclient(sidecar):
    with TorchClient(sidecar.uds_target) as c:
        yield c


def test_server_runs_the_cuda_backend(sidecar):
    with sidecar.client() as c:
        info = c.server_info()
    assert info.backend == "cuda"
    assert info.device_name
    # The compute capability torch reads, and the paths of this build on it: the sm_90a ones
    # only on compute capability 9.0 (docs/gpu-support.md).
    major, minor = torch.cuda.get_device_capability()
    assert info.compute_capability == f"{major}.{minor}"
    portable = {"fused_cuda", "fused_tc", "gather_gemm", "split_kv", "baseline"}
    assert portable <= set(info.kernel_paths)
    if (major, minor) != (9, 0):
        assert not {"gather_wgmma", "split_kv_sm90a"} & set(info.kernel_paths)


@pytest.mark.parametrize("name", ["p1", "p16", "p128", "p1024"])
@pytest.mark.parametrize("num_rows", [1, 7, 64, 1000, 8192])
def test_ipc_scores_match_torch_float64(tclient, probe_sets, name, num_rows):
    weight, bias, activation = probe_sets[name]
    x = torch.randn(16384, H, device="cuda", dtype=torch.bfloat16)
    rows = torch.randint(0, 16384, (num_rows,)).tolist()
    rows[0] = 16383  # boundary row
    if num_rows > 2:
        rows[1] = rows[2]  # duplicate
    result = tclient.score(x, rows, name)
    assert result.scores.shape == (num_rows, weight.shape[0])
    assert result.kernel_path in {"fused_cuda", "fused_tc", "gather_gemm", "gather_wgmma"}
    assert rel_error(result.scores, reference(x, rows, weight, bias, activation)) <= 1e-3


def test_sub_views_at_nonzero_offsets_and_strided_rows(tclient, probe_sets):
    weight, bias, activation = probe_sets["p16"]
    big = torch.randn(3000, H + 320, device="cuda", dtype=torch.bfloat16)
    view = big[1000:2500, 64:64 + H]  # storage offset 1000 rows + 64 elements; row stride H + 320
    assert view.storage_offset() > 0 and view.stride(0) == H + 320
    rows = list(range(0, 1500, 7))
    result = tclient.score(view, rows, "p16")
    assert rel_error(result.scores, reference(view, rows, weight, bias, activation)) <= 1e-3
    # A second view of the same storage reuses the registration.
    other = big[5:9, 100:100 + H]
    result = tclient.score(other, [3, 0], "p16")
    assert rel_error(result.scores, reference(other, [3, 0], weight, bias, activation)) <= 1e-3
    assert len(tclient._registered) == 1


def test_two_tensors_in_one_allocation_share_a_mapping(sidecar, tclient, probe_sets):
    weight, bias, activation = probe_sets["p1"]
    # Small tensors come out of one 2 MB cudaMalloc segment of torch's caching allocator: two
    # storages, one allocation, one IPC handle.
    tensors = [torch.randn(8, H, device="cuda", dtype=torch.bfloat16) for _ in range(16)]
    by_handle = {}
    for t in tensors:
        by_handle.setdefault(bytes(t.untyped_storage()._share_cuda_()[1]), []).append(t)
    t1, t2 = next(group for group in by_handle.values() if len(group) >= 2)[:2]
    assert t1.untyped_storage().data_ptr() != t2.untyped_storage().data_ptr()
    r1, r2 = tclient.register(t1), tclient.register(t2)
    assert r1.buffer_id != r2.buffer_id
    assert r2.shared_mapping  # the second registration reuses the first one's mapping
    for t in (t1, t2):
        result = tclient.score(t, [0, 7], "p1")
        assert rel_error(result.scores, reference(t, [0, 7], weight, bias, activation)) <= 1e-3


def test_output_buffer(tclient, probe_sets):
    weight, bias, activation = probe_sets["p128"]
    x = torch.randn(512, H, device="cuda", dtype=torch.bfloat16)
    rows = list(range(0, 512, 3))
    out = torch.full((len(rows), 128), float("nan"), device="cuda")
    result = tclient.score(x, rows, "p128", out=out)
    assert result.scores.size == 0
    torch.cuda.synchronize()
    assert not torch.isnan(out).any()
    assert rel_error(out, reference(x, rows, weight, bias, activation)) <= 1e-3


def test_bad_references_are_refused(tclient, probe_sets):
    x = torch.randn(8, H, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ProbeSidecarError) as error:
        tclient.score(x, [8], "p1")
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
    ref = tclient.tensor_ref(x)
    ref.shape[0] = 10**6  # extent past the registered window
    request = score_pb2.ScoreRequest(probe_set="p1", rows=[0], activations=ref,
                                     session_id=tclient.session_id)
    with pytest.raises(ProbeSidecarError) as error:
        tclient.client.call(tclient.client.stub.Score, request)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT and "past the end" in error.value.message
    ref.shape[0] = 4  # leaves room in the window, so the offset's alignment is what is wrong
    ref.buffer.offset_bytes = 1  # misaligned
    request = score_pb2.ScoreRequest(probe_set="p1", rows=[0], activations=ref,
                                     session_id=tclient.session_id)
    with pytest.raises(ProbeSidecarError) as error:
        tclient.client.call(tclient.client.stub.Score, request)
    assert "misaligned" in error.value.message
    bogus = buffers_pb2.RegisterBufferRequest(handle=b"\x07" * 64, byte_size=16,
                                              session_id=tclient.session_id)
    with pytest.raises(ProbeSidecarError) as error:
        tclient.client.call(tclient.client.stub.RegisterBuffer, bogus)
    assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT and "cudaIpcOpenMemHandle" in error.value.message


def test_unregister_while_in_flight_is_deferred(probe_sets):
    """Unregistering a buffer that queued requests still read is deferred: the call says so, the
    buffer is listed as closing, every admitted request completes correctly, new requests naming
    it are refused, and it closes once the last one finishes."""
    weight, bias, activation = probe_sets["p1024"]
    # One stream slot, so that requests queue behind each other and hold their leases.
    with Sidecar(["--backend=cuda", "--cuda-workers=1", "--warmup-rows=8192",
                  "--metrics-listen=none"]) as server, TorchClient(server.uds_target) as tc:
        with server.client() as c:
            c.load_probe_set("p1024",
                             data=bf16_tensor_file(weight, bias, {"activation": activation}))
        x = torch.randn(16384, H, device="cuda", dtype=torch.bfloat16)
        rows = torch.randint(0, 16384, (8192,)).tolist()
        ref = reference(x, rows, weight, bias, activation)
        buffer_id = tc.register(x).buffer_id
        request = score_pb2.ScoreRequest(probe_set="p1024", rows=rows, session_id=tc.session_id)
        request.activations.CopyFrom(tc.tensor_ref(x))
        torch.cuda.synchronize()
        # 24 requests in flight at once (each a [8192, 4096] x [4096, 1024] GEMM): the server
        # admits them all (each takes a lease on the buffer) and runs them one after another.
        futures = [tc.client.stub.Score.future(request, timeout=120) for _ in range(24)]
        deferred = tc.unregister(x)
        listed = {b.buffer_id: b for b in tc.client.stub.ListBuffers(
            buffers_pb2.ListBuffersRequest(), timeout=10).buffers}
        # Naming the buffer after the unregister is refused, while the old requests still run.
        with pytest.raises(ProbeSidecarError) as refused:
            tc.client.call(tc.client.stub.Score, request)
        results = [f.result() for f in futures]  # raises if any admitted request failed
        assert deferred, "requests were using the buffer: the unregister must be deferred"
        assert buffer_id in listed and listed[buffer_id].closing and listed[buffer_id].in_flight > 0
        assert refused.value.code == grpc.StatusCode.NOT_FOUND
        for r in results:
            assert rel_error(score_result(r).scores, ref) <= 1e-3
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            buffers = tc.client.stub.ListBuffers(buffers_pb2.ListBuffersRequest(), timeout=10)
            if all(b.buffer_id != buffer_id for b in buffers.buffers):
                break
            time.sleep(0.01)
        else:
            pytest.fail("the buffer was not closed after its last request")


def test_client_that_dies_without_unregistering_is_released(sidecar, probe_sets):
    child = textwrap.dedent(f"""
        import os, torch
        from probe_sidecar.torch import TorchClient
        c = TorchClient({sidecar.uds_target!r})
        x = torch.randn(1024, {H}, device="cuda", dtype=torch.bfloat16)
        c.score(x, [0, 1], "p1")
        print("buffer", c.register(x).buffer_id, flush=True)
        os._exit(0)  # no unregister, no close
    """)
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120)
    assert "buffer" in out.stdout, out.stderr
    buffer_id = int(out.stdout.split()[-1])
    with sidecar.client() as c:
        deadline = time.monotonic() + 10
        listed = True
        while listed and time.monotonic() < deadline:
            buffers = c.stub.ListBuffers(buffers_pb2.ListBuffersRequest(), timeout=10).buffers
            listed = any(b.buffer_id == buffer_id for b in buffers)
            time.sleep(0.02)
        assert not listed, "the dead client's buffer is still registered"
        assert "closed: its buffers are released" in sidecar.log()
        # and the server keeps serving
        x = np.random.default_rng(0).standard_normal((2, H)).astype(np.float32)
        assert c.score(x, [1], "p1").scores.shape == (1, 1)


def test_expandable_segments_are_refused_with_the_fix(sidecar):
    child = textwrap.dedent(f"""
        import torch
        from probe_sidecar.torch import TorchClient
        from probe_sidecar import ProbeSidecarError
        c = TorchClient({sidecar.uds_target!r})
        x = torch.randn(64, {H}, device="cuda", dtype=torch.bfloat16)
        try:
            c.register(x)
            print("accepted")
        except ProbeSidecarError as e:
            print(e.code.name, e.message)
    """)
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    out = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=120, env=env)
    assert "UNIMPLEMENTED" in out.stdout and "expandable_segments" in out.stdout, out.stdout + out.stderr


def test_graph_cache_replays(sidecar, tclient, probe_sets):
    x = torch.randn(256, H, device="cuda", dtype=torch.bfloat16)
    with sidecar.client() as c:
        before = c.server_info().graph_cache
        for _ in range(20):
            tclient.score(x, [1, 2, 3], "p16")
        after = c.server_info().graph_cache
    # Each stream slot (4 by default) keeps its own graphs: a shape not warmed up is captured at
    # most once per slot, and every other request replays.
    assert after.captures - before.captures <= 4
    assert after.hits - before.hits >= 20 - (after.captures - before.captures)


def test_another_sessions_buffer_is_refused(sidecar, probe_sets):
    """One tenant cannot read (or write) another's memory: a buffer is usable only by the session
    that registered it, and only that session may unregister it."""
    with TorchClient(sidecar.uds_target) as a, TorchClient(sidecar.uds_target) as b:
        x = torch.randn(64, H, device="cuda", dtype=torch.bfloat16)
        registration = a.register(x)
        request = score_pb2.ScoreRequest(probe_set="p1", rows=[0], activations=a.tensor_ref(x),
                                         session_id=b.session_id)
        with pytest.raises(ProbeSidecarError) as error:
            b.client.call(b.client.stub.Score, request)
        assert error.value.code == grpc.StatusCode.PERMISSION_DENIED
        with pytest.raises(ProbeSidecarError) as error:
            b.client.call(b.client.stub.UnregisterBuffer, buffers_pb2.UnregisterBufferRequest(
                buffer_id=registration.buffer_id, session_id=b.session_id))
        assert error.value.code == grpc.StatusCode.PERMISSION_DENIED
        assert a.score(x, [0], "p1").scores.shape == (1, 1)  # still the owner's
