"""--devices=all on a GPU host: the server serves every device the process sees, exactly as the
one-device server did on one GPU (scores against float64, ServerInfo, device-labelled metrics);
registrations that name no device go to the only device, and one that names a device the server
does not serve is refused and changes nothing; a listed device that is missing stops the start
(under --backend=auto too: no server of fewer devices, no CPU one in its place).

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing (and
failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1). Two GPUs: test_gpu_two_devices.py.
"""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import BIN, sidecar_fixture  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file, float64_scores, rel_error  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probesidecar.v1 import buffers_pb2  # noqa: E402
from server_state import samples  # noqa: E402

H = 4096


sidecar = sidecar_fixture("--backend=cuda", "--devices=all", "--warmup-rows=1,64")


@pytest.fixture(scope="module")
def probe(sidecar):
    torch.manual_seed(0)
    weight, bias = bf16_probes(16, H, device="cpu")
    with sidecar.client() as c:
        c.load_probe_set("p16", data=bf16_tensor_file(weight, bias))
    return weight, bias


def test_every_device_is_served_and_reported(sidecar, probe):
    with sidecar.client() as c:
        info = c.server_info()
    count = torch.cuda.device_count()
    assert [d.device_id for d in info.devices] == list(range(count))
    assert info.device_id == 0
    for d in info.devices:
        assert d.healthy and not d.failure
        assert d.name == torch.cuda.get_device_name(d.device_id)
        assert d.memory_bytes > 0  # its stream slots and the probe sets' weights
    if count == 1:
        assert info.device_name == torch.cuda.get_device_name(0)  # as the one-device server


def test_scores_match_float64_on_device_0(sidecar, probe):
    weight, bias = probe
    x = torch.randn(2048, H, device="cuda:0", dtype=torch.bfloat16)
    rows = list(range(0, 2048, 5))
    with TorchClient(sidecar.uds_target) as tc:
        result = tc.score(x, rows, "p16")
    ref = float64_scores(x[rows].cpu(), None, weight, bias)  # 446 rows: cheap on the CPU
    assert rel_error(result.scores, ref) <= 1e-3


def raw_registration(tc: TorchClient, tensor: torch.Tensor, **fields):
    shared = tensor.untyped_storage()._share_cuda_()
    return buffers_pb2.RegisterBufferRequest(
        name="raw", handle=bytes(shared[1]), offset_bytes=shared[3], byte_size=shared[2],
        client_pid=os.getpid(), session_id=tc.session_id, **fields)


def test_a_registration_without_a_device_goes_to_the_only_device(sidecar, probe):
    if torch.cuda.device_count() != 1:
        pytest.skip("several devices: a registration must name one (test_gpu_two_devices.py)")
    x = torch.zeros(64, H, device="cuda:0", dtype=torch.bfloat16)
    with TorchClient(sidecar.uds_target) as tc:
        request = raw_registration(tc, x)
        assert not request.HasField("device_id")  # as a client before the field was optional
        response = tc.client.stub.RegisterBuffer(request)
        assert response.buffer_id > 0
        listed = tc.client.stub.ListBuffers(buffers_pb2.ListBuffersRequest()).buffers
        assert [b.device_id for b in listed if b.buffer_id == response.buffer_id] == [0]


def test_a_device_that_is_not_served_is_refused_and_changes_nothing(sidecar, probe):
    x = torch.zeros(64, H, device="cuda:0", dtype=torch.bfloat16)
    served = torch.cuda.device_count()
    with TorchClient(sidecar.uds_target) as tc:
        before = list(tc.client.stub.ListBuffers(buffers_pb2.ListBuffersRequest()).buffers)
        with pytest.raises(grpc.RpcError) as refused:
            tc.client.stub.RegisterBuffer(raw_registration(tc, x, device_id=served + 3))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"the buffer is on device {served + 3}" in refused.value.details()
        after = list(tc.client.stub.ListBuffers(buffers_pb2.ListBuffersRequest()).buffers)
        assert after == before
        # The same tensor, named on its own device, registers and scores.
        assert tc.score(x, [0], "p16").scores.shape == (1, 16)


def test_gpu_families_carry_the_device_label(sidecar, probe):
    scraped = samples(sidecar)
    for d in range(torch.cuda.device_count()):
        label = (("device", str(d)),)
        assert scraped[("probesidecar_device_up", label)] == 1
        assert scraped[("probesidecar_device_memory_bytes", label)] > 0
        assert ("probesidecar_graph_cache_entries", label) in scraped
    assert ("probesidecar_device_memory_bytes", ()) not in scraped


@pytest.mark.parametrize("backend", ["auto", "cuda"])
def test_a_listed_device_that_is_missing_stops_the_start(backend, tmp_path):
    missing = torch.cuda.device_count()  # one past the devices this process sees
    run = subprocess.run([str(BIN), f"--backend={backend}", f"--devices=0,{missing}",
                          f"--listen=unix:{tmp_path / 's.sock'}", "--metrics-listen=none"],
                         capture_output=True, text=True, timeout=60)
    log = run.stdout + run.stderr
    assert run.returncode == 1, log
    assert f"cannot start: --backend {backend}: device {missing}: " in log, log
    assert "(device 0 usable): every device of --devices must be usable" in log, log
    assert "serving on" not in log, log
