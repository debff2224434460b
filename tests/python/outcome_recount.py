"""What the server's probe-outcome counters must hold, recounted on the host from every score a
client got back: rows, and per probe fired, non-finite and the histogram of the finite scores over
the set's bucket bounds, with the server's semantics (NaN/Inf: non-finite only; fired: finite and
>= the threshold; bucket b: bounds[b-1] < s <= bounds[b] in float32, the last above every bound)."""

from __future__ import annotations

import dataclasses

import numpy as np


@dataclasses.dataclass
class Recount:
    thresholds: np.ndarray  # float32 [P], NaN: none
    bounds: np.ndarray  # float32 [B]
    rows: int = 0
    fired: np.ndarray | None = None  # [P]
    non_finite: np.ndarray | None = None  # [P]
    buckets: np.ndarray | None = None  # [P, B + 1], not cumulative
    score_sum: np.ndarray | None = None  # [P] float64

    @classmethod
    def for_set(cls, info) -> "Recount":
        """`info`: a probe_sidecar ProbeSetInfo (thresholds and bounds as the server has them)."""
        thresholds = np.array([p.threshold if p.HasField("threshold") else np.nan
                               for p in info.probes], dtype=np.float32)
        bounds = np.array(info.score_bucket_bounds, dtype=np.float32)
        p, b = len(thresholds), len(bounds)
        return cls(thresholds, bounds, 0, np.zeros(p, np.int64), np.zeros(p, np.int64),
                   np.zeros((p, b + 1), np.int64), np.zeros(p, np.float64))

    def add(self, scores: np.ndarray) -> None:
        """Counts the scores [R, P] (float32) of one response."""
        scores = np.asarray(scores, dtype=np.float32)
        finite = np.isfinite(scores)
        self.rows += scores.shape[0]
        self.non_finite += (~finite).sum(axis=0)
        with np.errstate(invalid="ignore"):
            self.fired += (finite & (scores >= self.thresholds[None, :])).sum(axis=0)
        self.score_sum += np.where(finite, scores, 0).astype(np.float64).sum(axis=0)
        # searchsorted(side="left") is the first bound >= s: Prometheus' le.
        index = np.searchsorted(self.bounds, np.where(finite, scores, 0), side="left")
        for p in range(scores.shape[1]):
            np.add.at(self.buckets[p], index[finite[:, p], p], 1)

    def merged(self) -> "Recount":
        """Every probe as one (a set past --max-probe-labels: probe="_all")."""
        return Recount(self.thresholds, self.bounds, self.rows * len(self.thresholds),
                       np.array([self.fired.sum()]), np.array([self.non_finite.sum()]),
                       self.buckets.sum(axis=0, keepdims=True),
                       np.array([self.score_sum.sum()]))


def assert_matches_proto(recount: Recount, outcomes, what: str) -> None:
    """`outcomes`: a probesidecar.v1.ProbeOutcomes (ListProbeSets)."""
    assert outcomes.rows_scored == recount.rows, (what, outcomes.rows_scored, recount.rows)
    assert list(outcomes.fired) == list(recount.fired), what
    assert list(outcomes.non_finite) == list(recount.non_finite), what
    assert list(outcomes.bucket_counts) == recount.buckets.reshape(-1).tolist(), what
    np.testing.assert_allclose(np.array(outcomes.score_sum), recount.score_sum, rtol=1e-4,
                               atol=1e-4, err_msg=str(what))
