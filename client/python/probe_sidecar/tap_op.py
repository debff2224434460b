"""The tap's write as a PyTorch operator, `torch.ops.probe_sidecar.tap_write`: one node of a
compiled graph (torch.compile, vLLM, transformers' static-cache generate()) and one kernel of a
captured CUDA graph, so that every replay writes the next slot of the tap's ring.

A tap's ring is one uint8 tensor (device memory of its own for a CUDA tap, host memory for a CPU
tap) laid out by `RingLayout`. The operator declares that it mutates the ring and nothing else,
so Dynamo traces it as one opaque call, AOT autograd keeps the mutation (and Inductor writes it in
place), and nothing in the caller's model changes dtype or aliasing. Which slot a write lands in
is chosen on the device (`meta[META_NEXT_SLOT]`), never by Python: a compiled forward runs no
Python, and a replayed graph none either.

Two modes:
  * plain: `hidden` [n, H] is the step's rows (n <= max_batch); `num_rows` (a one-element device
    tensor) may say how many of them are real (clamped to [0, n]).
  * gather: the rows are `hidden[gather[i]]` for i < meta[META_ARMED]; an engine arms the ring
    before each forward it wants written (`arm()`: the row indices and their count) and the write
    disarms it. A forward that was not armed (warm-up, profiling, a graph capture's own run)
    writes nothing and counts nothing.
  * gather, following `starts`: an engine whose batch layout is a device tensor it rewrites
    before every forward anyway (vLLM's `query_start_loc`: request i's tokens are rows
    starts[i] .. starts[i + 1] - 1, padded requests empty) has each forward write the last row of
    every non-empty request, with no per-step arming at all: `follow_starts()` once, after the
    engine's warm-up. The non-empty requests must come first (padding last, as vLLM lays out a
    padded batch): row i of the slot is request i's. An explicit arm() still wins for one
    forward, then following resumes.
`residual` (same shape as `hidden`) is added in float32 before the store: the residual stream of
a decoder layer whose output is split in two (vLLM's layers return hidden and residual apart).

The ring's layout, its counters and the slot rules are the tap protocol, docs/tap-protocol.md,
which the C++ client's kernels (kernels/tap_write) follow too.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import torch

# The tap protocol (docs/tap-protocol.md): the same names as kernels/tap_write/tap_write.h
# (META_NEXT_SLOT for kTapMetaNextSlot, ...), held equal to it by tests/python/test_tap_protocol.py.
RING_ALIGN = 256  # kTapRingAlign: every part of a ring starts at a multiple of this (bytes)
# meta [META_SIZE] int64: the ring's counters, written on the device.
META_NEXT_SLOT = 0  # the slot the next write lands in; stops at the limit
META_LIMIT = 1  # the end of the current window's slots (writes past it go to the spare slot)
META_TICKET = 2  # the write kernel's blocks count themselves here (the last one advances NEXT)
META_WRITES = 3  # writes in the current window, those past its end included
META_HALF_WRITES = 4  # 4 + h: writes of the last window of half h (kept when the window closes)
META_ARMED = 6  # gather mode: rows to write at the next forward; ARMED_OFF, or ARMED_FOLLOW
META_REST = 7  # what ARMED returns to after a write (or a disarm): ARMED_OFF, or ARMED_FOLLOW
META_SIZE = 8
ARMED_OFF = -1  # kTapArmedOff: a gather write writes nothing
ARMED_FOLLOW = -2  # kTapArmedFollow: every gather write writes the rows `starts` names
# The operator's signature and ring rules, in compile cache keys (vLLM's): a graph compiled
# against another version is never reused.
OP_VERSION = 3


def initial_meta(window: int) -> list[int]:
    """A new ring's counters (TapInitialMeta): the first window is half 0's, nothing written, not
    armed."""
    meta = [0] * META_SIZE
    meta[META_LIMIT] = window
    meta[META_ARMED] = meta[META_REST] = ARMED_OFF
    return meta


@dataclasses.dataclass(frozen=True)
class WindowParts:
    """What a reader reads of a closed window of `steps` steps in half `half` (byte offsets into
    the ring; MakeTapWindowParts): what a CUDA ring's ScoreRequest names and what its delivery
    copies, what a CPU ring sends inline."""

    half: int
    steps: int
    first_slot: int  # half * K
    rows: int  # steps * max_batch
    activations: int  # [rows, H] of the ring's dtype, row stride H
    device_rows: int | None  # [rows] int32 = 0, 1, ... (CUDA rings)
    counts: int  # [steps] int32: the rows each step wrote (the rest of a slot is padding)
    scores: int | None  # [rows, P] float32, written by the sidecar (CUDA rings)
    writes: int  # int64: the window's write count (meta[META_HALF_WRITES + half])


@dataclasses.dataclass(frozen=True)
class WindowViews:
    """A closed window's parts as views of the ring tensor (no copies)."""

    activations: torch.Tensor  # uint8 [steps * slot_bytes]: the rows' bytes
    rows: torch.Tensor  # [steps, max_batch, H] of the ring's dtype
    counts: torch.Tensor  # int32 [steps]
    writes: torch.Tensor  # int64 [1]
    scores: torch.Tensor | None  # float32 [steps, max_batch, P] (CUDA rings)


@dataclasses.dataclass(frozen=True)
class RingLayout:
    """Where each part of a ring lives in its one allocation (byte offsets, RING_ALIGN-aligned, in
    this order; MakeTapRingLayout, docs/tap-protocol.md).

      slots   [2K + 1, max_batch, H] rows; slot 2K takes writes past a window's end (never read)
      scores  [2K, max_batch, P] float32, written by the sidecar (CUDA rings only)
      rows    [K * max_batch] int32 = 0, 1, ...: the device rows of every window (CUDA rings only)
      counts  [2K + 1] int32: rows written at each slot
      gather  [max_batch] int32: gather mode's row indices
      meta    [META_SIZE] int64: the counters above
    """

    window: int
    max_batch: int
    hidden_size: int
    num_probes: int
    element_size: int
    device_scores: bool  # scores and rows parts (a CUDA ring's Score reads and writes them)
    offsets: dict[str, int] = dataclasses.field(default_factory=dict, compare=False)
    nbytes: int = 0

    @classmethod
    def make(cls, *, window: int, max_batch: int, hidden_size: int, num_probes: int,
             dtype: torch.dtype, device_scores: bool) -> "RingLayout":
        k2 = 2 * window
        element = torch.empty((), dtype=dtype).element_size()
        parts = {"slots": (k2 + 1) * max_batch * hidden_size * element}
        if device_scores:
            parts["scores"] = k2 * max_batch * num_probes * 4
            parts["rows"] = window * max_batch * 4
        parts.update(counts=(k2 + 1) * 4, gather=max_batch * 4, meta=META_SIZE * 8)
        offsets, total = {}, 0
        for name, nbytes in parts.items():
            offsets[name] = total
            total += -(-nbytes // RING_ALIGN) * RING_ALIGN
        return cls(window, max_batch, hidden_size, num_probes, element, device_scores, offsets,
                   total)

    @property
    def overflow_slot(self) -> int:
        return 2 * self.window

    @property
    def slot_bytes(self) -> int:
        return self.max_batch * self.hidden_size * self.element_size

    def op_args(self) -> list[int]:
        """The operator's `layout` argument."""
        return [self.offsets["slots"], self.offsets["counts"], self.offsets["meta"],
                self.offsets["gather"], self.max_batch, self.hidden_size, self.overflow_slot]

    def view(self, raw: torch.Tensor, name: str, dtype: torch.dtype, count: int) -> torch.Tensor:
        start = self.offsets[name]
        size = torch.empty((), dtype=dtype).element_size()
        return raw[start:start + count * size].view(dtype)

    def window_parts(self, half: int, steps: int) -> WindowParts:
        """The parts of the closed window of `steps` (1..K) steps in half `half`."""
        if half not in (0, 1) or not 1 <= steps <= self.window:
            raise ValueError(f"a window is in half 0 or 1 and has 1 to K = {self.window} steps, "
                             f"got half {half}, {steps} steps")
        first = half * self.window
        scores = self.offsets.get("scores")
        if scores is not None:
            scores += first * self.max_batch * self.num_probes * 4
        return WindowParts(
            half=half, steps=steps, first_slot=first, rows=steps * self.max_batch,
            activations=self.offsets["slots"] + first * self.slot_bytes,
            device_rows=self.offsets.get("rows"), counts=self.offsets["counts"] + first * 4,
            scores=scores,
            writes=self.offsets["meta"] + (META_HALF_WRITES + half) * 8)

    def window_views(self, raw: torch.Tensor, half: int, steps: int,
                     dtype: torch.dtype) -> WindowViews:
        """The parts of a closed window (window_parts) as views of `raw`: what a reader reads."""
        parts = self.window_parts(half, steps)
        mb, h, p = self.max_batch, self.hidden_size, self.num_probes
        activations = raw[parts.activations:parts.activations + steps * self.slot_bytes]
        scores = None
        if parts.scores is not None:
            scores = raw[parts.scores:parts.scores + parts.rows * p * 4].view(
                torch.float32).view(steps, mb, p)
        return WindowViews(
            activations=activations, rows=activations.view(dtype).view(steps, mb, h),
            counts=raw[parts.counts:parts.counts + steps * 4].view(torch.int32),
            writes=raw[parts.writes:parts.writes + 8].view(torch.int64), scores=scores)

    def initialise(self, raw: torch.Tensor, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """Views of every part of `raw`, set to their starting values (rows 0, 1, ..., counters
        at the first window, scores NaN, not armed)."""
        k2, mb, h = 2 * self.window, self.max_batch, self.hidden_size
        views = {
            "slots": self.view(raw, "slots", dtype, (k2 + 1) * mb * h).view(k2 + 1, mb, h),
            "counts": self.view(raw, "counts", torch.int32, k2 + 1),
            "gather": self.view(raw, "gather", torch.int32, mb),
            "meta": self.view(raw, "meta", torch.int64, META_SIZE),
        }
        views["counts"].zero_()
        views["gather"].zero_()
        views["meta"].copy_(torch.tensor(initial_meta(self.window), dtype=torch.int64))
        if self.device_scores:
            views["scores"] = self.view(raw, "scores", torch.float32,
                                        k2 * mb * self.num_probes).view(k2, mb, self.num_probes)
            views["rows"] = self.view(raw, "rows", torch.int32, self.window * mb)
            views["rows"].copy_(torch.arange(self.window * mb, dtype=torch.int32))
            views["scores"].fill_(float("nan"))
        return views


# --- the operator ---------------------------------------------------------------------------

_LIBRARY = torch.library.Library("probe_sidecar", "DEF")
_LIBRARY.define("tap_write(Tensor hidden, Tensor(a!) ring, int[] layout, Tensor? residual, "
                "Tensor? num_rows, bool gather, Tensor? starts=None) -> ()")


def _check(hidden: torch.Tensor, ring: torch.Tensor, layout: list[int],
           residual: torch.Tensor | None, gather: bool,
           starts: torch.Tensor | None = None) -> None:
    # Shapes and dtypes only (no device values): checked at trace, capture and eager calls alike.
    if hidden.dim() != 2 or hidden.shape[1] != layout[5]:
        raise ValueError(f"tap_write: hidden must be [n, {layout[5]}], got {tuple(hidden.shape)}")
    if not gather and not 1 <= hidden.shape[0] <= layout[4]:
        raise ValueError(f"tap_write: {hidden.shape[0]} rows, the tap holds 1 to max_batch = "
                         f"{layout[4]} per step")
    if hidden.stride(1) != 1:
        raise ValueError("tap_write: rows must have contiguous columns (stride(1) == 1)")
    if ring.dtype != torch.uint8 or ring.device != hidden.device:
        raise ValueError("tap_write: the ring is a uint8 tensor on the rows' device")
    if residual is not None and (residual.shape != hidden.shape or residual.dtype != hidden.dtype
                                 or residual.stride(1) != 1):
        raise ValueError("tap_write: residual must match hidden (shape, dtype, contiguous columns)")
    if starts is not None and (not gather or starts.dim() != 1 or starts.numel() < layout[4] + 1
                               or starts.dtype not in (torch.int32, torch.int64)
                               or starts.device != hidden.device or starts.stride(0) != 1):
        raise ValueError(f"tap_write: starts is a contiguous int32/int64 vector of at least "
                         f"max_batch + 1 = {layout[4] + 1} entries on the rows' device, for "
                         f"gather mode")


@torch.library.register_fake("probe_sidecar::tap_write")
def _tap_write_fake(hidden: torch.Tensor, ring: torch.Tensor, layout: list[int],
                    residual: torch.Tensor | None, num_rows: torch.Tensor | None, gather: bool,
                    starts: torch.Tensor | None = None) -> None:
    _check(hidden, ring, layout, residual, gather, starts)


def _tap_write_cpu(hidden: torch.Tensor, ring: torch.Tensor, layout: list[int],
                   residual: torch.Tensor | None, num_rows: torch.Tensor | None, gather: bool,
                   starts: torch.Tensor | None = None) -> None:
    """Host memory: the counters are read and written directly (nothing is asynchronous)."""
    _check(hidden, ring, layout, residual, gather, starts)
    slots_at, counts_at, meta_at, gather_at, max_batch, h, overflow = layout
    meta = ring[meta_at:meta_at + META_SIZE * 8].view(torch.int64)
    if gather:
        n = int(meta[META_ARMED])
        if n == ARMED_FOLLOW and starts is not None:
            ends = starts[1:max_batch + 1].long()
            valid = ends > starts[:max_batch].long()
            n = int(valid.sum())  # the non-empty requests: a prefix of the batch
            index = ends[:n] - 1
        elif n < 0:
            return
        else:
            index = ring[gather_at:gather_at + n * 4].view(torch.int32).long()
        rows = hidden.index_select(0, index)
        if residual is not None:
            rows = (rows.float() + residual.index_select(0, index).float()).to(hidden.dtype)
        count = n
    else:
        rows = hidden if residual is None else (hidden.float() + residual.float()).to(hidden.dtype)
        n = hidden.shape[0]
        # The row count read where the write runs, clamped to the rows copied.
        count = n if num_rows is None else min(max(int(num_rows.reshape(-1)[0]), 0), n)
    slot, limit = int(meta[META_NEXT_SLOT]), int(meta[META_LIMIT])
    target = slot if slot < limit else overflow
    slot_bytes = max_batch * h * hidden.element_size()
    start = slots_at + target * slot_bytes
    ring[start:start + n * h * hidden.element_size()].view(hidden.dtype).view(n, h).copy_(rows)
    ring[counts_at:counts_at + (overflow + 1) * 4].view(torch.int32)[target] = count
    meta[META_NEXT_SLOT] = min(slot + 1, limit)
    meta[META_WRITES] += 1
    meta[META_ARMED] = meta[META_REST]


def _tap_write_cuda(hidden: torch.Tensor, ring: torch.Tensor, layout: list[int],
                    residual: torch.Tensor | None, num_rows: torch.Tensor | None, gather: bool,
                    starts: torch.Tensor | None = None) -> None:
    _check(hidden, ring, layout, residual, gather, starts)
    kernels = _triton_kernels()
    if kernels is None:
        _tap_write_cuda_torch(hidden, ring, layout, residual, num_rows, gather, starts)
        return
    slots_at, counts_at, meta_at, gather_at, max_batch, h, overflow = layout
    block = min(1024, 1 << (h - 1).bit_length())
    n = max_batch if gather else hidden.shape[0]
    kernels[0][(n, -(-h // block))](
        hidden, hidden.stride(0), hidden if residual is None else residual,
        hidden.stride(0) if residual is None else residual.stride(0), ring, slots_at, counts_at,
        meta_at, gather_at, num_rows if num_rows is not None else ring,
        starts if starts is not None else ring, hidden.shape[0], h, max_batch, overflow,
        BLOCK=block, BATCH_BLOCK=1 << max(max_batch - 1, 1).bit_length(),
        HAS_NUM_ROWS=num_rows is not None, HAS_RESIDUAL=residual is not None, GATHER=gather,
        HAS_STARTS=starts is not None)


def _tap_write_cuda_torch(hidden: torch.Tensor, ring: torch.Tensor, layout: list[int],
                          residual: torch.Tensor | None, num_rows: torch.Tensor | None,
                          gather: bool, starts: torch.Tensor | None = None) -> None:
    """The same with torch operations (more launches, every decision on the device): for a
    process without Triton, or PROBE_SIDECAR_TAP_KERNEL=torch."""
    slots_at, counts_at, meta_at, gather_at, max_batch, h, overflow = layout
    element = hidden.element_size()
    meta = ring[meta_at:meta_at + META_SIZE * 8].view(torch.int64)
    counts = ring[counts_at:counts_at + (overflow + 1) * 4].view(torch.int32)
    slots = ring[slots_at:slots_at + (overflow + 1) * max_batch * h * element].view(
        hidden.dtype).view(overflow + 1, max_batch, h)
    next_slot = meta[META_NEXT_SLOT:META_NEXT_SLOT + 1]
    limit = meta[META_LIMIT:META_LIMIT + 1]
    spare = torch.full_like(next_slot, overflow)
    if gather:
        armed = meta[META_ARMED:META_ARMED + 1]
        active = armed >= 0
        index = ring[gather_at:gather_at + max_batch * 4].view(torch.int32).long()
        count = armed.clamp(0, max_batch).to(torch.int32)
        if starts is not None:
            follow = armed == ARMED_FOLLOW
            ends = starts[1:max_batch + 1].long()
            index = torch.where(follow, ends - 1, index)
            count = torch.where(follow, (ends > starts[:max_batch].long()).sum().to(torch.int32),
                                count)
            active = active | follow
        index = index.clamp(0, hidden.shape[0] - 1)  # rows past the count may hold anything
        rows = hidden.index_select(0, index)
        if residual is not None:
            rows = (rows.float() + residual.index_select(0, index).float()).to(hidden.dtype)
    else:
        active = torch.ones_like(next_slot, dtype=torch.bool)
        rows = hidden if residual is None else (hidden.float() + residual.float()).to(hidden.dtype)
        count = (torch.full_like(counts[:1], hidden.shape[0]) if num_rows is None
                 else num_rows.reshape(1).long().clamp(0, hidden.shape[0]).to(torch.int32))
    n = rows.shape[0]
    writable = active & (next_slot < limit)
    # A write that is not armed lands in the spare slot, which nothing reads.
    target = torch.where(writable, next_slot, spare)
    if gather:
        # Rows past the count keep what the target slot held, as the other implementations do
        # (all of them when not armed: the count is then 0).
        kept = torch.arange(max_batch, device=hidden.device) < count
        rows = torch.where(kept[:, None], rows, slots.index_select(0, target)[0])
    slots[:, :n].index_copy_(0, target, rows.unsqueeze(0))
    counts.index_copy_(0, target, torch.where(active, count, counts.index_select(0, target)))
    advanced = torch.minimum(next_slot + 1, limit)
    next_slot.copy_(torch.where(active, advanced, next_slot))
    meta[META_WRITES:META_WRITES + 1].add_(active.long())
    meta[META_ARMED:META_ARMED + 1].copy_(meta[META_REST:META_REST + 1])


_LIBRARY.impl("tap_write", _tap_write_cpu, "CPU")
_LIBRARY.impl("tap_write", _tap_write_cuda, "CUDA")


def tap_write(hidden: torch.Tensor, ring: torch.Tensor, layout: list[int], *,
              residual: torch.Tensor | None = None, num_rows: torch.Tensor | None = None,
              gather: bool = False, starts: torch.Tensor | None = None) -> None:
    """Writes a step's rows into `ring`'s next slot (see the module's text)."""
    torch.ops.probe_sidecar.tap_write(hidden, ring, layout, residual, num_rows, gather, starts)


def arm(ring: torch.Tensor, layout: RingLayout, rows: torch.Tensor, count: int) -> None:
    """Gather mode: the next tap_write writes hidden[rows[i]] for i < `count` (<= max_batch).
    `rows`: an integer tensor on the ring's device (e.g. the engine's sampled-row indices); on a
    CUDA ring this is GPU work on the current stream (no host synchronisation)."""
    if not 0 <= count <= layout.max_batch:
        raise ValueError(f"arm: {count} rows, the tap holds 0 to max_batch = {layout.max_batch}")
    kernels = _triton_kernels() if ring.is_cuda else None
    if kernels is not None:  # one launch
        block = 1 << max(layout.max_batch - 1, 1).bit_length()
        kernels[2][(1,)](rows, ring, layout.offsets["gather"], layout.offsets["meta"], count,
                         BLOCK=block)
        return
    gather = layout.view(ring, "gather", torch.int32, layout.max_batch)
    meta = layout.view(ring, "meta", torch.int64, META_SIZE)
    if count:
        gather[:count].copy_(rows[:count], non_blocking=True)
    meta[META_ARMED:META_ARMED + 1].fill_(count)


def disarm(ring: torch.Tensor, layout: RingLayout) -> None:
    """Undoes arm() when the forward it was for will not run (following resumes, if on)."""
    meta = layout.view(ring, "meta", torch.int64, META_SIZE)
    meta[META_ARMED:META_ARMED + 1].copy_(meta[META_REST:META_REST + 1])


def follow_starts(ring: torch.Tensor, layout: RingLayout, on: bool = True) -> None:
    """Gather mode from now on (in stream order): every write given `starts` writes the last row
    of each non-empty request it names, with no arm() per forward; off: writes need arm() again.
    """
    value = ARMED_FOLLOW if on else ARMED_OFF
    layout.view(ring, "meta", torch.int64, META_SIZE)[META_ARMED:META_REST + 1].fill_(value)


def close_window(ring: torch.Tensor, layout: RingLayout, half: int, next_base: int,
                 divert: bool = False, record: bool = True) -> None:
    """Ends the current window (in stream order): keeps its write count for `half` and points the
    counters at the next window's slots, starting at `next_base` — or, with `divert`, at none of
    them (the next window's writes all go to the spare slot, which nothing reads: its half is
    still being read). `record=False` (the close of a diverted window) keeps the half's count of
    its last scored window, which may still be being read."""
    kernels = _triton_kernels() if ring.is_cuda else None
    meta_at = layout.offsets["meta"]
    limit = next_base if divert else next_base + layout.window
    if kernels is not None:
        kernels[1][(1,)](ring, meta_at, half, next_base, limit, int(record))
        return
    meta = layout.view(ring, "meta", torch.int64, META_SIZE)
    if record:
        meta[META_HALF_WRITES + half:META_HALF_WRITES + half + 1].copy_(
            meta[META_WRITES:META_WRITES + 1])
    meta[META_NEXT_SLOT].fill_(next_base)
    meta[META_LIMIT].fill_(limit)
    meta[META_WRITES].zero_()


_KERNELS: list[tuple[Any, Any, Any] | None] = []


def _triton_kernels() -> tuple[Any, Any, Any] | None:
    """The Triton write, close and arm kernels, or None (then torch operations do the same work
    with more launches): PROBE_SIDECAR_TAP_KERNEL=torch forces the latter."""
    if os.environ.get("PROBE_SIDECAR_TAP_KERNEL") == "torch":
        return None
    if not _KERNELS:
        _KERNELS.append(_make_triton_kernels())
    return _KERNELS[0]


def _make_triton_kernels() -> tuple[Any, Any, Any] | None:
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return None

    # The counters' indices are constexpr parameters of the kernels, their defaults the module's
    # constants (a kernel reads no Python global that is not a constexpr, and Triton's interpreter
    # no closure): never passed.
    # Not specialised on row counts or strides: one compilation (made when the tap starts) serves
    # every batch size, so that none happens inside a caller's graph capture.
    @triton.jit(do_not_specialize=["src_stride", "res_stride", "n"])
    # Triton kernels: no annotations but tl.constexpr (Triton resolves a parameter's annotation
    # as a name of the kernel's scope), hence untyped for mypy.
    def probe_sidecar_tap_write(  # type: ignore[no-untyped-def]
            src, src_stride, res, res_stride, ring, slots_at, counts_at, meta_at, gather_at,
            num_rows, starts, n, H, max_batch, overflow, BLOCK: tl.constexpr,
            BATCH_BLOCK: tl.constexpr, HAS_NUM_ROWS: tl.constexpr, HAS_RESIDUAL: tl.constexpr,
            GATHER: tl.constexpr, HAS_STARTS: tl.constexpr,
            META_NEXT_SLOT: tl.constexpr = META_NEXT_SLOT, META_LIMIT: tl.constexpr = META_LIMIT,
            META_TICKET: tl.constexpr = META_TICKET, META_WRITES: tl.constexpr = META_WRITES,
            META_ARMED: tl.constexpr = META_ARMED, META_REST: tl.constexpr = META_REST,
            ARMED_FOLLOW: tl.constexpr = ARMED_FOLLOW):
        # Grid (rows, cdiv(H, BLOCK)): one block per row (max_batch rows in gather mode) and BLOCK
        # columns. Every block reads the slot, copies its piece, then takes a ticket; the last one
        # (all others have read the slot: the tickets are acquire-release) advances the counters.
        meta = (ring + meta_at).to(tl.pointer_type(tl.int64))
        counts = (ring + counts_at).to(tl.pointer_type(tl.int32))
        slots = (ring + slots_at).to(src.dtype)
        row = tl.program_id(0)
        slot = tl.load(meta + META_NEXT_SLOT)
        limit = tl.load(meta + META_LIMIT)
        target = tl.where(slot < limit, slot, overflow)
        cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
        if GATHER:
            # Rows past the armed count (and every row when not armed: ARMED_OFF) copy nothing.
            armed = tl.load(meta + META_ARMED)
            gather = (ring + gather_at).to(tl.pointer_type(tl.int32))
            source = tl.load(gather + row).to(tl.int64)  # row < max_batch: inside the part
            valid = row < armed
            active = armed >= 0
            if HAS_STARTS:
                # Following: the last row of request `row`, if it has any (padding: none).
                follow = armed == ARMED_FOLLOW
                end = tl.load(starts + row + 1).to(tl.int64)
                source = tl.where(follow, end - 1, source)
                valid = tl.where(follow, end > tl.load(starts + row).to(tl.int64), valid)
                active = active | follow
        else:
            armed = n
            source = row.to(tl.int64)
            valid = row < armed
            active = armed >= 0
        mask = cols < tl.where(valid, H, 0)
        x = tl.load(src + source * src_stride + cols, mask=mask)
        if HAS_RESIDUAL:
            r = tl.load(res + source * res_stride + cols, mask=mask)
            x = (x.to(tl.float32) + r.to(tl.float32)).to(src.dtype.element_ty)
        tl.store(slots + target * max_batch * H + row.to(tl.int64) * H + cols, x, mask=mask)
        if active:
            ticket = tl.atomic_add(meta + META_TICKET, 1)
            if ticket == tl.num_programs(0) * tl.num_programs(1) - 1:
                if GATHER:
                    count = armed.to(tl.int32)
                    if HAS_STARTS:
                        i = tl.arange(0, BATCH_BLOCK)
                        inside = i < max_batch
                        lo = tl.load(starts + i, mask=inside, other=0)
                        hi = tl.load(starts + i + 1, mask=inside, other=0)
                        count = tl.where(follow, tl.sum((hi > lo).to(tl.int32), axis=0), count)
                elif HAS_NUM_ROWS:
                    # Read where the write runs, clamped to the rows copied (in 64 bits: an int64
                    # count past 2^31 is n, as in C++).
                    wanted = tl.load(num_rows).to(tl.int64)
                    count = tl.minimum(tl.maximum(wanted, 0), n.to(tl.int64)).to(tl.int32)
                else:
                    count = n
                tl.store(counts + target, count)
                tl.store(meta + META_NEXT_SLOT, tl.minimum(slot + 1, limit))
                tl.store(meta + META_WRITES, tl.load(meta + META_WRITES) + 1)
                tl.store(meta + META_TICKET, 0)
                tl.store(meta + META_ARMED, tl.load(meta + META_REST))

    @triton.jit
    def probe_sidecar_tap_close(  # type: ignore[no-untyped-def]
            ring, meta_at, half, next_base, next_limit, record=1,
            META_NEXT_SLOT: tl.constexpr = META_NEXT_SLOT, META_LIMIT: tl.constexpr = META_LIMIT,
            META_WRITES: tl.constexpr = META_WRITES,
            META_HALF_WRITES: tl.constexpr = META_HALF_WRITES):
        # One block: keeps the window's write count for its half (unless `record` is 0), points
        # the counters at the next window.
        meta = (ring + meta_at).to(tl.pointer_type(tl.int64))
        if record != 0:
            tl.store(meta + META_HALF_WRITES + half, tl.load(meta + META_WRITES))
        tl.store(meta + META_NEXT_SLOT, next_base)
        tl.store(meta + META_LIMIT, next_limit)
        tl.store(meta + META_WRITES, 0)

    @triton.jit(do_not_specialize=["count"])
    def probe_sidecar_tap_arm(  # type: ignore[no-untyped-def]
            rows, ring, gather_at, meta_at, count, BLOCK: tl.constexpr,
            META_ARMED: tl.constexpr = META_ARMED):
        # One block: the row indices of the next gathered write, and their count.
        gather = (ring + gather_at).to(tl.pointer_type(tl.int32))
        meta = (ring + meta_at).to(tl.pointer_type(tl.int64))
        i = tl.arange(0, BLOCK)
        keep = i < count
        tl.store(gather + i, tl.load(rows + i, mask=keep).to(tl.int32), mask=keep)
        tl.store(meta + META_ARMED, count.to(tl.int64))

    # Named so that a profile of the caller's step shows which kernels are the tap's.
    return probe_sidecar_tap_write, probe_sidecar_tap_close, probe_sidecar_tap_arm


__all__ = ["RingLayout", "WindowParts", "WindowViews", "initial_meta", "tap_write", "arm",
           "disarm", "follow_starts", "close_window"]
