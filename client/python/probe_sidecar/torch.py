"""Zero-copy scoring of PyTorch CUDA tensors: register a tensor's storage once (CUDA IPC), then
send only references.

In a decode loop, score without synchronising the host (GPU-side ordering through CUDA IPC
events; rows and scores may stay on the device):

    client = TorchClient("unix:///tmp/probe-sidecar.sock")
    handle = client.score_async(hidden, rows, "demo", out=scores)  # returns at once
    ...                                  # the decode step goes on, on the GPU and the host
    handle.wait_stream()                 # the current stream waits (on the GPU) for the scores
    use(scores)                          # read them, or overwrite hidden, after that point

The server reads the inputs only once the work already queued on the caller's stream has
completed (it waits for the request's ready event on its host), so `hidden` may be written by
kernels still in flight; the caller must not overwrite it, nor read `scores`, until the
handle's done event (wait_stream, GPU-side, or wait, host-side).

The v1 call, score(), waits for the current CUDA stream before sending and for the answer.

Registrations belong to a session that the client holds open: when this process exits (or
close() is called) the server releases them. A registered storage is kept alive by the client
until unregister() or close(), so its memory cannot be freed and reused under the server.
"""

from __future__ import annotations

import collections
import ctypes
import dataclasses
import os
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING, Union

import grpc
import numpy as np
import torch

from probesidecar.v1 import buffers_pb2, score_pb2, sidecar_pb2, tensor_pb2, verify_pb2

from ._cuda_ring import CudaRing
from ._tensors import rows_array
from ._torch_ring import CpuRing
from .client import Client, ClientOptions, HostTapOptions, TapOptions
from .dtypes import of_torch
from .errors import ProbeSidecarError, TapError, error_from_rpc
from .pipeline import Pending, ScoreStreamPipeline
from .results import ProbeSetInfo, ScoreResult, score_result
from .tap import Tap, TapWindow, check_tap_shape

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11; the package runs on 3.10

# Row indices: a torch tensor (CUDA int32: device-resident rows), or host indices.
Rows = Union[torch.Tensor, Sequence[int], np.ndarray]
# What a cached request template is keyed by, per tensor: (data_ptr, shape, strides, dtype).
_TensorKey = tuple[int, tuple[int, ...], tuple[int, ...], torch.dtype]


@dataclasses.dataclass(frozen=True)
class Registration:
    buffer_id: int
    storage_ptr: int  # data_ptr() of the registered storage
    nbytes: int
    shared_mapping: bool


@dataclasses.dataclass
class _EventPair:
    ready: torch.cuda.Event
    done: torch.cuda.Event
    ready_id: int
    done_id: int


class _EventPool:
    """CUDA IPC event pairs registered with the server, one pair per request in flight: a pair is
    reused only once the server has answered its last request (so the server has already issued
    its wait on `ready` and its record of `done`), and the least recently answered first, so that a
    handle waited on a little later still finds its own record of `done` (a reused pair's
    wait_stream would wait for the newer request: correct, but it would lose the overlap)."""

    def __init__(self, client: "TorchClient", device: torch.device, size: int):
        self._free: collections.deque[_EventPair] = collections.deque()
        self._available = threading.Condition()
        for _ in range(size):
            ready = torch.cuda.Event(blocking=False, interprocess=True)
            done = torch.cuda.Event(blocking=False, interprocess=True)
            ready.record(torch.cuda.current_stream(device))  # an event must exist before sharing
            done.record(torch.cuda.current_stream(device))
            self._free.append(_EventPair(ready, done, client._register_event(ready, device),
                                         client._register_event(done, device)))

    def acquire(self) -> _EventPair:
        with self._available:
            while not self._free:
                self._available.wait()
            return self._free.popleft()

    def release(self, pair: _EventPair) -> None:
        with self._available:
            self._free.append(pair)
            self._available.notify()


class ScoreHandle:
    """An asynchronous Score (TorchClient.score_async): the answer arrives on a reader thread."""

    def __init__(self, pending: Pending, pair: _EventPair, out: torch.Tensor | None):
        self._pending = pending
        self._pair = pair
        self._out = out

    def done(self) -> bool:
        """True once the server has answered (the GPU work may still be running)."""
        return self._pending.done()

    def response(self, timeout: float | None = None) -> score_pb2.ScoreResponse:
        """Waits (host) for the server's answer; raises ProbeSidecarError if the request failed."""
        return self._pending.response(timeout)

    def wait_stream(self, stream: torch.cuda.Stream | None = None) -> None:
        """Makes `stream` (default: the current one) wait on the GPU until the scores are written
        and the inputs read. Blocks the host only until the server has answered, which it does as
        soon as the work is queued on its stream."""
        self.response()
        (stream or torch.cuda.current_stream(self._pair.done.device)).wait_event(self._pair.done)

    def wait(self, timeout: float | None = None) -> None:
        """Waits on the host until the scores are written."""
        response = self.response(timeout)
        if response.enqueued:
            self._pair.done.synchronize()

    def result(self, timeout: float | None = None) -> torch.Tensor | ScoreResult:
        """The scores: the `out` tensor when one was given (after wait()), else a ScoreResult."""
        self.wait(timeout)
        return self._out if self._out is not None else score_result(self._pending.response())


@dataclasses.dataclass(frozen=True)
class VerifyResult:
    kernel_path: str  # "split_kv", "split_kv_sm90a", "baseline"
    # Shadow mode (compare_to): ours against the caller's output; None otherwise.
    shadow: verify_pb2.ShadowReport | None = None


class TorchClient:
    """A Client that sends CUDA tensors by reference."""

    def __init__(self, target: str | Client = "unix:///tmp/probe-sidecar.sock", *,
                 events_in_flight: int = 8, session_labels: dict[str, str] | None = None,
                 **kwargs: Unpack[ClientOptions]):
        """`events_in_flight`: asynchronous requests that may be outstanding at once (each holds
        a pair of CUDA IPC events; score_async waits for a pair beyond that). `session_labels`:
        the labels of this client's probe-outcome series (Client.open_session)."""
        self.client = target if isinstance(target, Client) else Client(target, **kwargs)
        self._registered: dict[tuple[int, int], tuple[Registration, torch.UntypedStorage]] = {}
        self._events_in_flight = events_in_flight
        self._event_pools: dict[int, _EventPool] = {}
        self._pipeline = ScoreStreamPipeline(self.client.stub)
        self._templates: dict[tuple[_TensorKey, _TensorKey | None, _TensorKey | None, str],
                              score_pb2.ScoreRequest] = {}
        self._lock = threading.Lock()  # templates, event pools, taps
        self._registry_lock = threading.Lock()  # _registered (held across the RegisterBuffer call)
        self._taps: list[Tap] = []
        # The session lease: the server releases our buffers when this call ends.
        self._session_call = self.client.stub.OpenSession(
            buffers_pb2.OpenSessionRequest(client_pid=os.getpid(), labels=session_labels or {})
        )
        try:
            self.session_id = next(self._session_call).session_id
        except grpc.RpcError as error:
            raise error_from_rpc(error) from error

    def close(self) -> None:
        for tap in list(self._taps):
            try:
                tap.close()
            except Exception:  # a server that is gone: the session's end releases the rest
                pass
        self._pipeline.close()
        with self._registry_lock:
            registered = list(self._registered.values())
        for registration, _ in registered:
            try:
                self.client.stub.UnregisterBuffer(
                    buffers_pb2.UnregisterBufferRequest(buffer_id=registration.buffer_id,
                                                        session_id=self.session_id), timeout=10
                )
            except grpc.RpcError:
                pass  # the session's end releases it anyway
        self._registered.clear()
        self._session_call.cancel()
        self.client.close()

    def __enter__(self) -> "TorchClient":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def register(self, tensor: torch.Tensor, name: str = "") -> Registration:
        """Registers the storage behind ``tensor`` (once per storage; cached)."""
        if not tensor.is_cuda:
            raise ValueError("register() needs a CUDA tensor")
        storage = tensor.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        with self._registry_lock:
            if key in self._registered:
                return self._registered[key][0]
            return self._register_storage(storage, key, name)

    def _register_storage(self, storage: torch.UntypedStorage, key: tuple[int, int],
                          name: str) -> Registration:
        # (device, handle, storage bytes, offset of the storage in its cudaMalloc block, ...)
        shared = storage._share_cuda_()
        device, handle, size_bytes, offset_bytes = shared[0], shared[1], shared[2], shared[3]
        request = buffers_pb2.RegisterBufferRequest(
            name=name or f"torch:{key[0]:#x}",
            device_id=device,
            handle=bytes(handle),
            offset_bytes=offset_bytes,
            byte_size=size_bytes,
            client_pid=os.getpid(),
            session_id=self.session_id,
        )
        response = self.client.call(self.client.stub.RegisterBuffer, request)
        registration = Registration(response.buffer_id, key[0], key[1], response.shared_mapping)
        self._registered[key] = (registration, storage)
        return registration

    def unregister(self, tensor: torch.Tensor) -> bool:
        """Releases the registration of ``tensor``'s storage; True when the server deferred it."""
        storage = tensor.untyped_storage()
        with self._registry_lock:
            entry = self._registered.pop((storage.data_ptr(), storage.nbytes()), None)
        if entry is None:
            raise KeyError("tensor's storage is not registered")
        with self._lock:
            self._templates.clear()  # they may name this buffer
        request = buffers_pb2.UnregisterBufferRequest(buffer_id=entry[0].buffer_id,
                                                      session_id=self.session_id)
        return self.client.call(self.client.stub.UnregisterBuffer, request).deferred

    def tensor_ref(self, tensor: torch.Tensor) -> tensor_pb2.TensorRef:
        """A TensorRef to a 2-D CUDA tensor (rows may be strided; columns contiguous)."""
        if tensor.dim() != 2:
            raise ValueError(f"expected a 2-D tensor, got shape {tuple(tensor.shape)}")
        entry = of_torch(tensor.dtype)
        if entry is None:
            raise TypeError(f"dtype {tensor.dtype} is not bfloat16, float16 or float32")
        if tensor.shape[1] > 1 and tensor.stride(1) != 1:
            raise ValueError("the tensor's rows must be contiguous (stride(1) == 1)")
        return self._buffer_ref(tensor, entry.proto, tensor.shape, tensor.stride(0))

    def _buffer_ref(self, tensor: torch.Tensor, dtype: int, shape: Sequence[int],
                    row_stride: int) -> tensor_pb2.TensorRef:
        """A TensorRef to `tensor` inside its (registered, once) storage."""
        registration = self.register(tensor)
        ref = tensor_pb2.TensorRef(dtype=dtype, shape=list(shape), row_stride=row_stride)
        ref.buffer.buffer_id = registration.buffer_id
        ref.buffer.offset_bytes = tensor.data_ptr() - registration.storage_ptr
        return ref

    def score(
        self,
        hidden_states: torch.Tensor,
        rows: Rows,
        probe_set: str,
        *,
        out: torch.Tensor | None = None,
        request_id: int = 0,
    ) -> ScoreResult:
        """Scores ``hidden_states[rows]`` with a loaded probe set, reading the tensor in place.

        With ``out`` (a float32 CUDA tensor [R, P]) the scores are written there and the result
        carries no scores (``fired`` is empty too); otherwise they come back inline.
        """
        if isinstance(rows, torch.Tensor):
            rows = rows.detach().cpu().numpy()
        request = score_pb2.ScoreRequest(probe_set=probe_set, request_id=request_id,
                                         session_id=self.session_id)
        request.activations.CopyFrom(self.tensor_ref(hidden_states))
        request.rows.extend(rows_array(rows).tolist())
        if out is not None:
            if out.dtype != torch.float32:
                raise TypeError("out must be float32")
            request.output.CopyFrom(self.tensor_ref(out))
        # v1 ordering: the server reads after this returns, so the writes must have landed.
        torch.cuda.current_stream(hidden_states.device).synchronize()
        return score_result(self.client.call(self.client.stub.Score, request))


    # The plain client's calls, for convenience.
    def load_probe_set(self, name: str, *, path: str | None = None, data: bytes | None = None,
                       replace: bool = False, precision: str | None = None,
                       count_outcomes: bool | None = None) -> ProbeSetInfo:
        return self.client.load_probe_set(name, path=path, data=data, replace=replace,
                                          precision=precision, count_outcomes=count_outcomes)

    def unload_probe_set(self, name: str) -> None:
        self.client.unload_probe_set(name)

    def server_info(self) -> sidecar_pb2.ServerInfoResponse:
        return self.client.server_info()

    def score_async(
        self,
        hidden_states: torch.Tensor,
        rows: Rows,
        probe_set: str,
        *,
        out: torch.Tensor | None = None,
        stream: torch.cuda.Stream | None = None,
        request_id: int = 0,
    ) -> ScoreHandle:
        """Scores ``hidden_states[rows]`` without synchronising the host; returns at once.

        ``rows``: a CUDA int32 tensor [R] (device-resident: the request carries only its id, and
        the indices are checked on the GPU: an invalid one gives NaN scores) or host indices.
        ``out``: a float32 CUDA tensor [R, P] for the scores; with it (and device rows or not) the
        server answers as soon as the work is queued on its GPU stream. ``stream``: the stream
        whose queued work writes the inputs (default: the current stream); the server's stream
        waits for it on the GPU. Requests are pipelined on one ScoreStream.
        """
        device = hidden_states.device
        stream = stream or torch.cuda.current_stream(device)
        request = score_pb2.ScoreRequest()
        request.CopyFrom(self._template(hidden_states, rows, probe_set, out))
        if not isinstance(rows, torch.Tensor) or not rows.is_cuda:
            if isinstance(rows, torch.Tensor):
                rows = rows.numpy()
            request.rows.extend(rows_array(rows).tolist())
        pool = self._event_pool(device)
        pair = pool.acquire()
        pair.ready.record(stream)
        request.ready_event = pair.ready_id
        request.done_event = pair.done_id
        request.session_id = self.session_id
        request.request_id = request_id
        pending = self._pipeline.submit(request, on_answer=lambda *_: pool.release(pair))
        return ScoreHandle(pending, pair, out)

    def tap(self, probe_set: str, *, max_batch: int, window: int = 16,
            dtype: torch.dtype = torch.bfloat16, hidden_size: int | None = None,
            device: torch.device | str | int | None = None,
            stream: torch.cuda.Stream | None = None, submit: str = "auto",
            **options: Unpack[TapOptions]) -> Tap:
        """A CUDA tap (probe_sidecar.tap.Tap) for a decode loop on this GPU (device="cpu": a CPU
        tap, cpu_tap()).

        It owns a ring of 2 x `window` slots of [max_batch, H] `dtype` rows and their float32
        scores, in one cudaMalloc'd allocation registered once (so it works whatever the process's
        allocator settings, expandable segments included). `write(hidden)` is one kernel on the
        current stream that copies the rows into the slot a device-resident counter names:
        capture it in your decode graph and every replay writes the next slot. `step()` after
        each step; every `window` steps one Score covers the window: the sidecar reads it once the
        window's writes have landed, and the half of the ring a window used is rewritten only
        once the call that read it has finished — checked on the host a window later, never by
        making the decode stream wait for the sidecar (a sidecar that dies or hangs cannot stop
        it: its windows fail after `reuse_timeout_s`, default 10 s).

        `stream`: the decode stream for the per-window event operations (default: the current
        stream at each step()). `submit`: "gpu" sends each window at once (the sidecar waits for
        its writes to land before it queues the scoring: the lowest latency); "host" sends it from
        a background thread once its writes have landed; "auto" (the default) is "host" when the
        sidecar is an MPS client (measured before the sidecar waited on its host: a sidecar stream
        waiting on the GPU for the loop's event slowed an MPS loop, docs/mps.md) and "gpu"
        otherwise.
        Other options (max_window_s, on_window, host_results, max_queued_windows, raise_errors):
        probe_sidecar.tap.Tap. Graph capture while windows are in flight: capture with
        capture_error_mode="thread_local", because the tap's threads call CUDA meanwhile.
        """
        if device is not None and torch.device(device).type == "cpu":
            tap = cpu_tap(self.client, probe_set, max_batch=max_batch, window=window,
                          dtype=dtype, hidden_size=hidden_size, session_id=self.session_id,
                          **options)
            with self._lock:
                self._taps.append(tap)
            return tap
        info = self.client.probe_set_info(probe_set)
        server = self.client.server_info()
        check_tap_shape(info, info.hidden_size if hidden_size is None else hidden_size,
                        max_batch, window, server.limits.max_rows)
        if submit == "auto":
            submit = "host" if server.mps else "gpu"
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        device = torch.device(device) if not isinstance(device, int) else torch.device("cuda", device)
        if device.type != "cuda":
            raise TapError(f"TorchClient.tap needs a CUDA device or the CPU, got {device}")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        ring = CudaRing(self, probe_set, info, max_batch=max_batch, window=window, dtype=dtype,
                        device=device, stream=stream, host_ready=submit == "host",
                        reuse_timeout_s=options.get("reuse_timeout_s", 10.0))
        pipeline = ScoreStreamPipeline(self.client.stub)

        def closed() -> None:
            pipeline.close()
            with self._lock:
                if tap in self._taps:
                    self._taps.remove(tap)

        try:
            tap = Tap(ring, pipeline, info, submit=submit, on_close=closed, **options)
        except BaseException:
            ring.release()
            raise
        with self._lock:
            self._taps.append(tap)
        return tap

    def verify(
        self,
        q: torch.Tensor,
        kv_cache: torch.Tensor,
        block_table: torch.Tensor,
        cache_seqlens: torch.Tensor,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        compare_to: torch.Tensor | None = None,
        *,
        softmax_scale: float | None = None,
        shadow_atol: float = 0.0,
        shadow_rtol: float = 0.0,
        stream: torch.cuda.Stream | None = None,
    ) -> VerifyResult:
        """MLA verify attention on the sidecar (FlashMLA's layout, bf16, page size 64).

        q [b, s_q, h_q, 576]; kv_cache [pages, 64, 576] (registered once: its storage is cached);
        block_table [b, max_pages] and cache_seqlens [b] int32, on the GPU (checked there) or on
        the CPU (sent inline); out [b, s_q, h_q, 512] bf16; lse [b, h_q, s_q] float32, optional.
        With compare_to (your own output [b, s_q, h_q, 512]) the sidecar runs in shadow mode: it
        computes into its own scratch, writes nothing of yours, and returns the error report.
        softmax_scale defaults to 576 ** -0.5. Ordering: the sidecar reads the inputs once the work
        queued on `stream` (default: the current one) has completed; the call returns once the
        outputs are written, with no host synchronisation here.
        """
        device = q.device
        stream = stream or torch.cuda.current_stream(device)
        request = verify_pb2.VerifyRequest(
            softmax_scale=softmax_scale if softmax_scale is not None else 576 ** -0.5,
            shadow_atol=shadow_atol, shadow_rtol=shadow_rtol)
        request.q.CopyFrom(self._ref_nd(q, torch.bfloat16))
        request.kv_cache.CopyFrom(self._ref_nd(kv_cache, torch.bfloat16))
        for field, tensor in (("block_table", block_table), ("cache_seqlens", cache_seqlens)):
            getattr(request, field).CopyFrom(self._ref_int32(tensor))
        if compare_to is not None:
            request.compare_to.CopyFrom(self._ref_nd(compare_to, torch.bfloat16))
        else:
            if out is None:
                raise ValueError("verify() needs out= (or compare_to= for shadow mode)")
            request.out.CopyFrom(self._ref_nd(out, torch.bfloat16))
            if lse is not None:
                request.lse.CopyFrom(self._ref_nd(lse, torch.float32))
        pool = self._event_pool(device)
        pair = pool.acquire()
        try:
            pair.ready.record(stream)
            request.ready_event = pair.ready_id
            request.done_event = pair.done_id
            request.session_id = self.session_id
            response = self.client.call(self.client.stub.Verify, request)
        finally:
            pool.release(pair)
        return VerifyResult(response.kernel_path,
                            response.shadow if response.HasField("shadow") else None)

    def _ref_nd(self, tensor: torch.Tensor, dtype: torch.dtype) -> tensor_pb2.TensorRef:
        """A TensorRef to a CUDA tensor whose dimensions after the first are dense."""
        if not tensor.is_cuda or tensor.dtype != dtype:
            raise TypeError(f"expected a CUDA {dtype} tensor, got {tensor.device} {tensor.dtype}")
        if not tensor[0].is_contiguous():
            raise ValueError("every dimension but the first must be contiguous")
        entry = of_torch(dtype)
        if entry is None:
            raise TypeError(f"dtype {dtype} is not bfloat16, float16 or float32")
        return self._buffer_ref(tensor, entry.proto, tensor.shape, tensor.stride(0))

    def _ref_int32(self, tensor: torch.Tensor) -> tensor_pb2.TensorRef:
        """An int32 TensorRef: by reference on the GPU, inline from the CPU."""
        if tensor.dtype != torch.int32:
            raise TypeError(f"expected int32, got {tensor.dtype}")
        if tensor.is_cuda:
            inner = tensor[0] if tensor.dim() > 1 else tensor
            if not inner.is_contiguous():
                raise ValueError("the last dimension must be contiguous")
            return self._buffer_ref(tensor, tensor_pb2.DTYPE_INT32, tensor.shape,
                                    tensor.stride(0) if tensor.dim() > 1 else 0)
        data = tensor.contiguous().numpy().astype("<i4").tobytes()
        return tensor_pb2.TensorRef(dtype=tensor_pb2.DTYPE_INT32, shape=list(tensor.shape),
                                    data=data)

    def _template(self, hidden_states: torch.Tensor, rows: Rows, probe_set: str,
                  out: torch.Tensor | None) -> score_pb2.ScoreRequest:
        """The request's references (cached: building TensorRefs is the costly part)."""
        device_rows = rows if isinstance(rows, torch.Tensor) and rows.is_cuda else None

        def describe(t: torch.Tensor) -> _TensorKey:
            return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype)

        key = (describe(hidden_states), describe(device_rows) if device_rows is not None else None,
               describe(out) if out is not None else None, probe_set)
        template = self._templates.get(key)
        if template is None:
            template = score_pb2.ScoreRequest(probe_set=probe_set, session_id=self.session_id)
            template.activations.CopyFrom(self.tensor_ref(hidden_states))
            if device_rows is not None:
                if (device_rows.dtype != torch.int32 or device_rows.dim() != 1
                        or not device_rows.is_contiguous()):
                    raise TypeError("device rows must be a contiguous 1-D torch.int32 tensor")
                template.device_rows.CopyFrom(
                    self._buffer_ref(device_rows, tensor_pb2.DTYPE_INT32, [device_rows.numel()],
                                     0))
            if out is not None:
                if out.dtype != torch.float32:
                    raise TypeError("out must be float32")
                template.output.CopyFrom(self.tensor_ref(out))
            with self._lock:
                if len(self._templates) >= 256:
                    self._templates.pop(next(iter(self._templates)))
                self._templates[key] = template
        return template

    def _event_pool(self, device: torch.device) -> _EventPool:
        pool = self._event_pools.get(device.index)
        if pool is None:
            with self._lock:
                pool = self._event_pools.get(device.index)
                if pool is None:
                    pool = _EventPool(self, device, self._events_in_flight)
                    self._event_pools[device.index] = pool
        return pool

    def _register_event(self, event: torch.cuda.Event, device: torch.device) -> int:
        request = buffers_pb2.RegisterEventRequest(
            handle=bytes(event.ipc_handle()), device_id=device.index or 0,
            session_id=self.session_id, name=f"torch-event:{id(event):#x}")
        return self.client.call(self.client.stub.RegisterEvent, request).event_id


def cpu_tap(client: Client, probe_set: str, *, max_batch: int, window: int = 16,
            dtype: torch.dtype = torch.float32, hidden_size: int | None = None,
            session_id: int = 0, **options: Unpack[HostTapOptions]) -> Tap:
    """A tap for a model on the CPU: its ring is host memory written by the tap operator
    (probe_sidecar.tap_op, so a compiled forward writes it too), each window sent inline as one
    Score (a CPU-backend sidecar works). `client`: a plain Client. Options: probe_sidecar.tap.Tap's
    (max_window_s, on_window, host_results, max_queued_windows, raise_errors)."""
    info = client.probe_set_info(probe_set)
    check_tap_shape(info, info.hidden_size if hidden_size is None else hidden_size, max_batch,
                    window, client.server_info().limits.max_rows)
    ring = CpuRing(probe_set, info, max_batch=max_batch, window=window, dtype=dtype,
                   session_id=session_id)
    pipeline = ScoreStreamPipeline(client.stub)
    return Tap(ring, pipeline, info, on_close=pipeline.close, **options)


def mps_enabled(device: int = 0) -> bool:
    """Whether CUDA contexts of this process on `device` go through an MPS control daemon (the
    driver's CU_DEVICE_ATTRIBUTE_MPS_ENABLED): compare with the sidecar's ServerInfo.mps — the
    inference server and the sidecar should both be MPS clients of one daemon."""
    torch.cuda.init()
    libcuda = ctypes.CDLL("libcuda.so.1")
    handle, value = ctypes.c_int(), ctypes.c_int()
    if libcuda.cuDeviceGet(ctypes.byref(handle), device) != 0:
        raise RuntimeError(f"cuDeviceGet({device}) failed")
    if libcuda.cuDeviceGetAttribute(ctypes.byref(value), 133, handle) != 0:  # MPS_ENABLED
        raise RuntimeError("cuDeviceGetAttribute(CU_DEVICE_ATTRIBUTE_MPS_ENABLED) failed")
    return bool(value.value)


__all__ = ["TorchClient", "cpu_tap", "Registration", "ScoreHandle", "VerifyResult", "ProbeSidecarError",
           "Tap", "TapError", "TapWindow", "mps_enabled"]
