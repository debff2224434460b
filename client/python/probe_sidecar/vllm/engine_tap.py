"""An engine's taps: one per probe set, stepped where the engine steps, results per request.

An inference engine runs one forward per step over a batch whose rows belong to requests. Before
the forward, `arm()` names the rows to write (the rows the engine samples from) and what each is
(request id, token position, whether it produces a token); the forward's tap operator writes them
on the device; after it, `count_step()` counts the step on every tap. Every `window` steps (or
after `max_window_s`, also while the engine is idle) a window closes and is scored; when its
scores arrive, each row becomes a `ProbeRecord` of its request and position, and a request that has
finished gets its summary once every window holding its rows has been delivered.

Nothing here knows vLLM: the plugin (probe_sidecar.vllm.install) calls it from the model runner,
and tests call it directly.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import queue
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast

import numpy as np
import torch

from ..tap import Tap, TapWindow, WindowLost
from .records import JsonlSink, ProbeRecord, ProbeSummary
from .summaries import Rows, SummaryTable

if TYPE_CHECKING:
    from .._torch_ring import TorchRing

MAX_SINK_BATCHES = 4096  # deliveries queued for the callbacks and the JSONL file, at most
RECOVER_EVERY_S = 0.25  # at most one attempt to bind to a restarted sidecar per this
STAGING = 8  # arm_host's pinned buffers, used in turn


# Requests whose summaries are complete: (engine request id, {probe set: summary}).
Finished = list[tuple[str, dict[str, ProbeSummary]]]
# What the sinks' thread is handed per delivery (records, finished requests); None: stop.
_SinkBatch = tuple[list[ProbeRecord], Finished]


class Closeable(Protocol):
    """What the taps need open (a session, a TorchClient), closed after them."""

    def close(self) -> object: ...


def _ring(tap: Tap) -> TorchRing:
    """An engine tap's ring: written by the tap operator (a CpuRing or a CudaRing)."""
    return cast("TorchRing", tap.ring)


@dataclasses.dataclass(frozen=True)
class StepRows:
    """What one step writes: row i belongs to request_ids[i], at positions[i]."""

    request_ids: tuple[str, ...]
    positions: np.ndarray  # int64 [n]
    sampled: np.ndarray  # bool [n]: the row produces a token (False: a partial prefill chunk)


@dataclasses.dataclass
class _Step:
    rows: StepRows
    keys: np.ndarray  # int64 [n]: each row's request key (EngineTap._key)
    taps_left: int  # taps whose window with this step has not been delivered


class EngineTap:
    def __init__(self, make_tap: Callable[[str, Callable[[TapWindow], None]], Tap],
                 probe_names: dict[str, tuple[str, ...]], *, window: int,
                 max_window_s: float | None = None,
                 on_record: Callable[[ProbeRecord], None] | None = None,
                 on_request: Callable[[str, dict[str, ProbeSummary]], None] | None = None,
                 jsonl: str | None = None, max_queued_records: int = 0,
                 max_finished: int = 10000, max_finished_s: float | None = None,
                 logger: logging.Logger | None = None,
                 holds: Iterable[Closeable] = (), hold_last_row: bool = False,
                 recover: Callable[[], bool] | None = None):
        """`make_tap(probe_set, on_window)`: a tap for that probe set whose windows go to
        `on_window` (made with raise_errors=False: a failed window is reported, never raised into
        the engine). `holds`: objects with close() that the taps need open (a session), closed
        last. `hold_last_row`: the engine may run one forward too many for a request that has
        ended (asynchronous scheduling: the step after the one that sampled its stop token was
        scheduled before that token was seen), so each request's newest row is held back until
        a later row of it arrives or the request's length is known at its end (finish()).
        `recover()`: called (on a thread of its own, at most once per RECOVER_EVERY_S) when a
        window failed because the sidecar was gone or did not know the taps' session (it was
        restarted); True once the taps are bound to the sidecar again."""
        self._holds = list(holds)
        self.window = window
        self.probe_names = probe_names
        self._max_window_s = max_window_s
        self._on_record = on_record
        self._on_request = on_request
        self._log = logger or logging.getLogger("probe_sidecar.vllm")
        self._jsonl = JsonlSink(jsonl, probe_names) if jsonl else None
        # Callbacks and the JSONL file run on a thread of their own, fed by a bounded queue: a
        # slow sink never sits between the sidecar's answers and the next window (a full queue
        # drops, counted as sink_dropped; summaries stay for collect()).
        self._sink_queue: queue.Queue[_SinkBatch | None] | None = None
        self._sink_thread: threading.Thread | None = None
        if on_record or on_request or jsonl:
            self._sink_queue = queue.Queue(maxsize=MAX_SINK_BATCHES)
            # The loop is handed the queue: close() clears _sink_queue while the loop drains it.
            self._sink_thread = threading.Thread(target=self._sink_loop, args=(self._sink_queue,),
                                                 daemon=True, name="probe-sidecar-vllm-sinks")
            self._sink_thread.start()
        self._max_finished = max_finished
        # The engine's side: arm, count, flush. Held by the engine around a whole step (so that
        # the idle flusher never closes a window between a step's write and its count).
        self.lock = threading.RLock()
        self._armed: tuple[StepRows, np.ndarray] | None = None  # the rows, their keys
        self._step = 0  # steps counted (the taps' step numbers)
        self._open = 0  # steps in the current window
        self._opened_at = 0.0
        # the engine's CUDA stream, for a flush from the idle flusher
        self._stream: torch.cuda.Stream | None = None
        self._following = False  # the rings follow the engine's starts (follow())
        # The results' side (delivery threads and the engine).
        self._results = threading.Condition()
        self._steps: dict[int, _Step] = {}
        self._live: set[str] = set()  # requests seen and not finished
        self._finishing: dict[str, int] = {}  # finished request -> steps counted when it finished
        # Each request seen gets a small integer key (reused once its summary is made), which
        # indexes the taps' summary tables and `_ends`: a finished request's length (prompt +
        # generated tokens; -1 while unknown), past which rows sampled tokens its caller never
        # got and are dropped.
        self._keys: dict[str, int] = {}
        self._ids: list[str | None] = []
        self._free_keys: list[int] = []
        self._ends = np.full(64, -1, np.int64)
        self._staging: list[torch.Tensor] | None = None  # arm_host's, made at its first use
        self._staged = 0
        self._last_ids: tuple[str, ...] | None = None  # the previous step's, and their keys
        self._last_keys = np.zeros(0, np.int64)
        self._tables = {name: SummaryTable(name, probes, hold_last_row)
                        for name, probes in probe_names.items()}
        self._wants_records = bool(on_record or jsonl or max_queued_records)
        self._recover = recover
        self._failing = 0  # windows failed since the last one scored
        self._recovering = threading.Lock()
        self._recovered_at = 0.0
        self._done: collections.OrderedDict[str, dict[str, ProbeSummary]] = (
            collections.OrderedDict())
        self._done_at: dict[str, float] = {}  # when each summary was made
        self._max_finished_s = max_finished_s
        self._delivered = {name: 0 for name in probe_names}  # steps delivered, per probe set
        self._records: collections.deque[ProbeRecord] = collections.deque(
            maxlen=max_queued_records or None)
        self._keep_records = max_queued_records > 0
        self.stats: collections.Counter[str] = collections.Counter()
        self.taps: dict[str, Tap] = {}
        try:
            for name in probe_names:
                self.taps[name] = make_tap(name, functools.partial(self._on_window, name))
        except BaseException:
            self.close()
            raise
        self._closing = threading.Event()
        self._flusher: threading.Thread | None = None
        if max_window_s is not None:
            self._flusher = threading.Thread(target=self._flush_loop, args=(max_window_s,),
                                             daemon=True, name="probe-sidecar-vllm-flush")
            self._flusher.start()

    # --- the engine's thread ------------------------------------------------------------------

    def arm(self, rows: torch.Tensor | None, step_rows: StepRows,
            new_requests: Collection[str] = ()) -> None:
        """Before the forward (under `lock`): the forward writes rows[:n] of its hidden state,
        n = len(step_rows.request_ids) — or, with rows None, the rows its rings follow
        (follow()); `new_requests`: ids scheduled for the first time."""
        if rows is not None:
            count = len(step_rows.request_ids)
            for tap in self.taps.values():
                _ring(tap).arm(rows, count)
            if rows.is_cuda:
                self._stream = torch.cuda.current_stream(rows.device)
        ids = step_rows.request_ids
        if ids != self._last_ids:  # in steady decoding the batch is the last step's
            with self._results:
                self._last_keys = np.fromiter((self._key(r) for r in ids), np.int64, len(ids))
                self._last_ids = ids
                if new_requests:
                    self._live.update(new_requests)
        elif new_requests:
            with self._results:
                self._live.update(new_requests)
        self._armed = (step_rows, self._last_keys)

    def follow(self) -> None:
        """(Under `lock`, on the engine's stream, once its warm-up and graph captures are done)
        From the next forward on, every forward writes the rows its tap operator's `starts`
        names, with no arming per step: arm(None, ...) then only says what the rows are. An
        explicit arm() (arm_host) still wins for one forward."""
        for tap in self.taps.values():
            _ring(tap).follow_starts()
        self._following = True
        self._stream = torch.cuda.current_stream() if self._on_cuda() else None

    def spent(self, started_ns: int) -> None:
        """(The engine's thread) Counts the plugin's time in a step since `started_ns`
        (time.perf_counter_ns): what state()'s "host" figures report per step."""
        self.stats["host_engine_ns"] += time.perf_counter_ns() - started_ns

    def host_costs(self) -> dict[str, float]:
        """Where the plugin's host time goes, in microseconds: on the engine's thread per step
        (arming, bookkeeping, counting; window closes included) and per window close; the taps'
        own threads' CPU per window (sending, copying, folding into summaries), which in one
        Python process may hold the interpreter lock that the engine's step waits for."""
        steps, windows = max(self._step, 1), max(sum(t.stats.windows_closed
                                                      for t in self.taps.values()), 1)
        return {"engine_us_per_step": round(self.stats["host_engine_ns"] / steps / 1e3, 2),
                "close_us_per_window": round(self.stats["host_close_ns"] * len(self.taps)
                                             / windows / 1e3, 2),
                "threads_us_per_window": round(sum(t.stats.thread_cpu_ns
                                                   for t in self.taps.values())
                                               / windows / 1e3, 2),
                "threads_us_per_step": round(sum(t.stats.thread_cpu_ns
                                                 for t in self.taps.values()) / steps / 1e3, 2)}

    def _on_cuda(self) -> bool:
        return any(_ring(tap).raw.is_cuda for tap in self.taps.values())

    def arm_host(self, rows_at: np.ndarray, step_rows: StepRows,
                 new_requests: Collection[str] = ()) -> None:
        """arm() with the rows to write given on the host (int64 [n]: some of a step's requests
        are not scored). On a CUDA ring they reach the device through pinned staging memory, in
        stream order (STAGING buffers used in turn, so that a copy still queued is never
        overwritten by the steps the host runs ahead)."""
        ring = _ring(next(iter(self.taps.values())))
        if ring.raw.device.type != "cuda":
            self.arm(torch.from_numpy(np.ascontiguousarray(rows_at, np.int64)), step_rows,
                     new_requests)
            return
        device = ring.raw.device
        if self._staging is None:
            self._staging = [torch.zeros(ring.max_batch, dtype=torch.int64, pin_memory=True)
                             for _ in range(STAGING)]
        staging = self._staging[self._staged % STAGING]
        self._staged += 1
        staging[:len(rows_at)].copy_(torch.from_numpy(np.ascontiguousarray(rows_at, np.int64)))
        on_device = staging[:max(len(rows_at), 1)].to(device, non_blocking=True)
        self.arm(on_device, step_rows, new_requests)

    def _key(self, request_id: str) -> int:
        """(under _results) The request's key, assigned at its first row."""
        key = self._keys.get(request_id)
        if key is None:
            if self._free_keys:
                key = self._free_keys.pop()
                self._ids[key] = request_id
            else:
                key = len(self._ids)
                self._ids.append(request_id)
                if key >= len(self._ends):
                    self._ends = np.concatenate([self._ends, np.full(len(self._ends), -1,
                                                                     np.int64)])
            self._keys[request_id] = key
        return key

    def disarm(self) -> None:
        """The armed forward will not run (it raised)."""
        if self._armed is not None:
            for tap in self.taps.values():
                _ring(tap).disarm()
            self._armed = None

    def count_step(self) -> None:
        """After the armed forward was issued (under `lock`): one step on every tap."""
        armed, self._armed = self._armed, None
        if armed is None:
            return
        with self._results:
            self._steps[self._step] = _Step(armed[0], armed[1], len(self.taps))
        started = time.perf_counter_ns()
        for tap in self.taps.values():
            tap.step()  # every `window` steps: closes the window
        if self._open + 1 >= self.window:
            self.stats["host_close_ns"] += time.perf_counter_ns() - started
        self._step += 1
        if self._open == 0:
            self._opened_at = time.monotonic()
        self._open += 1
        if self._open >= self.window:
            self._open = 0
        elif (self._max_window_s is not None
              and time.monotonic() - self._opened_at >= self._max_window_s):
            self._flush_locked()

    def finish(self, request_ids: Iterable[str],
               lengths: Mapping[str, int] | None = None) -> None:
        """Requests that have ended (finished, stopped early, aborted): each gets its summary
        once the windows holding its rows (all in steps counted so far) are delivered.
        `lengths`: {request id: its tokens, prompt and generated} where known; rows past them
        (a forward scheduled before the engine saw the request end) are dropped."""
        records: list[ProbeRecord] = []
        with self._results:
            for request_id in request_ids:
                if request_id in self._live:
                    self._live.discard(request_id)
                    self._finishing[request_id] = self._step
                    key = self._keys.get(request_id)
                    if lengths and request_id in lengths and key is not None:
                        self._ends[key] = int(lengths[request_id])
            finished = self._finalize_ready(records)
            self._queue_locked(records)
        self._emit(records, finished)

    def finish_callers(self, lengths: Mapping[str, int | None],
                       known: dict[str, int] | None = None) -> None:
        """finish() for requests the engine's front end has returned, named by the caller's id
        or the engine's ({id: length or None}): those the engine has not reported ended yet (its
        last step's news reaches the model runner only with the next step). A length of None is
        looked up in `known` ({engine id: length}: where the scheduler saw it end), and taken
        from there."""
        with self._results:
            live = [r for r in self._live if r in lengths or _caller_id(r) in lengths]
        found: dict[str, int] = {}
        for request_id in live:
            length = lengths.get(request_id, lengths.get(_caller_id(request_id)))
            if length is None and known is not None:
                length = known.pop(request_id, None)
            if length is not None:
                found[request_id] = length
        self.finish(live, found)

    def flush(self) -> None:
        """Closes the current window now (any thread)."""
        with self.lock:
            self._flush_locked()

    def _flush_locked(self) -> None:
        if self._open == 0:
            return
        self._open = 0
        if self._stream is not None:
            with torch.cuda.stream(self._stream):
                for tap in self.taps.values():
                    tap.flush()
        else:
            for tap in self.taps.values():
                tap.flush()

    def wait_delivered(self, timeout: float) -> None:
        for tap in self.taps.values():
            tap.wait_delivered(timeout)

    def _flush_loop(self, max_window_s: float) -> None:
        """Closes a window left open longer than max_window_s (the engine went idle)."""
        pause = max(max_window_s / 4, 0.005)
        while not self._closing.wait(pause):
            with self.lock:
                if self._open and time.monotonic() - self._opened_at >= max_window_s:
                    try:
                        self._flush_locked()
                    except Exception as error:  # e.g. the sidecar is gone: logged, not fatal
                        self._log.error("probe-sidecar: closing an idle window failed: %s", error)

    # --- delivery -------------------------------------------------------------------------------

    def _on_window(self, probe_set: str, window: TapWindow) -> None:
        """A tap's delivery thread: the window's rows folded into their requests' summaries
        (array operations, not a loop over rows), and records made where a sink wants them."""
        records: list[ProbeRecord] = []
        table = self._tables[probe_set]
        with self._results:
            lost = isinstance(window.error, WindowLost)
            if window.error is not None:
                self.stats["windows_lost" if lost else "windows_failed"] += 1
                if not lost:  # a lost window is counted, and logged once per run by its tap
                    # Logged once per run of failures (and when windows are scored again).
                    if self._failing == 0:
                        self._log.error("probe-sidecar: window %d of probe set %r failed: %s "
                                        "(the next failures are counted, not logged)",
                                        window.index, probe_set, window.error)
                    self._failing += 1
                    self._maybe_recover(window.error)
            elif self._failing:
                self._log.warning("probe-sidecar: windows are scored again, after %d failed",
                                  self._failing)
                self._failing = 0
            parts: list[Rows] = []
            for i, step in enumerate(range(window.first_step, window.first_step + window.steps)):
                entry = self._steps.get(step)
                if entry is None:
                    continue
                rows = entry.rows
                ok = window.error is None
                if ok and int(window.num_rows[i]) != len(rows.request_ids):
                    self.stats["rows_mismatched"] += 1
                    self._log.error("probe-sidecar: step %d wrote %d rows, the engine scheduled "
                                    "%d", step, int(window.num_rows[i]), len(rows.request_ids))
                    ok = False
                sampled = np.flatnonzero(rows.sampled)
                if not ok:
                    table.mark_incomplete(entry.keys[sampled])
                    self.stats["rows_lost"] += len(sampled)
                elif len(sampled):
                    parts.append(Rows(entry.keys[sampled], rows.positions[sampled],
                                      window.scores[i, sampled], window.fired[i, sampled]))
                entry.taps_left -= 1
                if entry.taps_left == 0:
                    del self._steps[step]
            committed = table.add(Rows.join(parts, len(table.probes)), self._ends)
            self._records_of(probe_set, committed, records)
            self.stats["rows_delivered"] += len(committed)
            self._delivered[probe_set] = max(self._delivered[probe_set],
                                             window.first_step + window.steps)
            finished = self._finalize_ready(records)
            self._queue_locked(records)
            self._results.notify_all()
        self._emit(records, finished)

    def _maybe_recover(self, error: Exception) -> None:
        """A window failed because the sidecar is gone (UNAVAILABLE) or was restarted (NOT_FOUND:
        the session, or a probe set not loaded yet): recover() is tried on a thread of its own,
        at most once per RECOVER_EVERY_S, so that the next windows are scored again."""
        code = getattr(error, "code", None)
        recover = self._recover
        if recover is None or getattr(code, "name", "") not in ("UNAVAILABLE", "NOT_FOUND"):
            return
        now = time.monotonic()
        if now - self._recovered_at < RECOVER_EVERY_S or not self._recovering.acquire(False):
            return
        self._recovered_at = now

        def attempt() -> None:
            try:
                if recover():
                    self.stats["recoveries"] += 1
                    self._log.warning("probe-sidecar: bound to the sidecar again; windows are "
                                      "scored from the next one")
            except Exception as failure:  # noqa: BLE001 (tried again at the next failed window)
                self._log.info("probe-sidecar: the sidecar is not back yet: %s", failure)
            finally:
                self._recovering.release()

        threading.Thread(target=attempt, daemon=True, name="probe-sidecar-vllm-recover").start()

    def _records_of(self, probe_set: str, rows: Rows, out: list[ProbeRecord]) -> None:
        """(under _results) ProbeRecords of committed rows, when a sink takes them."""
        if not self._wants_records:
            return
        for k, position, scores, fired in zip(rows.keys.tolist(), rows.positions.tolist(),
                                              rows.scores, rows.fired):
            out.append(ProbeRecord(self._ids[k], position, probe_set, scores, fired))

    def _emit(self, records: list[ProbeRecord], finished: Finished) -> None:
        """Records and finished requests to the sinks' thread (never blocks)."""
        if self._sink_queue is None or not (records or finished):
            return
        try:
            self._sink_queue.put_nowait((records, finished))
        except queue.Full:
            with self._results:
                self.stats["sink_dropped_records"] += len(records)
                self.stats["sink_dropped_requests"] += len(finished)
                first = self.stats["sink_dropped_batches"] == 0
                self.stats["sink_dropped_batches"] += 1
            if first:
                self._log.warning("probe-sidecar: the record and request sinks (callback, jsonl) "
                                  "fall behind; what they miss is counted in state()")

    def _sink_loop(self, sinks: queue.Queue[_SinkBatch | None]) -> None:
        while True:
            item = sinks.get()
            if item is None:
                return
            self._deliver_to_sinks(*item)

    def _deliver_to_sinks(self, records: list[ProbeRecord], finished: Finished) -> None:
        for record in records:
            if self._jsonl is not None:
                self._jsonl.fired(record)
            if self._on_record is not None:
                try:
                    self._on_record(record)
                except Exception as error:  # a callback's bug must not stop delivery
                    self.stats["callback_errors"] += 1
                    self._log.error("probe-sidecar: the record callback raised %r", error)
        for request_id, summaries in finished:
            if self._jsonl is not None:
                self._jsonl.request(request_id, summaries)
            if self._on_request is not None:
                try:
                    self._on_request(request_id, summaries)
                except Exception as error:
                    self.stats["callback_errors"] += 1
                    self._log.error("probe-sidecar: the request callback raised %r", error)

    def _finalize_ready(self, records: list[ProbeRecord]) -> Finished:
        """(under _results) Requests whose rows are all delivered: their held rows committed (to
        `records`), summaries made, keys freed."""
        delivered = min(self._delivered.values(), default=0)
        ready = [r for r, step in self._finishing.items() if step <= delivered]
        finished: Finished = []
        for request_id in ready:
            del self._finishing[request_id]
            key = self._keys.pop(request_id, None)
            summaries: dict[str, ProbeSummary] = {}
            for name, table in self._tables.items():
                summaries[name], last = table.release(key, self._ends)
                self.stats["rows_delivered"] += len(last)
                self._records_of(name, last, records)
            if key is not None:
                self._ends[key] = -1
                self._ids[key] = None
                self._free_keys.append(key)
                self._last_ids = None  # a cached batch may no longer name live keys
            self._done[request_id] = summaries
            self._done_at[request_id] = time.monotonic()
            self._evict_locked()
            finished.append((request_id, summaries))
        return finished

    def _evict_locked(self) -> None:
        """(under _results) Summaries never collected go, oldest first: past max_finished of
        them, or max_finished_s after they were made."""
        now = time.monotonic()
        while self._done:
            oldest = next(iter(self._done))
            if len(self._done) <= self._max_finished and (
                    self._max_finished_s is None
                    or now - self._done_at[oldest] <= self._max_finished_s):
                break
            del self._done[oldest], self._done_at[oldest]
            self.stats["summaries_evicted"] += 1

    def _take_locked(self, request_id: str) -> dict[str, ProbeSummary]:
        self._done_at.pop(request_id, None)
        return self._done.pop(request_id)

    def take(self, wanted: Callable[[str], bool]) -> dict[str, dict[str, ProbeSummary]]:
        """Takes (and forgets) the summaries made so far of the requests `wanted(engine id)`
        names, without flushing or waiting (it runs on the engine's thread: vllm serve's route
        asks again until its own deadline)."""
        with self._results:
            self._evict_locked()
            return {r: self._take_locked(r) for r in list(self._done) if wanted(r)}

    def _queue_locked(self, records: list[ProbeRecord]) -> None:
        """(under _results) Delivered records kept for records(), if asked."""
        limit = self._records.maxlen  # set when records are kept
        if self._keep_records and records and limit is not None:
            dropped = max(0, len(self._records) + len(records) - limit)
            self.stats["records_dropped"] += dropped
            self._records.extend(records)
            self._results.notify_all()

    # --- results --------------------------------------------------------------------------------

    def collect(self, request_ids: Iterable[str] | None = None, timeout: float = 60.0
                ) -> dict[str, dict[str, ProbeSummary]]:
        """Flushes, waits for every window (up to `timeout` seconds: a sidecar that is stopped
        or gone is not waited for longer; what is summarised by then is taken, the rest stays
        for a later collect), then takes (and forgets) the summaries of finished requests: those
        named (by the engine's id, or the caller's id that vLLM extended with "-" and 8
        characters), or all of them."""
        self.flush()
        try:
            self.wait_delivered(timeout)
        except TimeoutError as error:
            self.stats["collects_cut_short"] += 1
            self._log.warning("probe-sidecar: %s; the summaries of those requests come later "
                              "(collect again)", error)
        with self._results:
            self._evict_locked()
            wanted = None if request_ids is None else set(request_ids)
            return {r: self._take_locked(r) for r in list(self._done)
                    if wanted is None or r in wanted or _caller_id(r) in wanted}

    def records(self, timeout: float = 0.0) -> Iterator[ProbeRecord]:
        """Delivered records, oldest first, until none arrives within `timeout` seconds."""
        while True:
            with self._results:
                if not self._records and timeout > 0:
                    self._results.wait_for(lambda: self._records, timeout)
                if not self._records:
                    return
                record = self._records.popleft()
            yield record

    def state(self) -> dict[str, Any]:
        """How much the tap holds (for operators and tests: all zero once idle and collected)."""
        with self._results:
            return {"steps_counted": self._step, "steps_pending": len(self._steps),
                    "requests_live": len(self._live), "requests_finishing": len(self._finishing),
                    "requests_summarised": len(self._done),
                    "requests_accumulating": len(self._keys),
                    "records_queued": len(self._records),
                    "rows_held": sum(t.held_count() for t in self._tables.values()),
                    "rows_past_end": sum(t.rows_past_end for t in self._tables.values()),
                    # where each forward's rows come from: "starts" (follow()) or "armed"
                    "rows_from": "starts" if self._following else "armed",
                    "host": self.host_costs(), **self.stats}

    def close(self, timeout: float = 30.0) -> None:
        if getattr(self, "_closing", None) is not None:
            self._closing.set()
            if self._flusher is not None:
                self._flusher.join(timeout)
        for tap in self.taps.values():
            try:
                tap.close(timeout)
            except Exception as error:
                self._log.error("probe-sidecar: closing the tap of %r failed: %s",
                                tap.probe_set, error)
        sinks, self._sink_queue = getattr(self, "_sink_queue", None), None
        if sinks is not None:  # what the taps delivered last reaches the sinks first
            try:
                sinks.put(None, timeout=timeout)
            except queue.Full:
                pass
            if self._sink_thread is not None:
                self._sink_thread.join(timeout)
        if self._jsonl is not None:
            self._jsonl.close()
        for held in self._holds:
            held.close()
        self._holds = []


def _caller_id(request_id: str) -> str:
    """The id the caller gave: vLLM appends "-" and 8 random characters to make its own."""
    head, sep, tail = request_id.rpartition("-")
    return head if sep and len(tail) == 8 else request_id
