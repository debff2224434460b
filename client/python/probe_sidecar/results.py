"""What the server answers, as Python values: a loaded probe set (ProbeSetInfo) and a Score's
scores (ScoreResult, score_result). Imports only the bottom module precision."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from probesidecar.v1 import probes_pb2, score_pb2

from .precision import precision_name

class ProbeSetInfo:
    """A loaded probe set (probesidecar.v1.ProbeSetInfo, in ``proto``), with ``precision`` as
    "exact" or "fast"."""

    __slots__ = ("proto",)

    def __init__(self, proto: probes_pb2.ProbeSetInfo):
        self.proto = proto

    @property
    def name(self) -> str:
        return self.proto.name

    @property
    def num_probes(self) -> int:
        return self.proto.num_probes

    @property
    def hidden_size(self) -> int:
        return self.proto.hidden_size

    @property
    def weight_dtype(self) -> int:
        return self.proto.weight_dtype

    @property
    def activation(self) -> int:
        return self.proto.activation

    @property
    def probes(self) -> Sequence[probes_pb2.Probe]:
        """Name and threshold of each probe (``threshold`` unset: it never fires)."""
        return self.proto.probes

    @property
    def source(self) -> str:
        return self.proto.source

    @property
    def file_bytes(self) -> int:
        return self.proto.file_bytes

    @property
    def precision(self) -> str:
        return precision_name(self.proto.precision)

    @property
    def score_bucket_bounds(self) -> list[float]:
        """Upper bounds of the buckets of its score histograms (one more bucket above the last)."""
        return list(self.proto.score_bucket_bounds)

    @property
    def outcomes(self) -> probes_pb2.ProbeOutcomes:
        """What its probes found since it was loaded, every session together: rows_scored, and
        arrays over its probes (fired, non_finite, score_sum; bucket_counts [P, buckets]
        row-major); ``outcomes_by_labels`` in ``proto`` splits them by session labels."""
        return self.proto.outcomes

    def __repr__(self) -> str:
        return (f"ProbeSetInfo(name={self.proto.name!r}, num_probes={self.proto.num_probes}, "
                f"hidden_size={self.proto.hidden_size}, precision={self.precision!r})")


@dataclasses.dataclass(frozen=True)
class ScoreResult:
    scores: np.ndarray  # float32 [R, P], after bias and activation
    fired: np.ndarray  # bool [R, P]: a finite score >= the probe's threshold
    kernel_path: str  # "cpu", "fused_cuda", ...
    request_id: int = 0
    non_finite: int = 0  # scores that are NaN or infinite (they never fire)
    precision: str = ""  # the probe set's: "exact" or "fast"


def score_result(response: score_pb2.ScoreResponse) -> ScoreResult:
    """The ScoreResult of a ScoreResponse whose scores came back inline."""
    rows, probes = response.num_rows, response.num_probes
    scores = np.frombuffer(response.scores, dtype="<f4")
    scores = scores.reshape(rows, probes) if scores.size else np.empty((0, probes), np.float32)
    fired = np.zeros(rows * probes, dtype=bool)
    fired[np.asarray(response.fired, dtype=np.int64)] = True
    return ScoreResult(scores, fired.reshape(rows, probes), response.kernel_path, response.request_id,
                       response.non_finite_scores, precision_name(response.precision))


__all__ = ["ProbeSetInfo", "ScoreResult", "score_result"]
