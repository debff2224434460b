"""A small, typed client for Probe Sidecar over gRPC."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence

import grpc
import numpy as np

from probesidecar.v1 import buffers_pb2, probes_pb2, score_pb2, sidecar_pb2, sidecar_pb2_grpc

from ._tensors import rows_array, tensor_ref

DEFAULT_TARGET = "unix:///tmp/probe-sidecar.sock"


class ProbeSidecarError(Exception):
    """A failed call: ``code`` is the gRPC status code, ``message`` the server's explanation."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


# A probe set's precision (docs/architecture.md, "Probe set precision"): "exact" (the file's
# float32 weights, float32 math) or "fast" (weights rounded to the activations' 16-bit type on
# tensor cores). None asks LoadProbeSet for the default rule (exact up to 2 probes, fast above).
_PRECISIONS = {None: probes_pb2.PRECISION_UNSPECIFIED, "exact": probes_pb2.PRECISION_EXACT,
               "fast": probes_pb2.PRECISION_FAST}


def precision_name(value: int) -> str:
    """"exact" or "fast" for a Precision enum value; "" for PRECISION_UNSPECIFIED (a server that
    predates precision)."""
    for name, number in _PRECISIONS.items():
        if name is not None and number == value:
            return name
    return ""


def precision_value(precision: str | None) -> int:
    """The Precision enum value for None (the default rule), "exact" or "fast"."""
    try:
        return _PRECISIONS[precision]
    except (KeyError, TypeError):
        raise ValueError(f"precision must be None, 'exact' or 'fast', got {precision!r}") from None


class ProbeSetInfo:
    """A loaded probe set (probesidecar.v1.ProbeSetInfo, in ``proto``), with ``precision`` as
    "exact" or "fast"."""

    __slots__ = ("proto",)

    def __init__(self, proto: probes_pb2.ProbeSetInfo):
        self.proto = proto

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def num_probes(self) -> int:
        return self.proto.num_probes

    @property
    def hidden_size(self) -> int:
        return self.proto.hidden_size

    @property
    def weight_dtype(self) -> int:
        return self.proto.weight_dtype

    @property
    def activation(self) -> int:
        return self.proto.activation

    @property
    def probes(self) -> Sequence[probes_pb2.Probe]:
        """Name and threshold of each probe (``threshold`` unset: it never fires)."""
        return self.proto.probes

    @property
    def source(self) -> str:
        return self.proto.source

    @property
    def file_bytes(self) -> int:
        return self.proto.file_bytes

    @property
    def precision(self) -> str:
        return precision_name(self.proto.precision)

    @property
    def score_bucket_bounds(self) -> list[float]:
        """Upper bounds of the buckets of its score histograms (one more bucket above the last)."""
        return list(self.proto.score_bucket_bounds)

    @property
    def outcomes(self) -> probes_pb2.ProbeOutcomes:
        """What its probes found since it was loaded, every session together: rows_scored, and
        arrays over its probes (fired, non_finite, score_sum; bucket_counts [P, buckets]
        row-major); ``outcomes_by_labels`` in ``proto`` splits them by session labels."""
        return self.proto.outcomes

    def __repr__(self) -> str:
        return (f"ProbeSetInfo(name={self.proto.name!r}, num_probes={self.proto.num_probes}, "
                f"hidden_size={self.proto.hidden_size}, precision={self.precision!r})")


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    scores: np.ndarray  # float32 [R, P], after bias and activation
    fired: np.ndarray  # bool [R, P]: a finite score >= the probe's threshold
    kernel_path: str  # "cpu", "fused_cuda", ...
    request_id: int = 0
    non_finite: int = 0  # scores that are NaN or infinite (they never fire)
    precision: str = ""  # the probe set's: "exact" or "fast"


def _result(response: score_pb2.ScoreResponse) -> ScoreResult:
    rows, probes = response.num_rows, response.num_probes
    scores = np.frombuffer(response.scores, dtype="<f4")
    scores = scores.reshape(rows, probes) if scores.size else np.empty((0, probes), np.float32)
    fired = np.zeros(rows * probes, dtype=bool)
    fired[np.asarray(response.fired, dtype=np.int64)] = True
    return ScoreResult(scores, fired.reshape(rows, probes), response.kernel_path, response.request_id,
                       response.non_finite_scores, precision_name(response.precision))


def _raise(error: grpc.RpcError) -> ProbeSidecarError:
    return ProbeSidecarError(error.code(), error.details() or "")


def score_request(
    activations: np.ndarray,
    rows: Sequence[int] | np.ndarray,
    probe_set: str,
    *,
    dtype: str | None = None,
    request_id: int = 0,
    session_id: int = 0,
) -> score_pb2.ScoreRequest:
    """The ScoreRequest for inline numpy activations [T, H] (``session_id``: its outcomes count
    under that session's labels)."""
    request = score_pb2.ScoreRequest(probe_set=probe_set, request_id=request_id,
                                     session_id=session_id)
    request.activations.CopyFrom(tensor_ref(np.asarray(activations), dtype))
    request.rows.extend(rows_array(rows).tolist())
    return request


class Session:
    """A session (OpenSession), held open until ``close()``: requests naming its ``id`` count their
    probe outcomes under its ``labels`` (and may use its buffers and events). ``labels_folded`` is
    True when the server already had --max-session-label-sets other sets of values: its outcomes
    are then counted with every label "_other"."""

    def __init__(self, call, event: buffers_pb2.SessionEvent, labels: Mapping[str, str]):
        self._call = call
        self.id: int = event.session_id
        self.labels_folded: bool = event.labels_folded
        self.labels = dict(labels)

    def close(self) -> None:
        self._call.cancel()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_session(stub: sidecar_pb2_grpc.ProbeSidecarStub,
                 labels: Mapping[str, str] | None = None) -> Session:
    """Opens a session on ``stub``'s server (see Session); ProbeSidecarError if it is refused
    (INVALID_ARGUMENT: a label the server does not offer, or a malformed value)."""
    labels = dict(labels or {})
    call = stub.OpenSession(buffers_pb2.OpenSessionRequest(client_pid=os.getpid(), labels=labels))
    try:
        return Session(call, next(call), labels)
    except grpc.RpcError as error:
        raise _raise(error) from error


class Client:
    """Talks to one probe-sidecar.

    ``target`` is a gRPC target: ``unix:///tmp/probe-sidecar.sock`` or ``127.0.0.1:50551``.
    Every call raises ProbeSidecarError on failure.

    ``credentials`` (``grpc.ssl_channel_credentials(...)``) makes a TLS channel to a server run
    with ``--tls-cert`` (with a client certificate for ``--tls-client-ca``). ``admin_token`` is
    sent with LoadProbeSet and UnloadProbeSet to a server run with ``--admin-token-file``.
    """

    def __init__(
        self,
        target: str = DEFAULT_TARGET,
        *,
        timeout: float | None = 30.0,
        max_message_bytes: int = 64 << 20,
        channel: grpc.Channel | None = None,
        credentials: grpc.ChannelCredentials | None = None,
        admin_token: str | None = None,
        options: Sequence[tuple[str, object]] = (),
    ):
        self.target = target
        self.timeout = timeout
        self._admin_metadata = (("authorization", f"Bearer {admin_token}"),) if admin_token else None
        channel_options = [
            ("grpc.max_receive_message_length", max_message_bytes),
            ("grpc.max_send_message_length", max_message_bytes),
            *options,
        ]
        if channel is None and credentials is not None:
            channel = grpc.secure_channel(target, credentials, options=channel_options)
        self._channel = channel or grpc.insecure_channel(target, options=channel_options)
        self._stub = sidecar_pb2_grpc.ProbeSidecarStub(self._channel)

    @property
    def channel(self) -> grpc.Channel:
        return self._channel

    @property
    def stub(self) -> sidecar_pb2_grpc.ProbeSidecarStub:
        return self._stub

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method, request, metadata=None):
        try:
            return method(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as error:
            raise _raise(error) from error

    def health(self, service: str = "") -> str:
        """The grpc.health.v1 status name ("SERVING", "NOT_SERVING", ...).

        Needs the ``health`` extra (grpcio-health-checking).
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        response = self._call(stub.Check, health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def server_info(self) -> sidecar_pb2.ServerInfoResponse:
        return self._call(self._stub.ServerInfo, sidecar_pb2.ServerInfoRequest())

    def list_probe_sets(self) -> list[ProbeSetInfo]:
        response = self._call(self._stub.ListProbeSets, probes_pb2.ListProbeSetsRequest())
        return [ProbeSetInfo(info) for info in response.probe_sets]

    def load_probe_set(
        self,
        name: str,
        *,
        path: str | None = None,
        data: bytes | None = None,
        replace: bool = False,
        precision: str | None = None,
    ) -> ProbeSetInfo:
        """Loads a safetensors probe set from a server-side ``path`` or from its bytes.

        ``precision``: "exact", "fast", or None for the server's default rule (exact up to 2
        probes, fast above); the result's ``precision`` says which one the set got.
        """
        if (path is None) == (data is None):
            raise ValueError("give exactly one of path= (on the server) or data= (file bytes)")
        request = probes_pb2.LoadProbeSetRequest(name=name, replace=replace,
                                                 precision=precision_value(precision))
        if path is not None:
            request.path = path
        else:
            request.safetensors = data
        return ProbeSetInfo(self._call(self._stub.LoadProbeSet, request, self._admin_metadata).probe_set)

    def unload_probe_set(self, name: str) -> None:
        self._call(self._stub.UnloadProbeSet, probes_pb2.UnloadProbeSetRequest(name=name),
                   self._admin_metadata)

    def score(
        self,
        activations: np.ndarray,
        rows: Sequence[int] | np.ndarray,
        probe_set: str,
        *,
        dtype: str | None = None,
        request_id: int = 0,
        session: Session | None = None,
    ) -> ScoreResult:
        """Scores ``activations[rows]`` [R, H] with a loaded probe set; returns [R, P] scores.

        ``activations`` is a float32, float16 or bfloat16 (ml_dtypes) array [T, H]; raw bfloat16
        bits may be given as uint16 with ``dtype='bf16'``. ``session`` (open_session): the
        outcomes count under its labels.
        """
        request = score_request(activations, rows, probe_set, dtype=dtype, request_id=request_id,
                                session_id=session.id if session is not None else 0)
        return _result(self._call(self._stub.Score, request))

    def open_session(self, labels: Mapping[str, str] | None = None) -> Session:
        """A session whose requests (``score(..., session=...)``) count their probe outcomes
        under ``labels``, e.g. ``{"model": "llama-3-8b", "replica": "3"}``: names the server
        offers (``server_info().session_labels``), values of 1 to 64 characters of
        A-Z a-z 0-9 _ . : / @ + -. Never put request ids or anything unbounded in labels."""
        return open_session(self._stub, labels)

    def probe_set_info(self, name: str) -> ProbeSetInfo:
        """The loaded probe set `name`; ProbeSidecarError NOT_FOUND if there is none."""
        for info in self.list_probe_sets():
            if info.name == name:
                return info
        raise ProbeSidecarError(grpc.StatusCode.NOT_FOUND, f"no probe set named {name!r} is loaded")

    def tap(self, probe_set: str, *, max_batch: int, window: int = 16,
            dtype: str = "float32", hidden_size: int | None = None, **options):
        """A host tap (probe_sidecar.tap): rows from numpy arrays or CPU torch tensors, each
        window of `window` steps sent inline as one Score. For CUDA tensors use TorchClient.tap.

        `dtype`: "float32", "float16" or "bfloat16" (raw bits as uint16, or ml_dtypes). Options:
        see probe_sidecar.tap.Tap (max_window_s, on_window, host_results, max_queued_windows,
        raise_errors)."""
        from .pipeline import ScoreStreamPipeline
        from .tap import HostRing, Tap, check_tap_shape

        info = self.probe_set_info(probe_set)
        hidden_size = info.hidden_size if hidden_size is None else hidden_size
        check_tap_shape(info, hidden_size, max_batch, window, self.server_info().limits.max_rows)
        ring = HostRing(probe_set, 0, hidden_size, max_batch, window, dtype)
        pipeline = ScoreStreamPipeline(self.stub)
        return Tap(ring, pipeline, info, on_close=pipeline.close, **options)

    def score_stream(
        self, requests: Iterable[score_pb2.ScoreRequest], *, timeout: float | None = None
    ) -> Iterator[ScoreResult | ProbeSidecarError]:
        """Scores a stream of requests (see score_request) on one ScoreStream call, in order.

        A message the server refuses yields a ProbeSidecarError in its place and the stream goes
        on; a failure of the stream itself raises ProbeSidecarError. `timeout` bounds the whole
        stream (default: none; the client's per-call timeout is for unary calls).
        """
        try:
            for response in self._stub.ScoreStream(iter(requests), timeout=timeout):
                if response.HasField("error"):
                    yield ProbeSidecarError(_status_code(response.error.code), response.error.message)
                else:
                    yield _result(response)
        except grpc.RpcError as error:
            raise _raise(error) from error


def _status_code(value: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == value:
            return code
    return grpc.StatusCode.UNKNOWN
