"""How a worker spends its time: how many steps and repeats fit what is left, and the order in
which the variants take turns. Plain Python (tests/python checks it without torch)."""

from __future__ import annotations

RUN_OVERHEAD_S = 0.05  # per timed run, besides its steps: events, history copies, the check


def plan(warm: dict, impls: list, steps: int, reps: int, available_s: float,
         multiple: int = 8):
    """(steps, repeats) that fit `available_s`, from the warm-up runs' seconds per step: keep the
    steps and drop repeats first (down to one), then shorten the runs to a multiple of `multiple`
    steps (8, or the largest tap window: runs then end on a window's end); fewer than 8 steps
    means: no time for this mode."""
    per_step = sum(warm.get(impl, max(warm.values())) for impl in impls)
    per_round = lambda n: n * per_step + RUN_OVERHEAD_S * len(impls)  # noqa: E731
    while reps > 1 and reps * per_round(steps) > available_s:
        reps -= 1
    if per_round(steps) > available_s:
        steps = int((available_s - RUN_OVERHEAD_S * len(impls)) / per_step) // multiple * multiple
    return steps, reps


def rotate(items: list, k: int) -> list:
    """Interleaving: every repeat runs every variant, each time from a different position."""
    k %= len(items)
    return items[k:] + items[:k]
