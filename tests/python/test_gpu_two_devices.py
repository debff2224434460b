"""One sidecar for two GPUs (--devices=0,1), as a tensor-parallel pod runs it: two client
processes, one on GPU 0 and one on GPU 1, score through it at once, every answer of the checked
phase compared with float64; the two together score at least 1.8x what one alone does; a handle
registered for the wrong device, and a request whose buffers are on two devices, are refused.

Needs two CUDA devices: on a machine with fewer it skips by its own check, saying so (also where
PROBE_SIDECAR_REQUIRE_GPU=1: the one-GPU run does not count it). Its figures (requests per second
alone and together, the ratio) are written by record_figures to <build>/reliability/
two_devices.json, which tests/gpu/run.sh brings back with the results.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import grpc
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()
if torch.cuda.device_count() < 2:
    pytest.skip(f"needs two CUDA devices; this machine has {torch.cuda.device_count()} (run it on "
                "a two-GPU machine: tests/gpu/run.sh with PYTHON_TESTS=tests/python/"
                "test_gpu_two_devices.py)", allow_module_level=True)

from conftest import Sidecar  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probesidecar.v1 import buffers_pb2, score_pb2  # noqa: E402
from server_state import record_figures  # noqa: E402

H, P, T, R = 4096, 256, 16384, 4096
CHECKED = 40          # requests per process whose inline scores are each checked
SECONDS = 4.0         # timed phase
IN_FLIGHT = 4         # requests each client process keeps in flight

# One client process on one GPU: registers its own hidden states there, checks CHECKED answers
# against float64, then, from `start` (Unix time) for SECONDS, keeps IN_FLIGHT requests in flight
# (scores to a device output buffer) and counts the answers. Prints one JSON line.
CLIENT = textwrap.dedent("""
    import json, sys, time
    import torch
    from probe_sidecar.torch import TorchClient
    from probesidecar.v1 import score_pb2
    sys.path.insert(0, %r)
    from probe_files import float64_scores, rel_error
    target, device, start, seconds, in_flight, seed = sys.argv[1:7]
    device, start, seconds, in_flight = int(device), float(start), float(seconds), int(in_flight)
    torch.manual_seed(int(seed))
    torch.cuda.set_device(device)
    H, P, T, R = %d, %d, %d, %d
    weight = torch.load(sys.argv[7]).double().to(device)  # float64 references on the GPU
    bias = torch.load(sys.argv[8]).double().to(device)
    x = torch.randn(T, H, device=device, dtype=torch.bfloat16)
    out = torch.empty(R, P, device=device, dtype=torch.float32)
    worst = 0.0
    with TorchClient(target) as tc:
        for i in range(%d):
            rows = torch.randint(0, T, (R // 8,)).tolist()
            ref = float64_scores(x, rows, weight, bias)
            worst = max(worst, rel_error(tc.score(x, rows, "p").scores, ref))
        rows = torch.randint(0, T, (R,)).tolist()
        request = score_pb2.ScoreRequest(probe_set="p", session_id=tc.session_id, rows=rows)
        request.activations.CopyFrom(tc.tensor_ref(x))
        request.output.CopyFrom(tc.tensor_ref(out))
        torch.cuda.synchronize(device)
        stub = tc.client.stub
        while time.time() < start:
            time.sleep(0.001)
        done, end = 0, start + seconds
        pending = [stub.Score.future(request) for _ in range(in_flight)]
        while pending:
            pending.pop(0).result()
            done += 1
            if time.time() < end:
                pending.append(stub.Score.future(request))
        elapsed = time.time() - start
        last = rel_error(out, float64_scores(x, rows, weight, bias))
    print(json.dumps({"device": device, "checked": %d, "worst_rel_error": worst,
                      "requests": done, "seconds": elapsed, "last_rel_error": last}))
""" % (str(pathlib.Path(__file__).parent), H, P, T, R, CHECKED, CHECKED))


@pytest.fixture(scope="module")
def sidecar(tmp_path_factory):
    with Sidecar(["--backend=cuda", "--devices=0,1", f"--warmup-rows={R // 8},{R}"]) as s:
        torch.manual_seed(0)
        weight, bias = bf16_probes(P, H, device="cpu")
        with s.client() as c:
            c.load_probe_set("p", data=bf16_tensor_file(weight, bias))
        d = tmp_path_factory.mktemp("probe")
        torch.save(weight, d / "w.pt")
        torch.save(bias, d / "b.pt")
        s.weights = (str(d / "w.pt"), str(d / "b.pt"))
        yield s
        assert s.process.poll() is None, s.log()


def run_clients(sidecar, devices) -> list[dict]:
    start = time.time() + 8.0  # after every client has registered and checked
    procs = [subprocess.Popen(
        [sys.executable, "-c", CLIENT, sidecar.uds_target, str(d), str(start), str(SECONDS),
         str(IN_FLIGHT), str(d + 1), *sidecar.weights],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for d in devices]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def test_two_processes_on_two_gpus_score_at_once_correctly_and_scale(sidecar):
    with sidecar.client() as c:
        info = c.server_info()
    assert [d.device_id for d in info.devices] == [0, 1]
    alone = run_clients(sidecar, [0])
    both = run_clients(sidecar, [0, 1])
    for r in alone + both:
        assert r["worst_rel_error"] <= 1e-3, r
        assert r["last_rel_error"] <= 1e-3, r
    rate = lambda rs: sum(r["requests"] / r["seconds"] for r in rs)  # noqa: E731
    ratio = rate(both) / rate(alone)
    record_figures("two_devices", {"alone_requests_per_s": rate(alone),
                                   "both_requests_per_s": rate(both), "ratio": ratio,
                                   "rows": R, "hidden": H, "probes": P, "in_flight": IN_FLIGHT,
                                   "clients": both + alone})
    with sidecar.client() as c:
        per_device = {d.device_id: d.gpu_requests for d in c.server_info().devices}
    assert per_device[0] > 0 and per_device[1] > 0  # each device ran its own client's work
    assert ratio >= 1.8, (ratio, alone, both)


def test_wrong_device_handles_and_mixed_requests_are_refused(sidecar):
    x0 = torch.zeros(64, H, device="cuda:0", dtype=torch.bfloat16)
    out1 = torch.zeros(1, P, device="cuda:1", dtype=torch.float32)
    with TorchClient(sidecar.uds_target) as tc:
        shared = x0.untyped_storage()._share_cuda_()
        wrong = buffers_pb2.RegisterBufferRequest(
            name="wrong", device_id=1, handle=bytes(shared[1]), offset_bytes=shared[3],
            byte_size=shared[2], client_pid=os.getpid(), session_id=tc.session_id)
        before = list(tc.client.stub.ListBuffers(buffers_pb2.ListBuffersRequest()).buffers)
        with pytest.raises(grpc.RpcError) as refused:
            tc.client.stub.RegisterBuffer(wrong)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "allocation is on CUDA device 0, not device 1" in refused.value.details()
        wrong.ClearField("device_id")  # no device, on a server of two: ambiguous
        with pytest.raises(grpc.RpcError) as refused:
            tc.client.stub.RegisterBuffer(wrong)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "say which device" in refused.value.details()
        assert list(tc.client.stub.ListBuffers(buffers_pb2.ListBuffersRequest()).buffers) == before
        # Activations on GPU 0, output on GPU 1: one request never spans two devices.
        request = score_pb2.ScoreRequest(probe_set="p", session_id=tc.session_id, rows=[0])
        request.activations.CopyFrom(tc.tensor_ref(x0))
        request.output.CopyFrom(tc.tensor_ref(out1))
        with pytest.raises(grpc.RpcError) as mixed:
            tc.client.stub.Score(request)
        assert mixed.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "a request runs on one device" in mixed.value.details()
        assert tc.score(x0, [0], "p").scores.shape == (1, P)  # and the server goes on
