"""What the vLLM plugin delivers: a record per scored row, a summary per request and probe set,
and the JSONL sink of fired events and finished requests."""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from typing import Any

import numpy as np


@dataclasses.dataclass(frozen=True)
class ProbeRecord:
    """One scored row: the hidden state at `position` of request `request_id` (the row the token
    at position + 1 was sampled from), scored by every probe of `probe_set` — the tap's name: the
    probe set, or "<probe set>@<layer>" when the plugin taps several layers."""

    request_id: str  # the engine's request id (vLLM adds "-" and 8 characters to the caller's id)
    position: int
    probe_set: str
    scores: np.ndarray  # float32 [P], after bias and activation
    fired: np.ndarray  # bool [P]: a finite score at or above its probe's threshold


@dataclasses.dataclass(frozen=True)
class ProbeSummary:
    """One probe set's findings over one request's scored rows."""

    probe_set: str
    probes: tuple[str, ...]
    rows: int  # positions scored
    max_score: tuple[float, ...]  # per probe, over its finite scores (NaN: none)
    first_fired: tuple[int | None, ...]  # per probe, the first position where it fired
    complete: bool = True  # False when a window holding some of the request's rows failed

    def to_dict(self) -> dict[str, Any]:
        """As JSON: NaN max scores are null."""
        return {"probe_set": self.probe_set, "probes": list(self.probes), "rows": self.rows,
                "max_score": [None if math.isnan(v) else v for v in self.max_score],
                "first_fired": list(self.first_fired), "complete": self.complete}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "ProbeSummary":
        return cls(data["probe_set"], tuple(data["probes"]), data["rows"],
                   tuple(math.nan if v is None else v for v in data["max_score"]),
                   tuple(data["first_fired"]), data["complete"])


class JsonlSink:
    """Appends one JSON object per line: `fired` (a probe fired at a position) and `request` (a
    request finished and every window holding its rows was delivered: its summary)."""

    def __init__(self, path: str, probe_names: dict[str, tuple[str, ...]]):
        self._names = probe_names
        self._file = open(path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 (closed below)
        self._lock = threading.Lock()

    def fired(self, record: ProbeRecord) -> None:
        if not record.fired.any():
            return
        now = time.time()
        names = self._names[record.probe_set]
        lines = []
        for probe in np.flatnonzero(record.fired):
            lines.append(json.dumps({"event": "fired", "time": now,
                                     "request_id": record.request_id,
                                     "position": record.position, "probe_set": record.probe_set,
                                     "probe": names[probe], "probe_index": int(probe),
                                     "score": float(record.scores[probe])}))
        self._write(lines)

    def request(self, request_id: str, summaries: dict[str, ProbeSummary]) -> None:
        self._write([json.dumps({"event": "request", "time": time.time(),
                                 "request_id": request_id,
                                 "probe_sets": {name: s.to_dict()
                                                for name, s in summaries.items()}})])

    def _write(self, lines: list[str]) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.write("".join(line + "\n" for line in lines))

    def close(self) -> None:
        with self._lock:
            self._file.close()
