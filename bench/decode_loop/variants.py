"""One timed run of the decode loop with one way of scoring the hidden state of every sequence
at every step:

  none                 no scoring
  in_process           `h @ W.T + b` on the decode stream, inside the step (a ProbeX-style tap;
                       captured in the graph in graph mode)
  sidecar_sync         TorchClient.score (v1): host sync, then a unary Score, every step
  sidecar_async        TorchClient.score_async: GPU-side ordering through IPC events, rows and
                       scores in registered device buffers; the stream waits for step t's scores
                       only before step t + 2 overwrites the hidden-state slot they were read from
  sidecar_async_ring1  the same with one slot: the stream waits for step t's scores before step
                       t + 1 (an extra, to show what the second slot buys; graph mode only)

Timing: a CUDA event is recorded on the decode stream at every step boundary; step t's time is
the interval between its two events and tokens/s is batch x steps over the first-to-last
interval. The host never waits for the GPU inside the loop, except where the variant itself
does (sidecar_sync). Scores of some steps are copied, on the GPU, into a history and compared
after the run with float64 scores of the same hidden states.
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

IMPLS = ("none", "in_process", "sidecar_sync", "sidecar_async")
RING1 = "sidecar_async_ring1"
# Relative error bounds (||got - ref|| / ||ref||, ref = float64 of the same bf16 inputs): the
# sidecar accumulates in fp32 and writes fp32; the in-process tap writes bf16 (8 bits of
# mantissa, so about 2e-3 of rounding).
SIDECAR_TOL = 1e-3
IN_PROCESS_TOL = 1e-2


@dataclasses.dataclass
class Scoring:
    """What every variant of one batch shares: the probe weights, the buffers and the client."""

    weight: torch.Tensor  # [P, H] bf16
    bias: torch.Tensor  # [P] bf16
    probe_set: str
    rows: torch.Tensor  # [B] int32, on the device: 0..B-1 (every sequence's hidden state)
    rows_host: list  # the same rows for the v1 call
    out: torch.Tensor  # [ring, B, P] float32: where the sidecar writes (registered)
    local: torch.Tensor  # [ring, B, P] bf16: where the in-process tap writes
    client: object  # TorchClient (or the CPU dry run's stand-in)

    def tap(self, hidden: torch.Tensor):
        """The in-process probe hook: scores hidden[slot] into local[slot], on the same stream."""
        weight_t = self.weight.t()

        def run(slot: int) -> None:
            torch.addmm(self.bias, hidden[slot], weight_t, out=self.local[slot])

        return run


class Stepper:
    """Advances the decoder by one step: a graph replay (graph mode) or the eager forward."""

    def __init__(self, decoder, mode: str, graphs: dict | None, tap):
        self.decoder, self.mode, self.graphs, self.tap = decoder, mode, graphs, tap

    def __call__(self, slot: int, tapped: bool) -> None:
        if self.mode == "graph":
            self.graphs[tapped][slot].replay()
        else:
            self.decoder.step(slot, self.tap if tapped else None)


def check_steps(steps: int, count: int = 8) -> list[int]:
    """The steps whose scores are checked: `count` of them spread over the run, the last one
    included."""
    every = max(1, steps // count)
    return list(range(every - 1, steps, every))


def timed_run(impl: str, steps: int, stepper: Stepper, scoring: Scoring, device) -> dict:
    """Runs `steps` decode steps with `impl` from the decoder's reset state; returns the raw
    measurements (a JSON-ready dict)."""
    decoder = stepper.decoder
    hidden = decoder.hidden
    ring = 1 if impl == RING1 else hidden.shape[0]
    asynchronous = impl in ("sidecar_async", RING1)
    checks = check_steps(steps) if impl != "none" else []
    index = {t: k for k, t in enumerate(checks)}
    history_hidden = torch.empty((len(checks),) + tuple(hidden.shape[1:]), dtype=hidden.dtype,
                                 device=hidden.device)
    scores_dtype = scoring.local.dtype if impl == "in_process" else torch.float32
    history_scores = torch.empty((len(checks),) + tuple(scoring.out.shape[1:]), dtype=scores_dtype,
                                 device=hidden.device)
    stream = device.current_stream()
    marks = [device.event() for _ in range(steps + 1)]
    call_us: list[float] = []
    wait_us: list[float] = []
    outstanding: dict[int, object] = {}
    early_reuse = 0

    def settle(t: int) -> None:
        """Step t's scores: the stream waits (on the GPU) until the sidecar has written them and
        read step t's hidden state; then they may be copied, and the slot reused."""
        handle = outstanding.pop(t)
        start = time.perf_counter()
        handle.wait_stream(stream)
        wait_us.append((time.perf_counter() - start) * 1e6)
        if t in index:
            history_scores[index[t]].copy_(scoring.out[t % ring])

    # Every run decodes the same tokens, so scores left from an earlier run would pass the
    # check: poison them first.
    scoring.out.fill_(float("nan"))
    scoring.local.fill_(float("nan"))
    decoder.reset()
    wall_start = time.perf_counter()
    for t in range(steps):
        slot = t % ring
        marks[t].record(stream)
        if asynchronous and t - ring in outstanding:
            settle(t - ring)  # before this step overwrites hidden[slot] and out[slot]
        stepper(slot, tapped=impl == "in_process")
        if t in index:
            history_hidden[index[t]].copy_(hidden[slot])
            if impl == "in_process":
                history_scores[index[t]].copy_(scoring.local[slot])
        if impl == "sidecar_sync":
            start = time.perf_counter()
            scoring.client.score(hidden[slot], scoring.rows_host, scoring.probe_set,
                                 out=scoring.out[slot])
            call_us.append((time.perf_counter() - start) * 1e6)
            if t in index:  # v1 answers once the scores are written
                history_scores[index[t]].copy_(scoring.out[slot])
        elif asynchronous:
            start = time.perf_counter()
            handle = scoring.client.score_async(hidden[slot], scoring.rows, scoring.probe_set,
                                                out=scoring.out[slot], stream=stream)
            call_us.append((time.perf_counter() - start) * 1e6)
            early_reuse += _shares_events(handle, outstanding.values())
            outstanding[t] = handle
    for t in sorted(outstanding):
        settle(t)
    marks[steps].record(stream)
    device.synchronize()
    wall_s = time.perf_counter() - wall_start

    step_us = [marks[t].elapsed_time(marks[t + 1]) * 1e3 for t in range(steps)]
    run = dict(impl=impl, steps=steps, ring=ring if impl != "none" else None,
               total_us=marks[0].elapsed_time(marks[steps]) * 1e3, wall_s=wall_s,
               step_us=[round(x, 2) for x in step_us])
    if call_us:
        run["call_us"] = [round(x, 2) for x in call_us]
    if wait_us:
        run["wait_us"] = [round(x, 2) for x in wait_us]
    if asynchronous:
        run["event_pair_reused_before_wait"] = early_reuse
    if checks:
        run["check"] = _check(history_hidden, history_scores, scoring,
                              IN_PROCESS_TOL if impl == "in_process" else SIDECAR_TOL)
    return run


def _shares_events(handle, outstanding) -> int:
    """1 when the client gave this request the IPC event pair of a request whose scores the
    stream has not waited for yet: the server re-records that pair's done event, so the earlier
    wait waits for this later request instead (correct, but it takes the overlap away). A
    diagnostic that reads the client's private `_pair`; 0 where the client has none."""
    pair = getattr(handle, "_pair", None)
    return int(pair is not None and any(getattr(h, "_pair", None) is pair for h in outstanding))


def _check(history_hidden, history_scores, scoring: Scoring, tolerance: float) -> dict:
    """Relative error of every checked step's scores against float64 scores of the same hidden
    states; NaN (an unwritten or invalid score) fails."""
    ref = torch.addmm(scoring.bias.double(), history_hidden.double().flatten(0, 1),
                      scoring.weight.double().t()).view(history_scores.shape)
    got = history_scores.double()
    errors = [float(torch.linalg.norm(g - r) / torch.linalg.norm(r)) for g, r in zip(got, ref)]
    ok = bool(errors) and all(e <= tolerance for e in errors)  # NaN compares False: fails
    worst = None if any(math.isnan(e) for e in errors) else max(errors, default=None)
    return dict(steps=len(errors), max_rel_err=worst, tolerance=tolerance, ok=ok)
