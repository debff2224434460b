"""A small, typed client for Probe Sidecar over gRPC."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol, TypedDict, TypeVar

import grpc
import numpy as np

from probesidecar.v1 import buffers_pb2, probes_pb2, score_pb2, sidecar_pb2, sidecar_pb2_grpc

from ._tensors import rows_array, tensor_ref
# ProbeSidecarError, ProbeSetInfo and ScoreResult are importable from this module too.
from .errors import ProbeSidecarError, error_from_rpc, status_code
from .pipeline import ScoreStreamPipeline
from .precision import precision_value
from .results import ProbeSetInfo, ScoreResult, score_result
from .tap import HostRing, Tap, TapWindow, check_tap_shape

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11; the package runs on 3.10

DEFAULT_TARGET = "unix:///tmp/probe-sidecar.sock"

# gRPC call metadata: (key, value) pairs.
Metadata = Sequence[tuple[str, str]]

_Request_contra = TypeVar("_Request_contra", contravariant=True)
_Response_co = TypeVar("_Response_co", covariant=True)
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


class UnaryMethod(Protocol[_Request_contra, _Response_co]):
    """A unary RPC of a gRPC stub (``client.stub.Score``, a health stub's ``Check``, ...): what
    Client.call calls."""

    def __call__(self, request: _Request_contra, *, timeout: float | None,
                 metadata: Metadata | None) -> _Response_co: ...


class ClientOptions(TypedDict, total=False):
    """The keyword arguments of Client() after its target (for wrappers that make a Client)."""

    timeout: float | None
    max_message_bytes: int
    channel: grpc.Channel | None
    credentials: grpc.ChannelCredentials | None
    admin_token: str | None
    options: Sequence[tuple[str, object]]


class TapOptions(TypedDict, total=False):
    """The options of probe_sidecar.tap.Tap that the makers of taps pass through (Client.tap,
    TorchClient.tap, cpu_tap); TorchClient.tap takes ``submit`` as a parameter of its own."""

    max_window_s: float | None
    on_window: Callable[[TapWindow], None] | None
    host_results: bool
    max_queued_windows: int
    raise_errors: bool
    reuse_timeout_s: float
    when_behind: str


class HostTapOptions(TapOptions, total=False):
    """TapOptions, with Tap's ``submit`` ("gpu" or "host")."""

    submit: str


class _Cancellable(Protocol):
    """A streaming call that the client ends by cancelling it (a gRPC call object)."""

    def cancel(self) -> object: ...


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

    def __init__(self, call: _Cancellable, event: buffers_pb2.SessionEvent,
                 labels: Mapping[str, str]):
        self._call = call
        self.id: int = event.session_id
        self.labels_folded: bool = event.labels_folded
        self.labels = dict(labels)

    def close(self) -> None:
        self._call.cancel()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: object) -> None:
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
        raise error_from_rpc(error) from error


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

    def __exit__(self, *exc: object) -> None:
        self.close()

    def call(self, method: UnaryMethod[_Request, _Response], request: _Request,
             metadata: Metadata | None = None) -> _Response:
        """Calls the unary RPC `method` of a stub on this client's channel (``client.stub`` or
        another stub made on ``client.channel``) with `request`, under the client's per-call
        ``timeout`` and with `metadata`; returns the response, or raises ProbeSidecarError when
        the call fails. The one path of every unary call: Client's own methods and the wrappers
        of the package (TorchClient, the taps' rings) all call through it, e.g.
        ``client.call(client.stub.RegisterBuffer, request).buffer_id``."""
        try:
            return method(request, timeout=self.timeout, metadata=metadata)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from error

    def health(self, service: str = "") -> str:
        """The grpc.health.v1 status name ("SERVING", "NOT_SERVING", ...).

        Needs the ``health`` extra (grpcio-health-checking).
        """
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(self._channel)
        response = self.call(stub.Check, health_pb2.HealthCheckRequest(service=service))
        return health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)

    def server_info(self) -> sidecar_pb2.ServerInfoResponse:
        return self.call(self._stub.ServerInfo, sidecar_pb2.ServerInfoRequest())

    def list_probe_sets(self) -> list[ProbeSetInfo]:
        response = self.call(self._stub.ListProbeSets, probes_pb2.ListProbeSetsRequest())
        return [ProbeSetInfo(info) for info in response.probe_sets]

    def load_probe_set(
        self,
        name: str,
        *,
        path: str | None = None,
        data: bytes | None = None,
        replace: bool = False,
        precision: str | None = None,
        count_outcomes: bool | None = None,
    ) -> ProbeSetInfo:
        """Loads a safetensors probe set from a server-side ``path`` or from its bytes.

        ``precision``: "exact", "fast", or None for the server's default rule (exact up to 2
        probes, fast above); the result's ``precision`` says which one the set got.
        ``count_outcomes``: whether the server counts what its probes find (``outcomes``, the
        outcome metrics); None for the server's ``--probe-outcomes``; the result's
        ``outcomes_counted`` says which.
        """
        if (path is None) == (data is None):
            raise ValueError("give exactly one of path= (on the server) or data= (file bytes)")
        counting = {None: probes_pb2.OUTCOME_COUNTING_UNSPECIFIED,
                    True: probes_pb2.OUTCOME_COUNTING_ON, False: probes_pb2.OUTCOME_COUNTING_OFF}
        if count_outcomes not in counting:
            raise ValueError(f"count_outcomes must be None, True or False, got {count_outcomes!r}")
        request = probes_pb2.LoadProbeSetRequest(name=name, replace=replace,
                                                 precision=precision_value(precision),
                                                 outcome_counting=counting[count_outcomes])
        if path is not None:
            request.path = path
        else:
            request.safetensors = data
        return ProbeSetInfo(self.call(self._stub.LoadProbeSet, request, self._admin_metadata).probe_set)

    def unload_probe_set(self, name: str) -> None:
        self.call(self._stub.UnloadProbeSet, probes_pb2.UnloadProbeSetRequest(name=name),
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
        return score_result(self.call(self._stub.Score, request))

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
            dtype: str = "float32", hidden_size: int | None = None,
            **options: Unpack[HostTapOptions]) -> Tap:
        """A host tap (probe_sidecar.tap): rows from numpy arrays or CPU torch tensors, each
        window of `window` steps sent inline as one Score. For CUDA tensors use TorchClient.tap.

        `dtype`: "float32", "float16" or "bfloat16" (raw bits as uint16, or ml_dtypes). Options:
        see probe_sidecar.tap.Tap (max_window_s, on_window, host_results, max_queued_windows,
        raise_errors)."""
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
                    yield ProbeSidecarError(status_code(response.error.code), response.error.message)
                else:
                    yield score_result(response)
        except grpc.RpcError as error:
            raise error_from_rpc(error) from error
