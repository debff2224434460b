"""What the server answers, as Python values: a loaded probe set (ProbeSetInfo) and a Score's
scores (ScoreResult, score_result). Imports only the bottom module precision."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import NoReturn

import numpy as np

from probesidecar.v1 import probes_pb2, score_pb2

from .precision import precision_name

# ProbeSetInfo's fields read from its proto as they are.
_FROM_PROTO = ("name", "num_probes", "hidden_size", "weight_dtype", "activation", "probes",
               "source", "file_bytes", "outcomes")


class ProbeSetInfo:
    """A loaded probe set, read-only: the fields of its probesidecar.v1.ProbeSetInfo (in ``proto``),
    with ``precision`` as "exact" or "fast" ("" from a server that predates precision).

    probes: name and threshold of each probe (``threshold`` unset: it never fires).
    score_bucket_bounds: upper bounds of the buckets of its score histograms (one more bucket
        above the last).
    outcomes: what its probes found since it was loaded, every session together: rows_scored,
        and arrays over its probes (fired, non_finite, score_sum; bucket_counts [P, buckets]
        row-major); ``outcomes_by_labels`` in ``proto`` splits them by session labels.
    outcomes_counted: whether they are counted (False: ``outcomes`` stays empty).
    """

    __slots__ = ("proto", *_FROM_PROTO, "precision", "score_bucket_bounds", "outcomes_counted")
    proto: probes_pb2.ProbeSetInfo
    name: str
    num_probes: int
    hidden_size: int
    weight_dtype: int  # probesidecar.v1.DType
    activation: int  # probesidecar.v1.Activation
    probes: Sequence[probes_pb2.Probe]
    source: str
    file_bytes: int
    precision: str
    score_bucket_bounds: list[float]
    outcomes: probes_pb2.ProbeOutcomes
    outcomes_counted: bool

    def __init__(self, proto: probes_pb2.ProbeSetInfo):
        fields = {name: getattr(proto, name) for name in _FROM_PROTO}
        fields.update(proto=proto, precision=precision_name(proto.precision),
                      score_bucket_bounds=list(proto.score_bucket_bounds),
                      # UNSPECIFIED: a server that predates the choice, which counted every set
                      outcomes_counted=proto.outcome_counting != probes_pb2.OUTCOME_COUNTING_OFF)
        for name, value in fields.items():
            object.__setattr__(self, name, value)

    def __setattr__(self, name: str, value: object) -> NoReturn:
        raise AttributeError(f"a ProbeSetInfo is read-only: cannot set {name!r}")

    # copy and pickle: made again from the proto
    def __reduce__(self) -> tuple[type[ProbeSetInfo], tuple[probes_pb2.ProbeSetInfo]]:
        return ProbeSetInfo, (self.proto,)

    def __repr__(self) -> str:
        return (f"ProbeSetInfo(name={self.name!r}, num_probes={self.num_probes}, "
                f"hidden_size={self.hidden_size}, precision={self.precision!r})")


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
