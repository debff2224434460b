"""The CUDA tap's ring (TorchClient.tap): hidden rows, scores and the tap's counters in one
device allocation of its own, shared with the sidecar by CUDA IPC, written on the GPU by the tap's
operator (probe_sidecar.tap_op: capturable, and one node of a compiled graph), ordered against the
sidecar by CUDA IPC events.

The allocation comes from the driver (cuMemAlloc), not from PyTorch's caching allocator: a plain
allocation can always be shared by CUDA IPC, whatever PYTORCH_CUDA_ALLOC_CONF says (expandable
segments cannot be shared that way). Its layout is tap_op.RingLayout.
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time
from typing import Protocol

import numpy as np
import torch

from probesidecar.v1 import buffers_pb2, score_pb2, tensor_pb2

from . import tap_op
from ._torch_ring import TorchRing, _entry
from .client import Client
from .errors import TapError
from .results import ProbeSetInfo
from .tap import _Window


class _Owner(Protocol):
    """What a CUDA ring uses of the TorchClient that makes it (not imported: it imports this)."""

    client: Client
    session_id: int

    def _register_event(self, event: torch.cuda.Event, device: torch.device) -> int: ...

# Host copies of the scores in flight: the reader thread waits for a free one only when the
# delivery thread is this many windows behind (a window's timing events: twice as many).
_HOST_SLOTS = 4


def _poll(event: torch.cuda.Event, deadline: float) -> bool:
    """Whether `event` completes before time.monotonic() reaches `deadline`, polled from the host
    (sleeping between polls, not spinning)."""
    pause = 20e-6
    while not event.query():
        if time.monotonic() >= deadline:
            return False
        time.sleep(pause)
        pause = min(pause * 2, 1e-3)
    return True


class _Driver:
    """The few CUDA driver calls the ring needs (libcuda.so.1, which every CUDA process has).

    ctypes rather than cuda-python's driver bindings (cuda.bindings.driver): the package would
    need a new dependency for these ten calls, and cuda-bindings comes into an environment only
    on the side (torch's CUDA 13 wheels, nvidia-cutlass), its major version tied to the CUDA
    that the driver supports, while libcuda.so.1 and its _v2 entry points are wherever a CUDA tap
    can run, under any torch build and driver."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")
        self.check(self.lib.cuInit(0), "cuInit")

    def check(self, code: int, what: str) -> None:
        if code != 0:
            text = ctypes.c_char_p()
            self.lib.cuGetErrorString(code, ctypes.byref(text))
            raise TapError(f"{what} failed: CUDA error {code} "
                           f"({(text.value or b'?').decode()})")

    def context(self, ordinal: int) -> ctypes.c_void_p:
        """The device's primary context (the one PyTorch uses), retained."""
        device, context = ctypes.c_int(), ctypes.c_void_p()
        self.check(self.lib.cuDeviceGet(ctypes.byref(device), ordinal), "cuDeviceGet")
        self.check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(context), device),
                   "cuDevicePrimaryCtxRetain")
        return context

    def alloc(self, context: ctypes.c_void_p, nbytes: int) -> tuple[int, bytes]:
        """(device pointer, 64-byte IPC handle) of a new allocation."""
        self.check(self.lib.cuCtxPushCurrent_v2(context), "cuCtxPushCurrent")
        try:
            pointer = ctypes.c_uint64()
            self.check(self.lib.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(nbytes)),
                       f"cuMemAlloc({nbytes} bytes)")
            handle = (ctypes.c_char * 64)()
            code = self.lib.cuIpcGetMemHandle(handle, pointer)
            if code != 0:
                self.lib.cuMemFree_v2(pointer)
                self.check(code, "cuIpcGetMemHandle")
            return int(pointer.value), bytes(handle)
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def free(self, context: ctypes.c_void_p, ordinal: int, pointer: int) -> None:
        self.lib.cuCtxPushCurrent_v2(context)
        try:
            self.check(self.lib.cuMemFree_v2(ctypes.c_uint64(pointer)), "cuMemFree")
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))
            device = ctypes.c_int()
            if self.lib.cuDeviceGet(ctypes.byref(device), ordinal) == 0:
                self.lib.cuDevicePrimaryCtxRelease_v2(device)


class _DeviceBytes:
    """A device allocation seen by torch as a uint8 tensor (CUDA array interface, no copy)."""

    def __init__(self, pointer: int, nbytes: int) -> None:
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (pointer, False), "version": 3, "strides": None,
                                         "stream": None}


class CudaRing(TorchRing):
    def __init__(self, client: _Owner, probe_set: str, info: ProbeSetInfo, *,
                 max_batch: int, window: int, dtype: torch.dtype, device: torch.device,
                 stream: torch.cuda.Stream | None, host_ready: bool = False,
                 reuse_timeout_s: float = 10.0) -> None:
        self._setup_layout(info, max_batch=max_batch, window=window, dtype=dtype, device=device,
                           device_scores=True)
        self._client = client
        self._probe_set = probe_set
        self._stream = stream
        self._host_ready = host_ready  # submit="host": the host waits for each window's writes
        self._reuse_timeout_s = reuse_timeout_s
        self._driver = _Driver()
        self._ordinal = device.index
        self._context = self._driver.context(self._ordinal)
        total = self.layout.nbytes
        self.nbytes = total
        self._pointer, handle = self._driver.alloc(self._context, total)
        self._buffer_id = 0
        self._events: list[int] = []
        try:
            self._adopt(torch.as_tensor(_DeviceBytes(self._pointer, total), device=device))
            # A static address for torch.compile's CUDA graphs (mode="reduce-overhead"): without
            # it, a graph input that an operator mutates makes Inductor run the graph eagerly.
            torch._dynamo.mark_static_address(self.raw)
            torch.cuda.synchronize(device)
            response = client.client.call(client.client.stub.RegisterBuffer,
                                           buffers_pb2.RegisterBufferRequest(
                                               name=f"tap:{probe_set}", device_id=self._ordinal,
                                               handle=handle, byte_size=total,
                                               client_pid=os.getpid(),
                                               session_id=client.session_id))
            self._buffer_id = response.buffer_id
            self._make_events(client)
            self._warm_up()
        except BaseException:
            self.release()
            raise
        self._requests: dict[tuple[int, int], score_pb2.ScoreRequest] = {}
        self._delivery = torch.cuda.Stream(device)
        self._host = [(torch.empty((window * max_batch, info.num_probes), dtype=torch.float32,
                                   pin_memory=True),
                       torch.empty(window, dtype=torch.int32, pin_memory=True),
                       torch.empty(1, dtype=torch.int64, pin_memory=True))
                      for _ in range(_HOST_SLOTS)]
        self._host_free = [threading.Semaphore(1) for _ in range(_HOST_SLOTS)]
        self._copied = [torch.cuda.Event(blocking=True) for _ in range(_HOST_SLOTS)]
        try:
            self._warm_server()
        except BaseException:
            self.release()
            raise

    def _warm_server(self) -> None:
        """One Score of a full window now, waited for: the sidecar captures the graph a window
        replays before the loop's first window needs it (its scores are overwritten later)."""
        stream = torch.cuda.current_stream(self.device)
        self.counts.zero_()  # the warm-up writes' counts: the warm window counts no row
        self._ready[0].record(stream)
        self._client.client.call(self._client.client.stub.Score, self._request(0, self.window))
        self._done[0].synchronize()

    # --- set-up -------------------------------------------------------------------------------

    def _make_events(self, client: _Owner) -> None:
        stream = torch.cuda.current_stream(self.device)

        def ipc_event() -> torch.cuda.Event:
            event = torch.cuda.Event(blocking=False, interprocess=True)
            event.record(stream)  # an event must have been recorded before it is shared
            self._events.append(client._register_event(event, self.device))
            return event

        self._ready = [ipc_event(), ipc_event()]
        self._done = [ipc_event(), ipc_event()]
        # A blocking event (the host sleeps instead of spinning): the writes landed (submit=
        # "host").
        self._ready_host = [torch.cuda.Event(blocking=True) for _ in range(2)]
        # (window closed, scores in device memory, scores copied to host memory), per window index
        # mod 2 x _HOST_SLOTS: window w + 2 x _HOST_SLOTS closes only after window w's fetch()
        # (the close of a window waits for the answer to the one before, and the answer to w +
        # _HOST_SLOTS waits for w's host copy to be free).
        self._timing: list[tuple[torch.cuda.Event, ...]] = [
            tuple(torch.cuda.Event(enable_timing=True) for _ in range(3))
            for _ in range(2 * _HOST_SLOTS)]

    def _warm_up(self) -> None:
        """Compiles and loads the kernels now: not later inside a caller's graph capture."""
        self._warm_up_writes()
        torch.cuda.synchronize(self.device)
        # Closing a window is the same work every time for a half: one small graph each, so that
        # a close costs the decode thread a graph launch. Captured thread-locally: the tap's own
        # threads may call CUDA meanwhile.
        # Per half, a close that points the next writes at the other half, and one that diverts
        # them (the other half is still being read: that window is lost); and both again for the
        # close of a lost window, which keeps the half's last write count (its last scored window
        # may still be being read, its count with it: docs/tap-protocol.md).
        self._close_graphs: list[torch.cuda.CUDAGraph] = []
        side = torch.cuda.Stream(self.device)
        # Garbage that holds CUDA graphs or events (another tap's, say) must not be collected,
        # and destroyed, while this capture is on.
        gc.collect()
        for lost in (False, True):
            for divert in (False, True):
                for half in (0, 1):
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.stream(side), torch.cuda.graph(
                            graph, stream=side, capture_error_mode="thread_local"):
                        tap_op.close_window(self.raw, self.layout, half,
                                            (1 - half) * self.window, divert=divert,
                                            record=not lost)
                    self._close_graphs.append(graph)
        torch.cuda.synchronize(self.device)

    # --- the decode thread ------------------------------------------------------------------

    def close_window(self, window: _Window, divert_next: bool = False) -> None:
        stream = self._stream or torch.cuda.current_stream(self.device)
        half, steps = window.half, window.steps
        close = self._close_graphs[4 * window.lost + 2 * divert_next + half]
        if self._stream is None:
            close.replay()  # on the current stream
        else:
            with torch.cuda.stream(stream):
                close.replay()
        if window.lost:
            return  # its writes went to the spare slot: nothing to send
        self._ready[half].record(stream)
        self._timing[window.index % len(self._timing)][0].record(stream)  # for the latency
        if self._host_ready:
            self._ready_host[half].record(stream)
        window.request = self._request(half, steps)
        window.ring_state = self._done[half]  # what the half's next writes must follow

    def _request(self, half: int, steps: int) -> score_pb2.ScoreRequest:
        request = self._requests.get((half, steps))
        if request is None:
            # Where the protocol puts the window's parts (RingLayout.window_parts).
            parts = self.layout.window_parts(half, steps)
            assert parts.device_rows is not None and parts.scores is not None  # a CUDA ring's
            request = score_pb2.ScoreRequest(
                probe_set=self._probe_set, session_id=self._client.session_id,
                ready_event=self._events[half], done_event=self._events[2 + half])
            activations = request.activations
            activations.dtype = _entry(self.dtype).proto
            activations.shape.extend([parts.rows, self.hidden_size])
            activations.row_stride = self.hidden_size
            activations.buffer.buffer_id = self._buffer_id
            activations.buffer.offset_bytes = parts.activations
            request.device_rows.dtype = tensor_pb2.DTYPE_INT32
            request.device_rows.shape.append(parts.rows)
            request.device_rows.buffer.buffer_id = self._buffer_id
            request.device_rows.buffer.offset_bytes = parts.device_rows
            output = request.output
            output.dtype = tensor_pb2.DTYPE_FLOAT32
            output.shape.extend([parts.rows, self.num_probes])
            output.row_stride = self.num_probes
            output.buffer.buffer_id = self._buffer_id
            output.buffer.offset_bytes = parts.scores
            # Only the rows each step wrote count in the probe outcomes (not a batch's padding).
            counted = request.counted_rows
            counted.dtype = tensor_pb2.DTYPE_INT32
            counted.shape.append(steps)
            counted.buffer.buffer_id = self._buffer_id
            counted.buffer.offset_bytes = parts.counts
            self._requests[(half, steps)] = request
        return request

    def ready_wait(self, window: _Window) -> None:
        self._ready_host[window.half].synchronize()

    def finished(self, window: _Window, deadline: float) -> bool:
        # The event after the window's host copy (or, without one, the sidecar's done event).
        # Polled, never waited for on the GPU: a sidecar that never records it must not stop
        # the decode stream.
        return _poll(window.ring_state, deadline)

    # --- background threads -------------------------------------------------------------------

    def answered(self, window: _Window, response: score_pb2.ScoreResponse | None) -> None:
        if response is None:
            return  # a failed window (or device-only results): nothing to copy
        half, steps = window.half, window.steps
        rows = steps * self.max_batch
        # The window's scores, counts and write count where the protocol puts them.
        views = self.layout.window_views(self.raw, half, steps, self.dtype)
        assert views.scores is not None  # a CUDA ring's
        slot = window.index % _HOST_SLOTS
        self._host_free[slot].acquire()  # released by fetch() of window index - _HOST_SLOTS
        scores, counts, writes = self._host[slot]
        timing = self._timing[window.index % len(self._timing)]
        with torch.cuda.device(self.device), torch.cuda.stream(self._delivery):
            self._delivery.wait_event(self._done[half])
            timing[1].record(self._delivery)
            scores[:rows].copy_(views.scores.reshape(rows, self.num_probes), non_blocking=True)
            counts[:steps].copy_(views.counts, non_blocking=True)
            writes.copy_(views.writes, non_blocking=True)
            timing[2].record(self._delivery)
            self._copied[slot].record(self._delivery)
        window.ring_state = self._copied[slot]  # it follows the done event

    def fetch(self, window: _Window) -> tuple[np.ndarray, np.ndarray, int, tuple[float, float]]:
        steps = window.steps
        slot = window.index % _HOST_SLOTS
        try:
            if not _poll(self._copied[slot], time.monotonic() + self._reuse_timeout_s):
                raise TapError(f"window {window.index}: the sidecar did not write its scores "
                               f"within {self._reuse_timeout_s:g} s")
            host_scores, host_counts, host_writes = self._host[slot]
            rows = steps * self.max_batch
            scores = host_scores[:rows].numpy().reshape(steps, self.max_batch,
                                                        self.num_probes).copy()
            num_rows = host_counts[:steps].numpy().copy()
            writes = int(host_writes[0])
            closed, scored, copied = self._timing[window.index % len(self._timing)]
            latency = (max(closed.elapsed_time(scored) * 1e-3, 0.0),
                       max(closed.elapsed_time(copied) * 1e-3, 0.0))
        finally:
            self._host_free[slot].release()
        return scores, num_rows, writes, latency

    def device_scores(self, window: _Window) -> torch.Tensor:
        views = self.layout.window_views(self.raw, window.half, window.steps, self.dtype)
        assert views.scores is not None  # a CUDA ring's
        return views.scores

    def release(self, finished: bool = True) -> None:
        if getattr(self, "_pointer", 0) == 0:
            return
        try:
            torch.cuda.current_stream(self.device).synchronize()  # our own writes and closes
        except RuntimeError:
            pass  # a failed device: the memory goes with the process
        stub = self._client.client.stub
        for event_id in self._events:
            try:
                stub.UnregisterEvent(buffers_pb2.UnregisterEventRequest(
                    event_id=event_id, session_id=self._client.session_id), timeout=10)
            except Exception:  # the session's end releases it anyway
                pass
        if self._buffer_id:
            try:
                stub.UnregisterBuffer(buffers_pb2.UnregisterBufferRequest(
                    buffer_id=self._buffer_id, session_id=self._client.session_id), timeout=10)
            except Exception:
                pass
        # The CUDA objects go now, not whenever the garbage collector meets them: destroying a
        # graph or an event while some thread captures a graph breaks that capture.
        for graph in getattr(self, "_close_graphs", []):
            graph.reset()
        self._close_graphs = []
        self._ready, self._done, self._ready_host, self._copied = [], [], [], []
        self._timing = []
        if finished:
            self._driver.free(self._context, self._ordinal, self._pointer)
        # else: a window the sidecar never finished may still be read or written by the GPU (a
        # copy queued behind its done event): the allocation stays until the process ends.
        self._pointer = 0
