"""Every bad input gets a precise status, changes nothing, and the server keeps serving."""

from __future__ import annotations

import struct

import grpc
import numpy as np
import pytest

from probe_files import ProbeFile, safetensors_bytes
from probe_sidecar import ProbeSidecarError
from probesidecar.v1 import buffers_pb2, probes_pb2, score_pb2, tensor_pb2, verify_pb2

H = 128


@pytest.fixture(scope="module")
def probe(sidecar):
    probe = ProbeFile(2, H, seed=3)
    with sidecar.client() as c:
        c.load_probe_set("p2", data=probe.data)
    return probe


def probe_sets(client) -> list[bytes]:
    """The loaded probe sets as ListProbeSets shows them, but for what their probes found (the
    requests a test scores move those counts)."""
    sets = []
    for info in client.list_probe_sets():
        info.proto.ClearField("outcomes")
        info.proto.ClearField("outcomes_by_labels")
        sets.append(info.proto.SerializeToString())
    return sets


@pytest.fixture
def still_serving(sidecar, probe):
    """After the test: the probe sets are as before and a good request still scores right."""
    with sidecar.client() as c:
        before = probe_sets(c)
    yield
    with sidecar.client() as c:
        assert probe_sets(c) == before
        x = np.random.default_rng(0).standard_normal((3, H)).astype(np.float32)
        np.testing.assert_allclose(c.score(x, [2, 0], "p2").scores, probe.reference(x, [2, 0]),
                                   rtol=1e-5, atol=1e-6)
    assert sidecar.process.poll() is None


def good_request(**changes) -> score_pb2.ScoreRequest:
    x = np.random.default_rng(1).standard_normal((4, H)).astype(np.float32)
    request = score_pb2.ScoreRequest(probe_set="p2", rows=[0, 3])
    request.activations.dtype = tensor_pb2.DTYPE_FLOAT32
    request.activations.shape[:] = [4, H]
    request.activations.data = x.tobytes()
    for key, value in changes.items():
        setattr(request, key, value)
    return request


def expect(client, method, request, code: grpc.StatusCode, fragment: str):
    with pytest.raises(ProbeSidecarError) as error:
        client.call(getattr(client.stub, method), request)
    assert error.value.code == code, error.value
    assert fragment in error.value.message, error.value.message
    return error.value


def activations(request, **fields):
    for key, value in fields.items():
        if key == "shape":
            request.activations.shape[:] = value
        else:
            setattr(request.activations, key, value)
    return request


INVALID = grpc.StatusCode.INVALID_ARGUMENT
BAD_SCORES = [
    ("int32 dtype", lambda r: activations(r, dtype=tensor_pb2.DTYPE_INT32), INVALID, "DTYPE_INT32 is not supported"),
    ("no dtype", lambda r: activations(r, dtype=tensor_pb2.DTYPE_UNSPECIFIED), INVALID, "not supported"),
    ("rank 1", lambda r: activations(r, shape=[4 * H]), INVALID, "expected a 2-D shape"),
    ("rank 3", lambda r: activations(r, shape=[1, 4, H]), INVALID, "expected a 2-D shape"),
    ("zero rows", lambda r: activations(r, shape=[0, H]), INVALID, "must be positive"),
    ("negative dim", lambda r: activations(r, shape=[-4, H]), INVALID, "must be positive"),
    ("wrong H", lambda r: activations(r, shape=[8, H // 2]), INVALID, "hidden size 64 does not match"),
    ("short data", lambda r: activations(r, data=r.activations.data[:-4]), INVALID, "inline data holds"),
    ("long data", lambda r: activations(r, data=r.activations.data + b"\0" * 4), INVALID, "inline data holds"),
    ("odd bytes", lambda r: activations(r, data=r.activations.data[:-1]), INVALID, "inline data holds"),
    ("stride < H", lambda r: activations(r, row_stride=H - 1), INVALID, "smaller than the row length"),
    ("stride needs more data", lambda r: activations(r, row_stride=2 * H), INVALID, "needs between"),
    ("overflowing shape", lambda r: activations(r, shape=[2**62, H]), INVALID, "does not describe a valid extent"),
    ("overflowing stride", lambda r: activations(r, row_stride=2**62), INVALID, "does not describe a valid extent"),
    ("no data", lambda r: r.activations.ClearField("data") or r, INVALID, "neither inline data nor a buffer"),
    ("no activations", lambda r: r.ClearField("activations") or r, INVALID, "activations: missing"),
    ("row = T", lambda r: r.rows.append(4) or r, INVALID, "rows[2] = 4 is outside"),
    ("negative row", lambda r: r.rows.append(-1) or r, INVALID, "rows[2] = -1 is outside"),
    ("no rows", lambda r: r.ClearField("rows") or r, INVALID, "rows: empty"),
    ("no probe set", lambda r: setattr(r, "probe_set", "") or r, INVALID, "probe_set: empty"),
    ("unknown probe set", lambda r: setattr(r, "probe_set", "nope") or r, grpc.StatusCode.NOT_FOUND,
     'probe set "nope" is not loaded'),
    ("buffer on cpu", lambda r: r.activations.buffer.CopyFrom(tensor_pb2.BufferLocation(buffer_id=1)) or r,
     grpc.StatusCode.FAILED_PRECONDITION, "need the CUDA backend"),
    ("inline output", lambda r: r.output.CopyFrom(tensor_pb2.TensorRef(dtype=tensor_pb2.DTYPE_FLOAT32, shape=[2, 2], data=b"0" * 16)) or r,
     INVALID, "output: must name a registered buffer"),
    ("output buffer on cpu", lambda r: r.output.CopyFrom(tensor_pb2.TensorRef(
        dtype=tensor_pb2.DTYPE_FLOAT32, shape=[2, 2], buffer=tensor_pb2.BufferLocation(buffer_id=1))) or r,
     grpc.StatusCode.FAILED_PRECONDITION, "need the CUDA backend"),
]


@pytest.mark.parametrize("name,mutate,code,fragment", BAD_SCORES, ids=[b[0] for b in BAD_SCORES])
def test_bad_score_requests(client, still_serving, name, mutate, code, fragment):
    expect(client, "Score", mutate(good_request()), code, fragment)


def test_bad_stream_message_does_not_end_the_stream(client, still_serving, probe):
    requests = [mutate(good_request(request_id=i)) for i, (_, mutate, _, _) in enumerate(BAD_SCORES)]
    requests.append(good_request(request_id=999))
    responses = list(client.stub.ScoreStream(iter(requests), timeout=30))
    assert len(responses) == len(BAD_SCORES) + 1
    for (name, _, code, fragment), response in zip(BAD_SCORES, responses):
        assert response.error.code == code.value[0], name
        assert fragment in response.error.message, name
    assert responses[-1].request_id == 999 and not responses[-1].HasField("error")


@pytest.mark.parametrize(
    "method,request_message,code,fragment",
    [
        ("RegisterBuffer", buffers_pb2.RegisterBufferRequest(handle=b"\0" * 64, byte_size=16),
         grpc.StatusCode.FAILED_PRECONDITION, "need the CUDA backend"),
        ("RegisterBuffer", buffers_pb2.RegisterBufferRequest(handle=b"\1" * 7),
         grpc.StatusCode.FAILED_PRECONDITION, "need the CUDA backend"),
        ("UnregisterBuffer", buffers_pb2.UnregisterBufferRequest(buffer_id=5),
         grpc.StatusCode.FAILED_PRECONDITION, "need the CUDA backend"),
        ("Verify", verify_pb2.VerifyRequest(), grpc.StatusCode.FAILED_PRECONDITION,
         "needs the CUDA backend"),
        ("RegisterEvent", buffers_pb2.RegisterEventRequest(handle=b"\0" * 64, session_id=1),
         grpc.StatusCode.FAILED_PRECONDITION, "need the CUDA backend"),
        ("UnloadProbeSet", probes_pb2.UnloadProbeSetRequest(name="nope"), grpc.StatusCode.NOT_FOUND, "nope"),
    ],
)
def test_declared_but_unavailable_rpcs(client, still_serving, method, request_message, code, fragment):
    expect(client, method, request_message, code, fragment)


def test_list_buffers_is_empty_on_cpu(client):
    assert list(client.stub.ListBuffers(buffers_pb2.ListBuffersRequest(), timeout=10).buffers) == []


def test_a_session_on_cpu_carries_labels_but_holds_no_buffers(client):
    # Sessions exist on every backend (their labels label the probe-outcome series); buffers
    # need the CUDA backend.
    call = client.stub.OpenSession(buffers_pb2.OpenSessionRequest(client_pid=1), timeout=10)
    session = next(call).session_id
    assert session > 0
    with pytest.raises(grpc.RpcError) as error:
        client.stub.RegisterBuffer(buffers_pb2.RegisterBufferRequest(
            handle=b"\0" * 64, byte_size=16, session_id=session), timeout=10)
    assert error.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    call.cancel()


# --- probe sets -------------------------------------------------------------------------------

def _valid() -> bytes:
    return ProbeFile(2, 16, seed=1).data


def _with_header(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


HOSTILE_FILES = [
    ("empty", b"", "shorter than"),
    ("truncated length", b"\x10\0\0", "shorter than"),
    ("header past end", struct.pack("<Q", 10**6) + b"{}", "header"),
    ("huge header length", struct.pack("<Q", 2**63) + b"{}", "header"),
    ("not json", _with_header(b"{not json"), "JSON"),
    ("json array", _with_header(b"[1, 2]"), "object"),
    ("truncated data", _valid()[:-3], ""),
    ("trailing bytes", _valid() + b"\0\0\0\0", ""),
    ("duplicate key", _with_header(b'{"bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                   b'"bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}', b"\0" * 4), "duplicate"),
    ("unknown dtype", _with_header(b'{"weight":{"dtype":"F33","shape":[1,1],"data_offsets":[0,4]}}', b"\0" * 4), "F33"),
    ("size mismatch", _with_header(b'{"weight":{"dtype":"F32","shape":[2,2],"data_offsets":[0,4]}}', b"\0" * 4), ""),
    ("overflowing shape", _with_header(
        b'{"weight":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,4]}}', b"\0" * 4), ""),
    ("negative offset", _with_header(b'{"weight":{"dtype":"F32","shape":[1],"data_offsets":[-4,0]}}', b"\0" * 4), ""),
    ("deep json", _with_header(b'{"__metadata__":' + b'{"a":' * 64 + b'"x"' + b"}" * 65), ""),
    ("missing bias", safetensors_bytes({"weight": (np.ones((2, 16), np.float32), "fp32")}), "bias"),
    ("wrong bias length", safetensors_bytes({"weight": (np.ones((2, 16), np.float32), "fp32"),
                                             "bias": (np.ones(3, np.float32), "fp32")}), "bias"),
    ("int weights", _with_header(b'{"bias":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},'
                                 b'"weight":{"dtype":"I32","shape":[1,1],"data_offsets":[4,8]}}', b"\0" * 8), "I32"),
    ("nan weight", safetensors_bytes({"weight": (np.full((1, 4), np.nan, np.float32), "fp32"),
                                      "bias": (np.zeros(1, np.float32), "fp32")}), "finite"),
    ("bad activation", safetensors_bytes({"weight": (np.ones((1, 4), np.float32), "fp32"),
                                          "bias": (np.zeros(1, np.float32), "fp32")}, {"activation": "relu"}), "relu"),
    ("names length", safetensors_bytes({"weight": (np.ones((2, 4), np.float32), "fp32"),
                                        "bias": (np.zeros(2, np.float32), "fp32")}, {"probe_names": '["a"]'}), "probe_names"),
    ("thresholds not json", safetensors_bytes({"weight": (np.ones((1, 4), np.float32), "fp32"),
                                               "bias": (np.zeros(1, np.float32), "fp32")}, {"thresholds": "[0.5"}), "thresholds"),
]


@pytest.mark.parametrize("name,data,fragment", HOSTILE_FILES, ids=[f[0] for f in HOSTILE_FILES])
def test_hostile_probe_files_are_refused(client, still_serving, name, data, fragment):
    request = probes_pb2.LoadProbeSetRequest(name="hostile", safetensors=data)
    error = expect(client, "LoadProbeSet", request, INVALID, fragment)
    assert error.message


def test_truncation_at_every_byte_is_refused(client, still_serving):
    data = _valid()
    for cut in range(0, len(data), 7):
        request = probes_pb2.LoadProbeSetRequest(name="cut", safetensors=data[:cut])
        expect(client, "LoadProbeSet", request, INVALID, "")


@pytest.mark.parametrize(
    "name,request_message,code,fragment",
    [
        ("bad name", probes_pb2.LoadProbeSetRequest(name="a/b", safetensors=b""), INVALID, "name"),
        ("empty name", probes_pb2.LoadProbeSetRequest(name="", safetensors=b""), INVALID, "name"),
        ("long name", probes_pb2.LoadProbeSetRequest(name="x" * 129, safetensors=b""), INVALID, "name"),
        ("no source", probes_pb2.LoadProbeSetRequest(name="x"), INVALID, "needs a source"),
        ("duplicate", probes_pb2.LoadProbeSetRequest(name="p2", safetensors=ProbeFile(1, 8).data),
         grpc.StatusCode.ALREADY_EXISTS, "p2"),
        ("missing path", probes_pb2.LoadProbeSetRequest(name="x", path="nope.safetensors"),
         grpc.StatusCode.NOT_FOUND, "nope.safetensors"),
        ("escaping path", probes_pb2.LoadProbeSetRequest(name="x", path="../../../../etc/passwd"),
         grpc.StatusCode.PERMISSION_DENIED, ""),
        ("absolute path outside", probes_pb2.LoadProbeSetRequest(name="x", path="/etc/passwd"),
         grpc.StatusCode.PERMISSION_DENIED, ""),
    ],
)
def test_bad_loads(client, still_serving, name, request_message, code, fragment):
    expect(client, "LoadProbeSet", request_message, code, fragment)
