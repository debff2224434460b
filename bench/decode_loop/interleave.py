"""Window-interleaved timing (windowed.py): the arithmetic, in plain Python so that CI checks it
without torch or a GPU.

A measurement of one (batch, K) alternates blocks of the two loops — the baseline (no scoring)
and the scored one — on the same decoder state, every block a whole number of tap windows of K
steps, A B A B ... A. Every step is bracketed by CUDA events on the decode stream. The first
window of every block is not counted: in it the other loop's last window is still being scored
(the sidecar's Score, time-sliced against the decode context, runs after the window closed),
so that the counted windows of both loops are in steady state — a scored window pays for the
previous window's Score, a baseline window pays for nothing. Each scored block is paired with
the mean of the baseline blocks on either side (the sandwich), which cancels a drift that is
linear in time (the cache grows as the decoder advances); kept = baseline time / scored time per
sandwich, and the report gives their median with a bootstrap interval of the median.
"""

from __future__ import annotations

import random
import statistics


def schedule(sandwiches: int) -> list[str]:
    """The blocks in order: "base", "scored", "base", ..., "base" (2 * sandwiches + 1 blocks)."""
    return ["base"] + ["scored", "base"] * sandwiches


def counted_mean_us(step_us: list[float], window: int) -> float:
    """Mean step time of a block's counted windows (all but its first)."""
    counted = step_us[window:]
    if not counted:
        raise ValueError("a block needs at least two windows")
    return sum(counted) / len(counted)


def sandwich_ratios(blocks: list[tuple[str, list[float]]], window: int) -> list[float]:
    """kept per sandwich: mean(base before, base after) / scored, from each block's counted
    windows; `blocks` in schedule order, as (kind, per-step microseconds)."""
    means = [(kind, counted_mean_us(steps, window)) for kind, steps in blocks]
    ratios = []
    for i in range(1, len(means) - 1):
        kind, scored = means[i]
        if kind != "scored":
            continue
        (before_kind, before), (after_kind, after) = means[i - 1], means[i + 1]
        if before_kind != "base" or after_kind != "base":
            raise ValueError("a scored block must sit between two baseline blocks")
        ratios.append((before + after) / 2 / scored)
    return ratios


def median_interval(values: list[float], *, reps: int = 2000, seed: int = 0,
                    level: float = 0.95) -> tuple[float, list[float]]:
    """(median, [lo, hi]): the median and a bootstrap percentile interval of the median."""
    if not values:
        raise ValueError("no values")
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(reps))
    tail = (1 - level) / 2
    lo = medians[int(tail * (reps - 1))]
    hi = medians[int(round((1 - tail) * (reps - 1)))]
    return statistics.median(values), [lo, hi]


def by_position(blocks: list[tuple[str, list[float]]], window: int, kind: str) -> list[float]:
    """Median step time at each position of a window (0 .. K-1) over the counted windows of the
    blocks of `kind`: where in a window a cost lands (position 0 follows the window close)."""
    columns: list[list[float]] = [[] for _ in range(window)]
    for k, steps in blocks:
        if k != kind:
            continue
        for i, us in enumerate(steps[window:]):
            columns[i % window].append(us)
    return [statistics.median(c) if c else float("nan") for c in columns]


def decompose(blocks: list[tuple[str, list[float]]], window: int) -> dict:
    """Where a scored window's extra time goes, in microseconds per window, from the per-position
    medians: `steady` — K times the extra time of a step in the window's second half (the write
    in the step, anything else paid every step); `after_close` — the extra time of the other
    steps beyond that (the window's close and its Score, time-sliced against the decode steps
    that follow it); `total` — the two together, against the baseline's same positions."""
    base, scored = by_position(blocks, window, "base"), by_position(blocks, window, "scored")
    extra = [s - b for s, b in zip(scored, base)]
    half = extra[window // 2:]
    steady = statistics.median(half) if half else 0.0
    return {"steady_us_per_step": round(steady, 3),
            "steady_us_per_window": round(steady * window, 2),
            "after_close_us_per_window": round(sum(e - steady for e in extra), 2),
            "total_us_per_window": round(sum(extra), 2),
            "extra_us_by_position": [round(e, 2) for e in extra]}
