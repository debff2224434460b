"""A probe set's precision (docs/architecture.md, "Probe set precision"): "exact" (the file's
float32 weights, float32 math) or "fast" (weights rounded to the activations' 16-bit type on
tensor cores). None asks LoadProbeSet for the default rule (exact up to 2 probes, fast above).
A bottom module: it imports nothing else of the package."""

from __future__ import annotations

from probesidecar.v1 import probes_pb2

PRECISIONS: dict[str | None, int] = {None: probes_pb2.PRECISION_UNSPECIFIED,
                                     "exact": probes_pb2.PRECISION_EXACT,
                                     "fast": probes_pb2.PRECISION_FAST}


def precision_name(value: int) -> str:
    """"exact" or "fast" for a Precision enum value; "" for PRECISION_UNSPECIFIED (a server that
    predates precision)."""
    for name, number in PRECISIONS.items():
        if name is not None and number == value:
            return name
    return ""


def precision_value(precision: str | None) -> int:
    """The Precision enum value for None (the default rule), "exact" or "fast"."""
    try:
        return PRECISIONS[precision]
    except (KeyError, TypeError):
        raise ValueError(f"precision must be None, 'exact' or 'fast', got {precision!r}") from None


__all__ = ["PRECISIONS", "precision_name", "precision_value"]
