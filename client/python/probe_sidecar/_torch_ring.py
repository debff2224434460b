"""Rings written by the tap's operator (probe_sidecar.tap_op): what a CUDA ring (_cuda_ring) and a
CPU ring share, and the CPU ring itself.

Both are one uint8 tensor laid out by tap_op.RingLayout, written by `tap_write` — from Python
(`write`), from a captured CUDA graph, or from inside a compiled model (`write_op`, with no checks
that would need Python to run: a compiled forward runs none) — with the slot chosen by the
counters in the ring itself. A CPU ring sends each window's rows inline when the window closes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from . import tap_op
from .dtypes import DType, of_torch
from .errors import TapError
from .results import ProbeSetInfo
from .tap import InlineRing, Ring, _Window


def _entry(dtype: torch.dtype) -> DType:
    entry = of_torch(dtype)
    if entry is None:
        raise TapError(f"dtype must be torch.bfloat16, float16 or float32, got {dtype}")
    return entry


class TorchRing(Ring):
    """A ring in one uint8 tensor (`raw`), written by the tap operator."""

    raw: torch.Tensor
    layout: tap_op.RingLayout

    def _setup_layout(self, info: ProbeSetInfo, *, max_batch: int, window: int,
                      dtype: torch.dtype, device: torch.device, device_scores: bool) -> None:
        _entry(dtype)
        self.max_batch, self.window, self.hidden_size = max_batch, window, info.hidden_size
        self.dtype, self.device = dtype, device
        self.num_probes = info.num_probes
        self.layout = tap_op.RingLayout.make(window=window, max_batch=max_batch,
                                             hidden_size=info.hidden_size,
                                             num_probes=info.num_probes, dtype=dtype,
                                             device_scores=device_scores)
        self.layout_args = self.layout.op_args()

    def _adopt(self, raw: torch.Tensor) -> None:
        """Takes `raw` (the ring's memory) and sets it to its starting state."""
        self.raw = raw
        self._views = self.layout.initialise(raw, self.dtype)
        self.counts, self.meta = self._views["counts"], self._views["meta"]

    def _warm_up_writes(self) -> None:
        """Runs the plain writes once (a CUDA ring compiles its kernels now, not inside a caller's
        graph capture) and puts the counters back at the first window."""
        probe = torch.zeros((1, self.hidden_size), dtype=self.dtype, device=self.device)
        self.write(probe, None)
        self.write(probe, torch.ones((), dtype=torch.int32, device=self.device))
        tap_op.close_window(self.raw, self.layout, 1, 0)

    # --- the decode thread ------------------------------------------------------------------

    def write(self, hidden: Any, num_rows: Any = None) -> None:
        if not isinstance(hidden, torch.Tensor) or hidden.device != self.device:
            kind = "CUDA" if self.device.type == "cuda" else "CPU"
            raise TapError(f"write() takes a {kind} tensor on {self.device}, got "
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
                               "device (written by the loop, read where the write runs)")
        tap_op.tap_write(hidden, self.raw, self.layout_args, num_rows=num_rows)

    def write_op(self, hidden: torch.Tensor, *, residual: torch.Tensor | None = None,
                 gather: bool = False, starts: torch.Tensor | None = None) -> None:
        """The write for code that torch.compile traces (a hook, a model's forward): only the
        operator, whose own checks are of shapes and dtypes."""
        tap_op.tap_write(hidden, self.raw, self.layout_args, residual=residual, gather=gather,
                         starts=starts)

    def arm(self, rows: torch.Tensor, count: int) -> None:
        """Gather mode: the next write_op(gather=True) writes hidden[rows[:count]]."""
        tap_op.arm(self.raw, self.layout, rows, count)

    def disarm(self) -> None:
        tap_op.disarm(self.raw, self.layout)

    def follow_starts(self, on: bool = True) -> None:
        """Gather mode with no arm() per forward: each write_op given `starts` writes the rows it
        names (tap_op.follow_starts), from the next write in stream order."""
        tap_op.follow_starts(self.raw, self.layout, on)


class CpuRing(InlineRing, TorchRing):
    """A ring in host memory for a model on the CPU, whose windows travel inline (a CPU-backend
    sidecar, another host, tests): written by the operator inside a compiled forward as well."""

    def __init__(self, probe_set: str, info: ProbeSetInfo, *, max_batch: int, window: int,
                 dtype: torch.dtype, session_id: int = 0) -> None:
        self._setup_layout(info, max_batch=max_batch, window=window, dtype=dtype,
                           device=torch.device("cpu"), device_scores=False)
        self._adopt(torch.zeros(self.layout.nbytes, dtype=torch.uint8))
        self._probe_set, self._session_id = probe_set, session_id
        self._warm_up_writes()

    def close_window(self, window: _Window, divert_next: bool = False) -> None:
        if not window.lost:
            # The window's rows travel in the request (read where the protocol puts them:
            # RingLayout.window_views): the half may be rewritten at once.
            views = self.layout.window_views(self.raw, window.half, window.steps, self.dtype)
            self.inline_request(
                self._probe_set, self._session_id, window, _entry(self.dtype).proto,
                views.activations.numpy().tobytes(), views.counts.numpy().astype(np.int32),
                int(self.meta[tap_op.META_WRITES]))
        # A lost window's close keeps its half's last write count (docs/tap-protocol.md).
        tap_op.close_window(self.raw, self.layout, window.half, (1 - window.half) * self.window,
                            divert=divert_next, record=not window.lost)
