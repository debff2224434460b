"""Per-request summaries of one tap, kept in arrays indexed by a small integer per request, so that
a window of K steps x max_batch rows is folded in with a few array operations: the delivery
thread shares the engine's process (and its interpreter lock) with vLLM's step loop, and a Python
loop over every row of a window would take the step loop's time.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from .records import ProbeSummary

NEVER = np.iinfo(np.int64).max


@dataclasses.dataclass
class Rows:
    """Rows of requests, by request key: keys int64 [n], positions int64 [n], scores float32
    [n, P], fired bool [n, P]."""

    keys: np.ndarray
    positions: np.ndarray
    scores: np.ndarray
    fired: np.ndarray

    @classmethod
    def empty(cls, probes: int) -> "Rows":
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64),
                   np.zeros((0, probes), np.float32), np.zeros((0, probes), bool))

    def __len__(self) -> int:
        return len(self.keys)

    def take(self, mask: np.ndarray | list[int]) -> "Rows":
        """The rows that `mask` (booleans, or indices) selects."""
        return Rows(self.keys[mask], self.positions[mask], self.scores[mask], self.fired[mask])

    @classmethod
    def join(cls, parts: list["Rows"], probes: int) -> "Rows":
        parts = [p for p in parts if len(p)]
        if not parts:
            return cls.empty(probes)
        if len(parts) == 1:
            return parts[0]
        return cls(*(np.concatenate([getattr(p, f) for p in parts])
                     for f in ("keys", "positions", "scores", "fired")))


class SummaryTable:
    """One tap's accumulators: rows scored, max score and first firing position per probe, and
    whether every window held scores, per request key. With `hold_last_row`, each request's
    newest row is held back until a later row of it arrives or its end is known (an engine with
    asynchronous scheduling runs one forward past a request's stop token). `ends[key]`: the
    request's length (prompt + generated tokens) once known, else -1; rows past length - 2 are
    dropped (they sampled tokens the caller never got)."""

    def __init__(self, probe_set: str, probes: tuple[str, ...], hold_last_row: bool,
                 capacity: int = 64):
        self.probe_set, self.probes, self.hold_last_row = probe_set, probes, hold_last_row
        self.rows_past_end = 0
        p = len(probes)
        self.rows = np.zeros(capacity, np.int64)
        self.max = np.full((capacity, p), -np.inf, np.float32)
        self.first = np.full((capacity, p), NEVER, np.int64)
        self.complete = np.ones(capacity, bool)
        self.held = np.zeros(capacity, bool)
        self.held_rows = Rows(np.zeros(capacity, np.int64), np.zeros(capacity, np.int64),
                              np.zeros((capacity, p), np.float32),
                              np.zeros((capacity, p), bool))

    def _fit(self, keys: np.ndarray) -> None:
        need = int(keys.max()) + 1 if len(keys) else 0
        size = len(self.rows)
        if need <= size:
            return
        grow = max(need, 2 * size) - size
        self.rows = np.concatenate([self.rows, np.zeros(grow, np.int64)])
        self.max = np.concatenate([self.max, np.full((grow, self.max.shape[1]), -np.inf,
                                                     np.float32)])
        self.first = np.concatenate([self.first, np.full((grow, self.first.shape[1]), NEVER,
                                                         np.int64)])
        self.complete = np.concatenate([self.complete, np.ones(grow, bool)])
        self.held = np.concatenate([self.held, np.zeros(grow, bool)])
        h = self.held_rows
        self.held_rows = Rows(np.concatenate([h.keys, np.zeros(grow, np.int64)]),
                              np.concatenate([h.positions, np.zeros(grow, np.int64)]),
                              np.concatenate([h.scores, np.zeros((grow, h.scores.shape[1]),
                                                                 np.float32)]),
                              np.concatenate([h.fired, np.zeros((grow, h.fired.shape[1]),
                                                                bool)]))

    def add(self, rows: Rows, ends: np.ndarray) -> Rows:
        """Folds in a window's delivered rows (in step order); returns the rows committed now
        (a request's previously held row first), for whoever wants records."""
        if not len(rows):
            return rows
        self._fit(rows.keys)
        committed = []
        if self.hold_last_row:
            n = len(rows)
            seen, from_end = np.unique(rows.keys[::-1], return_index=True)
            newest = np.zeros(n, bool)
            newest[n - 1 - from_end] = True
            hold = newest & (ends[rows.keys] < 0)
            earlier = seen[self.held[seen]]  # their held rows are not their last
            if len(earlier):
                committed.append(self.held_rows.take(earlier))
                self.held[earlier] = False
            held = rows.take(hold)
            if len(held):
                h = self.held_rows
                h.keys[held.keys], h.positions[held.keys] = held.keys, held.positions
                h.scores[held.keys], h.fired[held.keys] = held.scores, held.fired
                self.held[held.keys] = True
            rows = rows.take(~hold)
        committed.append(rows)
        return self._commit(Rows.join(committed, len(self.probes)), ends)

    def _commit(self, rows: Rows, ends: np.ndarray) -> Rows:
        if not len(rows):
            return rows
        end = ends[rows.keys]
        past = (end >= 0) & (rows.positions > end - 2)
        if past.any():
            self.rows_past_end += int(past.sum())
            rows = rows.take(~past)
        np.add.at(self.rows, rows.keys, 1)
        np.maximum.at(self.max, rows.keys,
                      np.where(np.isfinite(rows.scores), rows.scores, -np.inf))
        np.minimum.at(self.first, rows.keys,
                      np.where(rows.fired, rows.positions[:, None], NEVER))
        return rows

    def mark_incomplete(self, keys: np.ndarray) -> None:
        """A window holding these requests' rows failed."""
        if len(keys):
            self._fit(keys)
            self.complete[keys] = False

    def release(self, key: int | None, ends: np.ndarray) -> tuple[ProbeSummary, Rows]:
        """The request's summary (its held row committed or dropped by its end), and the row
        committed now; the key's accumulators are reset for reuse."""
        if key is None or key >= len(self.rows):  # a request with no row written
            return ProbeSummary(self.probe_set, self.probes, 0, (math.nan,) * len(self.probes),
                                (None,) * len(self.probes), True), Rows.empty(len(self.probes))
        last = Rows.empty(len(self.probes))
        if self.held[key]:
            self.held[key] = False
            last = self._commit(self.held_rows.take([key]), ends)
        summary = ProbeSummary(
            self.probe_set, self.probes, int(self.rows[key]),
            tuple(float(v) if np.isfinite(v) else math.nan for v in self.max[key]),
            tuple(None if v == NEVER else int(v) for v in self.first[key]),
            bool(self.complete[key]))
        self.rows[key] = 0
        self.max[key] = -np.inf
        self.first[key] = NEVER
        self.complete[key] = True
        return summary, last

    def held_count(self) -> int:
        return int(self.held.sum())
