"""A tap: the way a decode loop scores its hidden states — one Score per window of K steps.

Each decode step writes its rows (the hidden state of every sequence) into the next slot of a
ring the tap owns; every K steps one Score covers the window. Between the inference server and
the sidecar, the GPU then switches contexts once per window instead of once per step, which is
what makes scoring cheap without MPS (docs/mps.md has the measurements).

    tap = client.tap("demo", hidden_size=4096, max_batch=64, window=16)
    for step in range(steps):
        hidden = decode_step()        # [batch, H]: e.g. a CUDA graph replay
        tap.write(hidden)             # copies the rows into the ring (capturable, on the GPU)
        tap.step()                    # host-side count: closes a window every K steps
    for window in tap.windows():      # or on_window=callback: delivered on a background thread
        for record in window.records():
            print(record.step, record.row, record.scores, record.fired)
    tap.close()

The ring has 2K slots in two halves: while the sidecar scores one half, the loop writes the other,
and a half is rewritten only after the call that read it has finished, which the decode thread
checks on the host when the window before closes (a window after the call: by then it has
normally long finished). What happens when it has not is the tap's `when_behind`:
  * "wait" (the default): the decode thread waits for it on the host, up to `reuse_timeout_s`;
    past that the tap fails for good, loudly (every later window fails) — for a loop that wants
    every window scored or an error;
  * "lose" (an inference engine's choice: the vLLM plugin's): no wait; that next window is *lost*
    — its writes go where nothing reads them, it is never sent, and it is delivered with a
    WindowLost error (stats.windows_lost) — and scoring resumes by itself with the first window
    whose half is free: a sidecar that falls behind, hangs or dies costs windows, not steps.
The decode stream never waits on the GPU for the sidecar in either case.
The decode thread only counts steps and, once per window, queues the request; answers, copies of
the scores to the host and the callback run on background threads.

This module holds what every tap shares (windows, halves, delivery, results) and the host tap
over numpy arrays, which sends each window inline: for CPU-backend servers, other hosts and tests.
The CUDA tap (device ring, CUDA IPC, GPU-side ordering, capturable writes) is
`probe_sidecar.torch.TorchClient.tap`.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

from probesidecar.v1 import score_pb2

from .dtypes import BY_NAME, of_torch
from .errors import TapError
from .pipeline import Pending, ScoreStreamPipeline
from .results import ProbeSetInfo

# Windows of an inline ring (their rows copied into their requests) sent and not yet answered,
# at most: past that, windows are lost rather than queued without bound behind a slow sidecar.
MAX_WINDOWS_ON_THEIR_WAY = 4

# What Ring.fetch() gives of an answered window: (scores [steps, max_batch, P], num_rows [steps],
# writes, (device, host memory) latencies in seconds or None).
Fetched = tuple[np.ndarray, np.ndarray, int, "tuple[float, float] | None"]


@dataclasses.dataclass(frozen=True)
class TapRecord:
    step: int  # the tap's step number (0 = the first step() after the tap was made)
    row: int  # the row's index in that step's write
    scores: np.ndarray  # float32 [P], after bias and activation
    fired: np.ndarray  # bool [P]: a finite score at or above its probe's threshold


@dataclasses.dataclass(frozen=True)
class TapWindow:
    """One window's scores, as delivered to `on_window` or `Tap.windows()`."""

    index: int  # windows are numbered from 0, in the order they closed
    first_step: int  # the step number of the window's first slot
    num_rows: np.ndarray  # int32 [steps]: rows written at each step of the window
    scores: np.ndarray  # float32 [steps, max_batch, P]; rows past num_rows[i] mean nothing
    fired: np.ndarray  # bool [steps, max_batch, P], likewise
    non_finite: int  # scores of written rows that are NaN or infinite (they never fire)
    closed_at: float  # time.monotonic() when step() closed the window
    delivered_at: float  # time.monotonic() when the scores were ready on the host
    # GPU time from the window's close (after its last write) to its scores in device memory,
    # and to their copy in host memory (CUDA tap; else None).
    device_latency_s: float | None = None
    host_memory_latency_s: float | None = None
    error: Exception | None = None  # set when the window could not be scored: no rows then

    @property
    def steps(self) -> int:
        return len(self.num_rows)

    @property
    def latency_s(self) -> float:
        """Host time from the window's close (step()) to its delivery."""
        return self.delivered_at - self.closed_at

    def records(self) -> Iterator[TapRecord]:
        """Every written row of the window, step by step."""
        for i, count in enumerate(self.num_rows.tolist()):
            for row in range(count):
                yield TapRecord(self.first_step + i, row, self.scores[i, row], self.fired[i, row])


@dataclasses.dataclass
class TapStats:
    steps: int = 0  # step() calls
    windows_closed: int = 0
    windows_delivered: int = 0  # delivered with scores (device-only taps: answered)
    windows_failed: int = 0  # delivered with an error
    windows_dropped: int = 0  # delivered while the windows() queue was full: the oldest went
    # Not scored: its half of the ring was still being read for an earlier window when it began
    # (the sidecar had fallen behind), so its writes went nowhere; delivered with a WindowLost.
    windows_lost: int = 0
    # CPU time of the tap's own threads (sending windows, copying and delivering their scores,
    # on_window included), nanoseconds: in a Python engine, time those threads may hold the
    # interpreter lock that the engine's step needs.
    thread_cpu_ns: int = 0


@dataclasses.dataclass
class _Window:
    """A closed window on its way: made on the decode thread, finished on the delivery thread."""

    index: int
    half: int
    first_step: int
    steps: int
    closed_at: float
    request: score_pb2.ScoreRequest | None = None  # made by the ring's close_window()
    pending: Pending | None = None
    ring_state: Any = None  # what the ring keeps of the window (its own business)
    # Set once the answer is in and what the ring does with it is queued (the copy of the scores,
    # for a CUDA tap).
    settled: threading.Event = dataclasses.field(default_factory=threading.Event)
    # True once nothing reads the window's half any more (its scores were fetched): the decode
    # thread then reuses the half without asking the ring.
    finished: bool = False
    error: Exception | None = None
    # Decided when the window before it closed: its half was not free, so its writes were
    # diverted (nothing reads them) and it is never sent.
    lost: bool = False


class WindowLost(TapError):
    """A window that was not scored because the sidecar had not finished reading its half of the
    ring for an earlier window when it began: the loop never waits for the sidecar."""


class Ring:
    """Where a tap's rows and scores live. Subclasses: HostRing (below), the CUDA ring
    (probe_sidecar.torch). Methods marked (decode thread) are called from step()/write(), the
    others from the tap's background threads."""

    max_batch: int
    hidden_size: int
    window: int
    # Whether close_window() copies the window's rows into its request (the half is free at
    # once), rather than the sidecar reading them where they are.
    copies_at_close = False

    def write(self, hidden: Any, num_rows: Any = None) -> None:  # (decode thread)
        raise NotImplementedError

    def close_window(self, window: _Window, divert_next: bool = False) -> None:  # (decode thread)
        """Marks the end of `window` (in `window.half`: its writes come before anything the
        request reads), sends the next writes to the start of the other half (or, with
        `divert_next`, where nothing reads them: that half is still being read), and sets
        `window.request` (not for a lost window: it is never sent)."""
        raise NotImplementedError

    def ready_wait(self, window: _Window) -> None:
        """Waits on the host until the window's writes have landed (only for submit="host")."""

    def finished(self, window: _Window, deadline: float) -> bool:  # (decode thread)
        """Whether everything that reads `window`'s half has finished, waiting on the host until
        time.monotonic() reaches `deadline` at most (the decode thread passes now: no wait)."""
        return True

    def answered(self, window: _Window, response: score_pb2.ScoreResponse | None) -> None:
        """The server's answer is in (reader thread): queue whatever fetch() needs."""

    def fetch(self, window: _Window) -> Fetched:
        """(scores [steps, max_batch, P], num_rows [steps], writes, latencies) of an answered
        window (delivery thread): `writes` is how many write() calls landed in it; latencies are
        (device, host memory) seconds on the GPU's clock, or None."""
        raise NotImplementedError

    def device_scores(self, window: _Window) -> Any:
        """The window's scores where the sidecar wrote them (it has finished)."""
        raise TapError("a host tap has no device ring: its scores come with the windows")

    def release(self, finished: bool = True) -> None:
        """Gives back what the ring holds, once the tap is closed; `finished`: whether every
        window is known to be done with it (else memory the GPU may still touch is kept)."""


class Tap:
    """Scores a decode loop's rows one window of `window` steps at a time; made by
    `Client.tap` (host ring) or `TorchClient.tap` (CUDA ring)."""

    def __init__(self, ring: Ring, pipeline: ScoreStreamPipeline, info: ProbeSetInfo, *,
                 max_window_s: float | None = None,
                 on_window: Callable[[TapWindow], None] | None = None,
                 host_results: bool = True, max_queued_windows: int = 1024,
                 raise_errors: bool = True, submit: str = "gpu",
                 reuse_timeout_s: float = 10.0,
                 on_close: Callable[[], None] | None = None, when_behind: str = "wait"):
        if max_window_s is not None and not max_window_s > 0:
            raise ValueError(f"max_window_s must be positive, got {max_window_s!r}")
        if submit not in ("gpu", "host"):
            raise ValueError(f"submit must be 'gpu' or 'host', got {submit!r}")
        if max_queued_windows < 1:
            raise ValueError("max_queued_windows must be at least 1")
        self.ring = ring
        self.window = ring.window
        self.probe_set = info.name
        self.num_probes = info.num_probes
        self.stats = TapStats()
        self._pipeline = pipeline
        self._thresholds = np.array(
            [p.threshold if p.HasField("threshold") else np.inf for p in info.probes],
            dtype=np.float32)
        self._max_window_s = max_window_s
        self._on_window = on_window
        self._host_results = host_results or on_window is not None
        self._raise_errors = raise_errors
        self._reuse_timeout_s = reuse_timeout_s
        if when_behind not in ("wait", "lose"):
            raise ValueError(f"when_behind must be 'wait' or 'lose', got {when_behind!r}")
        self._when_behind = when_behind
        self._failed: Exception | None = None  # when_behind="wait": a missed reuse deadline
        self._lose_next = False  # the next window's half is not free: its writes go nowhere
        self._on_their_way = 0  # windows sent and not answered
        self._way_lock = threading.Lock()
        self._lost_run = 0  # windows lost since the last one scored (logged once per run)
        self._log = logging.getLogger("probe_sidecar.tap")
        self._submit_after_ready = submit == "host"
        self._on_close = on_close
        self._closed = False
        self._step = 0
        self._half = 0
        self._in_window = 0
        self._window_started = 0.0
        self._windows = 0
        self._last: list[_Window | None] = [None, None]  # the last window of each half
        self._errors: collections.deque[Exception] = collections.deque()
        self._results: collections.deque[TapWindow] = collections.deque()
        self._results_cv = threading.Condition()
        self._max_queued = max_queued_windows
        self._deliveries: queue.SimpleQueue = queue.SimpleQueue()
        self._delivery = threading.Thread(target=self._deliver_loop, daemon=True,
                                          name="probe-sidecar-tap-delivery")
        self._delivery.start()
        # Windows are sent from a thread of their own (the decode thread only queues them); with
        # submit="host", once their writes have landed.
        self._submissions: queue.SimpleQueue = queue.SimpleQueue()
        self._submitter = threading.Thread(target=self._submit_loop, daemon=True,
                                           name="probe-sidecar-tap-submit")
        self._submitter.start()

    # --- the decode thread ------------------------------------------------------------------

    def write(self, hidden: Any, num_rows: Any = None) -> None:
        """Copies `hidden` [n, H] (n <= max_batch) into the current slot. On a CUDA tap this is
        GPU work on the current stream, capturable in the caller's CUDA graph: each replay writes
        the next slot (a device-resident counter picks it). `num_rows`: for a batch padded to a
        graph's size, the rows that are real (a CUDA int32 scalar tensor on a CUDA tap, written by
        the loop; an int on a host tap); default n. Call step() once per write."""
        self._check_open()
        self.ring.write(hidden, num_rows)

    def step(self) -> None:
        """Counts one decode step (call it after the step's write has been queued, replayed or
        not). Every `window` steps, or once `max_window_s` has passed since the window's first
        step, the window closes: one Score is queued for it. Raises TapError for a window that
        failed since the last call, unless the tap was made with raise_errors=False."""
        self._check_open()
        if self._in_window == 0:
            self._window_started = time.monotonic()
        self._in_window += 1
        self._step += 1
        self.stats.steps += 1
        if self._in_window >= self.window or (
                self._max_window_s is not None
                and time.monotonic() - self._window_started >= self._max_window_s):
            self._close_window()
        if self._errors and self._raise_errors:
            raise self._errors.popleft()

    def flush(self) -> None:
        """Closes the current window now, if it has a step (e.g. when the loop goes idle)."""
        self._check_open()
        if self._in_window:
            self._close_window()
        if self._errors and self._raise_errors:
            raise self._errors.popleft()

    def _close_window(self) -> None:
        if self._when_behind == "wait":
            self._close_window_waiting()
            return
        half, steps = self._half, self._in_window
        window = _Window(self._windows, half, self._step - steps, steps, time.monotonic(),
                         lost=self._lose_next)
        # The next window's half was last written by the window before this one: the sidecar
        # normally finished it a window ago. If it has not, the next window is lost (its writes
        # diverted) rather than the loop waiting: checked without waiting, on the host.
        previous = self._last[1 - half]
        free = previous is None or previous.finished or (
            previous.settled.is_set() and self.ring.finished(previous, time.monotonic())) or (
            # A ring whose windows carry their rows in the request frees its half at the close:
            # only the windows on their way are bounded.
            self.ring.copies_at_close and self._on_their_way < MAX_WINDOWS_ON_THEIR_WAY)
        self.ring.close_window(window, divert_next=not free)
        self._windows += 1
        self.stats.windows_closed += 1
        if window.lost:
            # Nothing of it is in its half, whose last window stays the one to wait for.
            self.stats.windows_lost += 1
            last = self._last[half]
            self._answered(window, None, WindowLost(
                f"window {window.index} was not scored: the sidecar had not finished window "
                f"{last.index if last is not None else '?'} when it began"))
        else:
            self._last[half] = window
            with self._way_lock:
                self._on_their_way += 1
            self._submissions.put(window)
        if not free and not self._lose_next and previous is not None:
            self._log.warning("probe-sidecar tap %r: the sidecar has not finished window %d; "
                              "windows are not scored until it catches up", self.probe_set,
                              previous.index)
        if free and self._lose_next:
            self._log.warning("probe-sidecar tap %r: scoring again after %d lost window(s)",
                              self.probe_set, self._lost_run + 1)
        self._lost_run = self._lost_run + 1 if window.lost else 0
        self._lose_next = not free
        self._half, self._in_window = 1 - half, 0

    def _close_window_waiting(self) -> None:
        """when_behind="wait": the next half's previous window is waited for on the host, up to
        reuse_timeout_s; past that the tap fails for good (loudly) and sends nothing more."""
        half, steps = self._half, self._in_window
        window = _Window(self._windows, half, self._step - steps, steps, time.monotonic())
        self.ring.close_window(window)
        self._windows += 1
        self.stats.windows_closed += 1
        self._last[half] = window
        if self._failed is not None:
            self._answered(window, None, self._failed)  # the sidecar is gone: fail, send nothing
        else:
            with self._way_lock:
                self._on_their_way += 1
            self._submissions.put(window)
        self._half, self._in_window = 1 - half, 0
        previous = self._last[self._half]
        if previous is not None and not previous.finished and self._failed is None:
            # The half's previous window: a whole window of steps ago, so normally long finished.
            deadline = time.monotonic() + self._reuse_timeout_s
            if not (previous.settled.wait(self._reuse_timeout_s)
                    and self.ring.finished(previous, deadline)):
                self._failed = TapError(
                    f"the sidecar did not finish window {previous.index} within "
                    f"{self._reuse_timeout_s:g} s (reuse_timeout_s): its half of the ring is "
                    f"rewritten and this tap scores nothing more; make a new one")
                self._errors.append(self._failed)

    def _send(self, window: _Window) -> None:
        assert window.request is not None  # only windows with a request are sent

        def on_answer(response: score_pb2.ScoreResponse | None, error: Exception | None) -> None:
            self._answered(window, response, error)

        window.pending = self._pipeline.submit(window.request, on_answer=on_answer)

    def _add_cpu(self, started_ns: int) -> None:
        """Counts this thread's CPU time since `started_ns` (time.thread_time_ns) in stats."""
        spent = time.thread_time_ns() - started_ns
        with self._way_lock:
            self.stats.thread_cpu_ns += spent

    def _check_open(self) -> None:
        if self._closed:
            raise TapError(f"the tap on probe set {self.probe_set!r} is closed")

    # --- background threads -------------------------------------------------------------------

    def _submit_loop(self) -> None:
        sent = None  # the last window sent
        while True:
            window = self._submissions.get()
            if window is None:
                return
            if window.request is None:
                # No row to score (an inline window whose steps wrote none): answered here, in
                # order, once the window before it has been.
                if sent is not None:
                    sent.settled.wait(self._reuse_timeout_s)
                self._answered(window, score_pb2.ScoreResponse(num_probes=self.num_probes), None)
                sent = window
                continue
            started = time.thread_time_ns()
            try:
                if self._submit_after_ready:
                    self.ring.ready_wait(window)
                self._send(window)
            except Exception as error:  # never lose a window: answer it with the error
                self._answered(window, None, error)
            self._add_cpu(started)
            sent = window

    def _answered(self, window: _Window, response: score_pb2.ScoreResponse | None,
                  error: Exception | None) -> None:
        """On the stream's reader thread, as soon as the answer is in."""
        started = time.thread_time_ns()
        window.error = error
        if not window.lost:  # a lost window was never sent: nothing of it is in the ring
            with self._way_lock:
                self._on_their_way -= 1
            try:
                self.ring.answered(window, response if self._host_results else None)
            except Exception as error:  # never lose the window: deliver it with the error
                window.error = window.error or error
        window.settled.set()
        self._deliveries.put(window)
        self._add_cpu(started)

    def _deliver_loop(self) -> None:
        """Delivers the windows in the order they closed. They are answered out of order: a lost
        window (or one failed for good) at its close, while the window before it may still be
        with the sidecar. Each waits here for those before it, so that a window's delivery means
        every earlier one's: a caller that counts delivered steps (the vLLM plugin's summaries)
        relies on it. At close, windows still held go out in order."""
        held: dict[int, _Window] = {}
        next_index = 0
        while True:
            window = self._deliveries.get()
            if window is not None:
                held[window.index] = window
            ready = []
            while next_index in held:
                ready.append(held.pop(next_index))
                next_index += 1
            if window is None:
                ready += [held.pop(index) for index in sorted(held)]
            for w in ready:
                started = time.thread_time_ns()
                try:
                    self._deliver(w)
                finally:
                    self._add_cpu(started)
            if window is None:
                return

    def _deliver(self, window: _Window) -> None:
        delivered = self._finish(window)
        if delivered is None:  # scores stay on the device: answered is all there is
            with self._results_cv:
                self.stats.windows_delivered += 1
                self._results_cv.notify_all()
            return
        if delivered.error is not None:
            self._errors.append(delivered.error)
        else:
            window.finished = True  # its scores were copied out: the half is free
        if self._on_window is not None:
            try:
                self._on_window(delivered)
            except Exception as error:  # the callback's bug must not stop delivery
                self._errors.append(TapError(f"on_window raised {error!r}"))
        with self._results_cv:
            if self._on_window is None:
                if len(self._results) >= self._max_queued:
                    self._results.popleft()
                    self.stats.windows_dropped += 1
                self._results.append(delivered)
            if delivered.error is not None:
                self.stats.windows_failed += 1
            else:
                self.stats.windows_delivered += 1
            self._results_cv.notify_all()

    def _finish(self, window: _Window) -> TapWindow | None:
        if window.error is None and not self._host_results:
            return None  # scores stay on the device; nothing to deliver
        if window.error is None:
            try:
                scores, num_rows, writes, latencies = self.ring.fetch(window)
            except Exception as error:
                window.error = error
            else:
                if writes != window.steps:
                    window.error = TapError(
                        f"window {window.index}: write() landed {writes} times but step() was "
                        f"called {window.steps} times (one write per step, and at most "
                        f"{self.window} writes per window)")
        now = time.monotonic()
        if window.error is not None:
            # Its steps, with no rows scored: steps stays true, records() yields nothing.
            shape = (window.steps, self.ring.max_batch, self.num_probes)
            return TapWindow(window.index, window.first_step, np.zeros(window.steps, np.int32),
                             np.full(shape, np.nan, np.float32), np.zeros(shape, bool), 0,
                             window.closed_at, now, error=window.error)
        finite = np.isfinite(scores)
        fired = finite & (scores >= self._thresholds)
        written = np.arange(self.ring.max_batch)[None, :] < num_rows[:, None]
        non_finite = int((~finite & written[:, :, None]).sum())
        return TapWindow(window.index, window.first_step, num_rows, scores, fired, non_finite,
                         window.closed_at, now, *(latencies or (None, None)))

    # --- results ------------------------------------------------------------------------------

    def device_scores(self, index: int) -> Any:
        """Window `index`'s scores in the CUDA tap's ring, float32 [steps, max_batch, P], for
        readers on the GPU, once the sidecar has written them (waited for on the host, so any
        stream may read them). Only the last window of each half is there; the view is valid until
        the window two after it starts writing its half (read it before then)."""
        window = next((w for w in self._last if w is not None and w.index == index), None)
        if window is None:
            raise TapError(f"window {index} is no longer in the ring (the last two windows are)")
        if not (window.settled.wait(self._reuse_timeout_s) and self.ring.finished(
                window, time.monotonic() + self._reuse_timeout_s)):
            raise TapError(f"window {index} was not finished within {self._reuse_timeout_s:g} s")
        if window.error is not None:
            raise window.error
        return self.ring.device_scores(window)

    def get(self, timeout: float | None = None) -> TapWindow | None:
        """The oldest delivered window not taken yet; None if none comes within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._results_cv:
            while not self._results:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._results_cv.wait(left)
            return self._results.popleft()

    def windows(self, timeout: float = 0.0) -> Iterator[TapWindow]:
        """Delivered windows, oldest first, until none arrives within `timeout` seconds (0: only
        those delivered already)."""
        while (window := self.get(timeout)) is not None:
            yield window

    def wait_delivered(self, timeout: float = 30.0) -> None:
        """Waits until every closed window has been delivered (or failed)."""
        done = lambda: (self.stats.windows_delivered + self.stats.windows_failed  # noqa: E731
                        >= self.stats.windows_closed)
        with self._results_cv:
            if not self._results_cv.wait_for(done, timeout):
                raise TimeoutError(f"{self.stats.windows_closed} windows closed, "
                                   f"{self.stats.windows_delivered + self.stats.windows_failed} "
                                   f"delivered after {timeout} s")

    def close(self, timeout: float = 30.0) -> None:
        """Scores the partial window, waits for every window, then releases the ring."""
        if self._closed:
            return
        try:
            if self._in_window:
                self._close_window()
            for window in self._last:
                if window is not None and not window.settled.wait(timeout):
                    raise TimeoutError(f"window {window.index} not answered within {timeout} s")
            if self._host_results:
                self.wait_delivered(timeout)
        finally:
            self._closed = True
            self._submissions.put(None)
            self._submitter.join(timeout)
            self._deliveries.put(None)
            self._delivery.join(timeout)
            deadline = time.monotonic() + min(timeout, self._reuse_timeout_s)
            finished = self._failed is None and all(
                w is None or (w.settled.is_set() and self.ring.finished(w, deadline))
                for w in self._last)
            self.ring.release(finished)
            on_close, self._on_close, self._on_window = self._on_close, None, None
            self._last = [None, None]  # no cycle keeps the ring's CUDA objects for the GC
            if on_close is not None:
                on_close()

    def __enter__(self) -> "Tap":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_tap_shape(info: ProbeSetInfo, hidden_size: int, max_batch: int, window: int,
                    max_rows: int) -> None:
    """The misuses a tap refuses when it is made."""
    if hidden_size != info.hidden_size:
        raise TapError(f"hidden_size {hidden_size} does not match probe set {info.name!r} "
                       f"(H = {info.hidden_size})")
    if max_batch < 1 or window < 1:
        raise TapError(f"max_batch and window must be at least 1, got {max_batch} and {window}")
    if max_rows and window * max_batch > max_rows:
        raise TapError(f"a window of {window} steps x {max_batch} rows is {window * max_batch} "
                       f"rows, more than the server's --max-rows ({max_rows}): use a smaller "
                       f"window or max_batch")


# --- the host tap ---------------------------------------------------------------------------


class InlineRing(Ring):
    """A ring whose windows travel inline: close_window() puts in the request only the rows each
    step wrote (inline_request), so a batch's padding is neither scored nor counted in the probe
    outcomes; the answer's scores go back to their places in [steps, max_batch, P]."""

    copies_at_close = True

    def rebind(self, session_id: int) -> None:
        """Windows closed from now on name session `session_id` (a sidecar that was restarted
        knows only the sessions opened since)."""
        self._session_id = session_id

    def inline_request(self, probe_set: str, session_id: int, window: _Window, proto_dtype: int,
                       slots: bytes, num_rows: np.ndarray, writes: int) -> None:
        """Sets window.request (activations: the window's slots as `slots`) and ring_state."""
        steps = window.steps
        request = score_pb2.ScoreRequest(probe_set=probe_set, session_id=session_id)
        request.activations.dtype = proto_dtype
        request.activations.shape.extend([steps * self.max_batch, self.hidden_size])
        request.activations.data = slots
        rows = (np.arange(self.max_batch)[None, :] < num_rows[:, None]).ravel().nonzero()[0]
        request.rows.extend(rows.tolist())
        # A window whose steps wrote no row has nothing to score: no request (Tap answers it).
        window.request = request if len(rows) else None
        window.ring_state = [num_rows, writes, rows]

    def answered(self, window: _Window, response: score_pb2.ScoreResponse | None) -> None:
        if response is not None:
            num_rows, writes, rows = window.ring_state
            scores = np.full((window.steps * self.max_batch, response.num_probes), np.nan,
                             np.float32)
            scores[rows] = np.frombuffer(response.scores, dtype="<f4").reshape(
                len(rows), response.num_probes)
            window.ring_state = [num_rows, writes, scores.reshape(window.steps, self.max_batch,
                                                                  -1)]

    def fetch(self, window: _Window) -> Fetched:
        num_rows, writes, scores = window.ring_state
        return scores, num_rows, writes, None


class HostRing(InlineRing):
    """A ring of numpy arrays whose windows travel inline (no GPU needed anywhere)."""

    def __init__(self, probe_set: str, session_id: int, hidden_size: int, max_batch: int,
                 window: int, dtype: str):
        if dtype not in BY_NAME:
            raise TapError(f"dtype must be one of {sorted(BY_NAME)}, got {dtype!r}")
        self.max_batch, self.hidden_size, self.window, self.dtype = (max_batch, hidden_size,
                                                                     window, dtype)
        self._proto_dtype = BY_NAME[dtype].proto
        self._slots: np.ndarray = np.zeros((2 * window, max_batch, hidden_size),
                                           BY_NAME[dtype].numpy)
        self._num_rows = np.zeros(2 * window, np.int32)
        self._slot = 0
        self._limit = window
        self._writes = 0
        self._probe_set, self._session_id = probe_set, session_id

    def write(self, hidden: Any, num_rows: Any = None) -> None:
        hidden = _host_array(hidden, self.dtype)
        if hidden.ndim != 2 or hidden.shape[1] != self.hidden_size:
            raise TapError(f"write() needs [n, {self.hidden_size}] rows, got {hidden.shape}")
        if hidden.shape[0] > self.max_batch:
            raise TapError(f"write() of {hidden.shape[0]} rows: the tap holds at most max_batch "
                           f"= {self.max_batch} per step")
        count = hidden.shape[0] if num_rows is None else int(num_rows)
        if not 0 <= count <= hidden.shape[0]:
            raise TapError(f"num_rows {count} is outside [0, {hidden.shape[0]}]")
        self._writes += 1
        if self._slot < self._limit:  # like the CUDA ring: a write past the window is not kept
            self._slots[self._slot, :hidden.shape[0]] = hidden
            self._num_rows[self._slot] = count
            self._slot += 1

    def close_window(self, window: _Window, divert_next: bool = False) -> None:
        base, steps = window.half * self.window, window.steps
        if not window.lost:
            # The window's rows travel in the request: the half may be rewritten at once.
            self.inline_request(self._probe_set, self._session_id, window, self._proto_dtype,
                                self._slots[base:base + steps].tobytes(),
                                self._num_rows[base:base + steps].copy(), self._writes)
        next_base = (1 - window.half) * self.window
        # Diverted: the next window's writes are not kept (as the CUDA ring's go to its spare).
        self._slot, self._writes = next_base, 0
        self._limit = next_base if divert_next else next_base + self.window


def _host_array(hidden: Any, dtype: str) -> np.ndarray:
    """A numpy view of host rows: numpy arrays as they are; CPU torch tensors through numpy (bf16
    as its raw bits)."""
    if isinstance(hidden, np.ndarray):
        if dtype == "bfloat16" and hidden.dtype != np.uint16:
            if hidden.dtype.name == "bfloat16":  # ml_dtypes
                return hidden.view(np.uint16)
            raise TapError(f"a bfloat16 tap takes bf16 rows (ml_dtypes or raw uint16 bits), got "
                           f"{hidden.dtype}")
        expected = BY_NAME[dtype].numpy
        if hidden.dtype != expected:
            raise TapError(f"a {dtype} tap takes {np.dtype(expected).name} rows, got {hidden.dtype}")
        return hidden
    module = type(hidden).__module__
    if module.startswith("torch"):
        import torch

        if hidden.is_cuda:
            raise TapError("a host tap takes CPU rows; for CUDA tensors use TorchClient.tap")
        entry = of_torch(hidden.dtype)
        if entry is None or entry.name != dtype:
            raise TapError(f"a {dtype} tap takes {dtype} rows, got {hidden.dtype}")
        hidden = hidden.detach()
        if hidden.dtype == torch.bfloat16:
            return hidden.view(torch.int16).numpy().view(np.uint16)
        return hidden.numpy()
    raise TapError(f"write() takes a numpy array or a CPU torch tensor, got {type(hidden)}")
