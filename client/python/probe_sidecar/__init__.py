"""Probe Sidecar client: score LLM hidden states with linear probes over gRPC.

    from probe_sidecar import Client
    with Client("unix:///tmp/probe-sidecar.sock") as client:
        result = client.score(hidden_states, rows, "demo")   # numpy [T, H], rows [R]
        result.scores                                         # float32 [R, P]
"""

from .client import DEFAULT_TARGET, Client, score_request
from .errors import ProbeSidecarError
from .results import ProbeSetInfo, ScoreResult

__all__ = ["Client", "DEFAULT_TARGET", "ProbeSetInfo", "ProbeSidecarError", "ScoreResult",
           "score_request"]
__version__ = "0.1.0"
