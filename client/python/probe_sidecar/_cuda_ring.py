"""The CUDA tap's ring (TorchClient.tap): hidden rows, scores and the tap's counters in one
device allocation of its own, shared with the sidecar by CUDA IPC, written on the GPU by a
capturable kernel, ordered against the sidecar by CUDA IPC events.

The allocation comes from the driver (cuMemAlloc), not from PyTorch's caching allocator: a plain
allocation can always be shared by CUDA IPC, whatever PYTORCH_CUDA_ALLOC_CONF says (expandable
segments cannot be shared that way).

Layout (one allocation, each part 256-byte aligned):
  slots   [2K + 1, max_batch, H]  hidden rows; slot 2K takes writes past a window's end (never read)
  scores  [2K, max_batch, P] float32, written by the sidecar
  rows    [K * max_batch] int32 = 0, 1, ...: the device rows of every window
  counts  [2K + 1] int32: rows written at each slot
  meta    [8] int64: 0 next slot, 1 end of the window's slots, 2 ticket (the write kernel's
          blocks count themselves in it), 3 writes in the current window, 4 + h writes of the
          last window of half h (kept when the window closes)
"""

from __future__ import annotations

import ctypes
import gc
import os
import threading
import time

import numpy as np
import torch

from probesidecar.v1 import buffers_pb2, score_pb2, tensor_pb2

from .tap import Ring, TapError, _Window

_ALIGN = 256
_META = 8
# Host copies of the scores in flight: the reader thread waits for a free one only when the
# delivery thread is this many windows behind (a window's timing events: twice as many).
_HOST_SLOTS = 4
_TORCH_DTYPES = {torch.float32: tensor_pb2.DTYPE_FLOAT32, torch.float16: tensor_pb2.DTYPE_FLOAT16,
                 torch.bfloat16: tensor_pb2.DTYPE_BFLOAT16}


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
    """The few CUDA driver calls the ring needs (libcuda.so.1, which every CUDA process has)."""

    def __init__(self):
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

    def alloc(self, context, nbytes: int) -> tuple[int, bytes]:
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
            return pointer.value, bytes(handle)
        finally:
            self.lib.cuCtxPopCurrent_v2(ctypes.byref(ctypes.c_void_p()))

    def free(self, context, ordinal: int, pointer: int) -> None:
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

    def __init__(self, pointer: int, nbytes: int):
        self.__cuda_array_interface__ = {"shape": (nbytes,), "typestr": "|u1",
                                         "data": (pointer, False), "version": 3, "strides": None,
                                         "stream": None}


def _kernels():
    """The Triton write and close kernels, or None (then torch operations do the same work with
    more launches): PROBE_SIDECAR_TAP_KERNEL=torch forces the latter."""
    if os.environ.get("PROBE_SIDECAR_TAP_KERNEL") == "torch":
        return None
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    # Not specialised on the row count or stride: one compilation (made at the tap's start)
    # serves every batch size, so none happens inside a caller's graph capture.
    @triton.jit(do_not_specialize=["src_stride", "n"])
    def tap_write(src, src_stride, slots, meta, counts, num_rows, n, H, slot_elems, overflow,
                  BLOCK: tl.constexpr, HAS_NUM_ROWS: tl.constexpr):
        # Grid (n, cdiv(H, BLOCK)): one block per row and BLOCK columns. Every block reads the
        # slot, copies its piece, then takes a ticket; the last one (all others have read the
        # slot: the tickets are acquire-release) advances the counters.
        row = tl.program_id(0)
        slot = tl.load(meta)
        limit = tl.load(meta + 1)
        target = tl.where(slot < limit, slot, overflow)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < H
        x = tl.load(src + row.to(tl.int64) * src_stride + cols, mask=mask)
        tl.store(slots + target * slot_elems + row.to(tl.int64) * H + cols, x, mask=mask)
        ticket = tl.atomic_add(meta + 2, 1)
        if ticket == tl.num_programs(0) * tl.num_programs(1) - 1:
            if HAS_NUM_ROWS:
                count = tl.load(num_rows).to(tl.int32)
            else:
                count = n
            tl.store(counts + target, count)
            tl.store(meta, tl.minimum(slot + 1, limit))
            tl.store(meta + 3, tl.load(meta + 3) + 1)
            tl.store(meta + 2, 0)

    @triton.jit
    def tap_close(meta, half, next_base, next_limit):
        # One block: keeps the window's write count for its half, points the counters at the
        # next window.
        tl.store(meta + 4 + half, tl.load(meta + 3))
        tl.store(meta, next_base)
        tl.store(meta + 1, next_limit)
        tl.store(meta + 3, 0)

    return tap_write, tap_close


class CudaRing(Ring):
    def __init__(self, client, probe_set: str, info, *, max_batch: int, window: int,
                 dtype: torch.dtype, device: torch.device, stream: torch.cuda.Stream | None,
                 host_ready: bool = False, reuse_timeout_s: float = 10.0):
        if dtype not in _TORCH_DTYPES:
            raise TapError(f"dtype must be torch.bfloat16, float16 or float32, got {dtype}")
        self.max_batch, self.window, self.hidden_size = max_batch, window, info.hidden_size
        self.dtype, self.device = dtype, device
        self.num_probes = info.num_probes
        self._client = client
        self._probe_set = probe_set
        self._stream = stream
        self._host_ready = host_ready  # submit="host": the host waits for each window's writes
        self._reuse_timeout_s = reuse_timeout_s
        self._driver = _Driver()
        self._ordinal = device.index
        self._context = self._driver.context(self._ordinal)
        k2 = 2 * window
        element = torch.empty((), dtype=dtype).element_size()
        self._slot_elems = max_batch * info.hidden_size
        parts = {"slots": (k2 + 1) * self._slot_elems * element,
                 "scores": k2 * max_batch * info.num_probes * 4,
                 "rows": window * max_batch * 4, "counts": (k2 + 1) * 4, "meta": _META * 8}
        self._offsets, total = {}, 0
        for name, nbytes in parts.items():
            self._offsets[name] = total
            total += -(-nbytes // _ALIGN) * _ALIGN
        self.nbytes = total
        self._pointer, handle = self._driver.alloc(self._context, total)
        self._buffer_id = 0
        self._events: list[int] = []
        try:
            raw = torch.as_tensor(_DeviceBytes(self._pointer, total), device=device)

            def view(name, count, dt):
                start = self._offsets[name]
                size = torch.empty((), dtype=dt).element_size()
                return raw[start:start + count * size].view(dt)

            self.slots = view("slots", (k2 + 1) * self._slot_elems, dtype).view(
                k2 + 1, max_batch, info.hidden_size)
            self.scores = view("scores", k2 * max_batch * info.num_probes, torch.float32).view(
                k2, max_batch, info.num_probes)
            self._rows = view("rows", window * max_batch, torch.int32)
            self.counts = view("counts", k2 + 1, torch.int32)
            self.meta = view("meta", _META, torch.int64)
            self._rows.copy_(torch.arange(window * max_batch, dtype=torch.int32))
            self.counts.zero_()
            self.meta.copy_(torch.tensor([0, window, 0, 0, 0, 0, 0, 0], dtype=torch.int64))
            self.scores.fill_(float("nan"))
            torch.cuda.synchronize(device)
            response = client.client._call(client.client.stub.RegisterBuffer,
                                           buffers_pb2.RegisterBufferRequest(
                                               name=f"tap:{probe_set}", device_id=self._ordinal,
                                               handle=handle, byte_size=total,
                                               client_pid=os.getpid(),
                                               session_id=client.session_id))
            self._buffer_id = response.buffer_id
            self._make_events(client)
            self._kernels = _kernels()
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
        self._ready[0].record(stream)
        self._client.client._call(self._client.client.stub.Score, self._request(0, self.window))
        self._done[0].synchronize()

    # --- set-up -------------------------------------------------------------------------------

    def _make_events(self, client) -> None:
        stream = torch.cuda.current_stream(self.device)

        def ipc_event():
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
        self._timing = [tuple(torch.cuda.Event(enable_timing=True) for _ in range(3))
                        for _ in range(2 * _HOST_SLOTS)]

    def _warm_up(self) -> None:
        """Compiles and loads the kernels now: not later inside a caller's graph capture."""
        probe = torch.zeros((1, self.hidden_size), dtype=self.dtype, device=self.device)
        count = torch.ones((), dtype=torch.int32, device=self.device)
        self.write(probe, None)
        self.write(probe, count)
        self._close_ops(half=1, next_base=0, next_limit=self.window)
        torch.cuda.synchronize(self.device)
        # Closing a window is the same work every time for a half: one small graph each, so that
        # a close costs the decode thread a graph launch. Captured thread-locally: the tap's own
        # threads may call CUDA meanwhile.
        self._close_graphs = []
        side = torch.cuda.Stream(self.device)
        # Garbage that holds CUDA graphs or events (another tap's, say) must not be collected,
        # and destroyed, while this capture is on.
        gc.collect()
        for half in (0, 1):
            graph = torch.cuda.CUDAGraph()
            next_base = (1 - half) * self.window
            with torch.cuda.stream(side), torch.cuda.graph(graph, stream=side,
                                                           capture_error_mode="thread_local"):
                self._close_ops(half, next_base, next_base + self.window)
            self._close_graphs.append(graph)
        torch.cuda.synchronize(self.device)

    # --- the decode thread ------------------------------------------------------------------

    def write(self, hidden, num_rows=None) -> None:
        if not isinstance(hidden, torch.Tensor) or hidden.device != self.device:
            raise TapError(f"write() takes a CUDA tensor on {self.device}, got "
                           f"{getattr(hidden, 'device', type(hidden))}")
        if hidden.dim() != 2 or hidden.shape[1] != self.hidden_size:
            raise TapError(f"write() needs [n, {self.hidden_size}] rows, got "
                           f"{tuple(hidden.shape)}")
        n = hidden.shape[0]
        if n > self.max_batch or n < 1:
            raise TapError(f"write() of {n} rows: the tap holds 1 to max_batch = {self.max_batch} "
                           f"per step")
        if hidden.dtype != self.dtype:
            raise TapError(f"write() of {hidden.dtype} rows into a {self.dtype} tap")
        if hidden.stride(1) != 1:
            raise TapError("write() needs rows whose columns are contiguous (stride(1) == 1)")
        if num_rows is not None:
            if (not isinstance(num_rows, torch.Tensor) or num_rows.device != self.device
                    or num_rows.numel() != 1 or num_rows.dtype not in (torch.int32, torch.int64)):
                raise TapError("num_rows must be a one-element int32/int64 tensor on the tap's "
                               "device (written by the loop, read on the GPU)")
        overflow = 2 * self.window
        if self._kernels is not None:
            block = min(1024, 1 << (self.hidden_size - 1).bit_length())
            grid = (n, -(-self.hidden_size // block))
            self._kernels[0][grid](
                hidden, hidden.stride(0), self.slots, self.meta, self.counts,
                num_rows if num_rows is not None else self.counts, n, self.hidden_size,
                self._slot_elems, overflow, BLOCK=block, HAS_NUM_ROWS=num_rows is not None)
            return
        # The same with torch operations (more launches): the slot, clamped to the spare slot
        # past the window's end; the copy; the counts; the counters.
        meta = self.meta
        target = torch.where(meta[0:1] < meta[1:2], meta[0:1], torch.full_like(meta[0:1],
                                                                                overflow))
        self.slots[:, :n].index_copy_(0, target, hidden.unsqueeze(0))
        if num_rows is None:
            self.counts.index_fill_(0, target, n)
        else:
            self.counts.index_copy_(0, target, num_rows.reshape(1).to(torch.int32))
        torch.minimum(meta[0:1] + 1, meta[1:2], out=meta[0:1])
        meta[3:4].add_(1)

    def _close_ops(self, half: int, next_base: int, next_limit: int) -> None:
        """On the current stream: keep the window's write count for its half, point the counters
        at the next window."""
        if self._kernels is not None:
            self._kernels[1][(1,)](self.meta, half, next_base, next_limit)
            return
        self.meta[4 + half:5 + half].copy_(self.meta[3:4])
        self.meta[0].fill_(next_base)
        self.meta[1].fill_(next_limit)
        self.meta[3].zero_()

    def close_window(self, window: _Window) -> None:
        stream = self._stream or torch.cuda.current_stream(self.device)
        half, steps = window.half, window.steps
        if self._stream is None:
            self._close_graphs[half].replay()  # on the current stream
        else:
            with torch.cuda.stream(stream):
                self._close_graphs[half].replay()
        self._ready[half].record(stream)
        self._timing[window.index % len(self._timing)][0].record(stream)  # for the latency
        if self._host_ready:
            self._ready_host[half].record(stream)
        window.request = self._request(half, steps)
        window.ring_state = self._done[half]  # what the half's next writes must follow

    def _request(self, half: int, steps: int) -> score_pb2.ScoreRequest:
        request = self._requests.get((half, steps))
        if request is None:
            rows = steps * self.max_batch
            request = score_pb2.ScoreRequest(
                probe_set=self._probe_set, session_id=self._client.session_id,
                ready_event=self._events[half], done_event=self._events[2 + half])
            base = half * self.window
            slot_bytes = self._slot_elems * self.slots.element_size()
            activations = request.activations
            activations.dtype = _TORCH_DTYPES[self.dtype]
            activations.shape.extend([rows, self.hidden_size])
            activations.row_stride = self.hidden_size
            activations.buffer.buffer_id = self._buffer_id
            activations.buffer.offset_bytes = self._offsets["slots"] + base * slot_bytes
            request.device_rows.dtype = tensor_pb2.DTYPE_INT32
            request.device_rows.shape.append(rows)
            request.device_rows.buffer.buffer_id = self._buffer_id
            request.device_rows.buffer.offset_bytes = self._offsets["rows"]
            output = request.output
            output.dtype = tensor_pb2.DTYPE_FLOAT32
            output.shape.extend([rows, self.num_probes])
            output.row_stride = self.num_probes
            output.buffer.buffer_id = self._buffer_id
            output.buffer.offset_bytes = (self._offsets["scores"]
                                          + base * self.max_batch * self.num_probes * 4)
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

    def answered(self, window: _Window, response) -> None:
        if response is None:
            return  # a failed window (or device-only results): nothing to copy
        half, steps = window.half, window.steps
        rows = steps * self.max_batch
        slot = window.index % _HOST_SLOTS
        self._host_free[slot].acquire()  # released by fetch() of window index - _HOST_SLOTS
        scores, counts, writes = self._host[slot]
        timing = self._timing[window.index % len(self._timing)]
        with torch.cuda.device(self.device), torch.cuda.stream(self._delivery):
            self._delivery.wait_event(self._done[half])
            timing[1].record(self._delivery)
            base = half * self.window
            scores[:rows].copy_(self.scores[base:base + steps].reshape(rows, self.num_probes),
                                non_blocking=True)
            counts[:steps].copy_(self.counts[base:base + steps], non_blocking=True)
            writes.copy_(self.meta[4 + half:5 + half], non_blocking=True)
            timing[2].record(self._delivery)
            self._copied[slot].record(self._delivery)
        window.ring_state = self._copied[slot]  # it follows the done event

    def fetch(self, window: _Window):
        steps = window.steps
        slot = window.index % _HOST_SLOTS
        try:
            if not _poll(self._copied[slot], time.monotonic() + self._reuse_timeout_s):
                raise TapError(f"window {window.index}: the sidecar did not write its scores "
                               f"within {self._reuse_timeout_s:g} s")
            scores, counts, writes = self._host[slot]
            rows = steps * self.max_batch
            scores = scores[:rows].numpy().reshape(steps, self.max_batch, self.num_probes).copy()
            num_rows = counts[:steps].numpy().copy()
            writes = int(writes[0])
            closed, scored, copied = self._timing[window.index % len(self._timing)]
            latency = (max(closed.elapsed_time(scored) * 1e-3, 0.0),
                       max(closed.elapsed_time(copied) * 1e-3, 0.0))
        finally:
            self._host_free[slot].release()
        return scores, num_rows, writes, latency

    def device_scores(self, window: _Window) -> torch.Tensor:
        half = window.half
        return self.scores[half * self.window:half * self.window + window.steps]

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
        self._ready = self._done = self._ready_host = self._copied = self._timing = []
        self._kernels = None
        if finished:
            self._driver.free(self._context, self._ordinal, self._pointer)
        # else: a window the sidecar never finished may still be read or written by the GPU (a
        # copy queued behind its done event): the allocation stays until the process ends.
        self._pointer = 0
