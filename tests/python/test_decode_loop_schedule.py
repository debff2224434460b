"""How the decode-loop benchmark's worker fits its runs into its time (bench/decode_loop/
schedule.py). No torch, no GPU."""

from __future__ import annotations

import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench" / "decode_loop"))
from schedule import RUN_OVERHEAD_S, plan, rotate  # noqa: E402

IMPLS = ["none", "in_process", "sidecar_sync", "sidecar_async"]
WARM = {"none": 0.001, "in_process": 0.001, "sidecar_sync": 0.0015, "sidecar_async": 0.001}
ROUND_S = 128 * 0.0045 + RUN_OVERHEAD_S * 4  # one run of every variant, 128 steps


def test_enough_time_keeps_steps_and_repeats():
    assert plan(WARM, IMPLS, 128, 5, 5 * ROUND_S + 0.01) == (128, 5)


def test_repeats_go_first():
    assert plan(WARM, IMPLS, 128, 5, 3 * ROUND_S + 0.01) == (128, 3)
    assert plan(WARM, IMPLS, 128, 5, ROUND_S + 0.01) == (128, 1)


def test_then_runs_shorten_to_a_multiple_of_8():
    steps, reps = plan(WARM, IMPLS, 128, 5, 0.5 * ROUND_S)
    assert reps == 1 and steps % 8 == 0 and 8 <= steps < 128
    assert steps * 0.0045 + RUN_OVERHEAD_S * 4 <= 0.5 * ROUND_S


def test_no_time_means_fewer_than_8_steps():
    assert plan(WARM, IMPLS, 128, 5, 0.01)[0] < 8
    assert plan(WARM, IMPLS, 128, 5, -3.0)[0] < 8


def test_a_variant_without_a_warm_up_time_counts_as_the_slowest():
    assert plan({"none": 0.001, "sidecar_sync": 0.01}, ["none", "sidecar_sync", "other"], 100, 1,
                100 * 0.021 + 3 * RUN_OVERHEAD_S + 0.01) == (100, 1)


def test_every_repeat_starts_from_another_variant():
    orders = [rotate(IMPLS, k) for k in range(len(IMPLS))]
    assert [order[0] for order in orders] == IMPLS
    assert all(sorted(order) == sorted(IMPLS) for order in orders)
    assert rotate(IMPLS, len(IMPLS) + 1) == orders[1]
