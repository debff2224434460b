"""One timed run of the decode loop with one way of scoring the hidden state of every sequence
at every step:

  none                 no scoring
  in_process           `h @ W.T + b` on the decode stream, inside the step (a ProbeX-style tap;
                       captured in the graph in graph mode)
  tap_k<K>             the sidecar through a tap (TorchClient.tap): after each step one write
                       of the step's rows into the tap's ring (an eager kernel after the replay),
                       one Score per window of K steps
  tap_k<K>_graph       the same with the write captured inside the step's graph: the loop only
                       counts steps (graph mode only)
  tap_k<K>_host        the same as tap_k<K>, each window sent once its writes have landed (the
                       sidecar's stream never waits on the GPU)
  sidecar_sync         TorchClient.score (v1): host sync, then a unary Score, every step
  sidecar_async        TorchClient.score_async every step: GPU-side ordering through IPC events;
                       the stream waits for step t's scores before step t + 2 overwrites them

Timing: a CUDA event is recorded on the decode stream at every step boundary; step t's time is
the interval between its two events and tokens/s is batch x steps over the first-to-last
interval. The host never waits for the GPU inside the loop, except where the variant itself
does (sidecar_sync). Scores of some steps are compared after the run with float64 scores of the
same hidden states (copied on the GPU into a history at those steps).
"""

from __future__ import annotations

import dataclasses
import math
import re
import time

import torch

DEFAULT = ("none", "in_process", "tap_k1", "tap_k4", "tap_k16", "tap_k64", "tap_k16_graph",
           "tap_k64_graph", "tap_k16_host")
# Relative error bounds (||got - ref|| / ||ref||, ref = float64 of the same bf16 inputs): the
# sidecar accumulates in fp32 and writes fp32; the in-process tap writes bf16 (8 bits of
# mantissa, so about 2e-3 of rounding).
SIDECAR_TOL = 1e-3
IN_PROCESS_TOL = 1e-2
_TAP = re.compile(r"tap_k(?P<window>[1-9][0-9]*)(?:_(?P<kind>graph|host))?$")


@dataclasses.dataclass(frozen=True)
class Variant:
    name: str
    impl: str  # none, in_process, tap, sidecar_sync, sidecar_async
    window: int | None = None  # tap: steps per Score
    tap: str | None = None  # tap: "eager" (write after the replay) or "graph" (write inside it)
    submit: str | None = None  # tap: "gpu" or "host" (TorchClient.tap's submit)

    @property
    def graph_key(self) -> str:
        """Which captured step it replays in graph mode."""
        return self.name if self.tap == "graph" else "in_process" if self.impl == "in_process" \
            else "plain"


def parse(name: str) -> Variant:
    if name in ("none", "in_process", "sidecar_sync", "sidecar_async"):
        return Variant(name, name)
    match = _TAP.match(name)
    if match is None:
        raise ValueError(f"unknown variant {name!r} (none, in_process, sidecar_sync, "
                         "sidecar_async, tap_k<K>, tap_k<K>_graph, tap_k<K>_host)")
    kind = match.group("kind")
    return Variant(name, "tap", int(match.group("window")), "graph" if kind == "graph" else "eager",
                   "host" if kind == "host" else "gpu")


@dataclasses.dataclass
class Scoring:
    """What every variant of one batch shares: the probe weights, the buffers and the client."""

    weight: torch.Tensor  # [P, H] bf16
    bias: torch.Tensor  # [P] bf16
    probe_set: str
    rows: torch.Tensor  # [B] int32, on the device: 0..B-1 (every sequence's hidden state)
    rows_host: list  # the same rows for the v1 call
    out: torch.Tensor  # [2, B, P] float32: where sidecar_async/sync write (registered)
    local: torch.Tensor  # [2, B, P] bf16: where the in-process tap writes
    client: object  # TorchClient (or the CPU dry run's stand-in)
    taps: dict = dataclasses.field(default_factory=dict)  # variant name -> Tap

    def in_process(self, hidden: torch.Tensor):
        """The in-process probe hook: scores hidden[slot] into local[slot], on the same stream."""
        weight_t = self.weight.t()

        def run(slot: int) -> None:
            torch.addmm(self.bias, hidden[slot], weight_t, out=self.local[slot])

        return run


def graph_write(tap, hidden: torch.Tensor, capturing):
    """The hook a graph-captured tap's step is captured with: it writes only while capturing (the
    capture's eager warm-up steps must not advance the tap)."""

    def run(slot: int) -> None:
        if capturing():
            tap.write(hidden[slot])

    return run


class Stepper:
    """Advances the decoder by one step: a graph replay (graph mode) or the eager forward."""

    def __init__(self, decoder, mode: str, graphs: dict | None, in_process):
        self.decoder, self.mode, self.graphs, self.in_process = decoder, mode, graphs, in_process

    def __call__(self, slot: int, variant: Variant) -> None:
        if self.mode == "graph":
            self.graphs[variant.graph_key][slot].replay()
        else:
            self.decoder.step(slot, self.in_process if variant.impl == "in_process" else None)


def check_steps(steps: int, count: int = 8) -> list[int]:
    """The steps whose scores are checked: `count` of them spread over the run, the last one
    included."""
    every = max(1, steps // count)
    return list(range(every - 1, steps, every))


def timed_run(variant: Variant, steps: int, stepper: Stepper, scoring: Scoring, device) -> dict:
    """Runs `steps` decode steps with `variant` from the decoder's reset state; returns the raw
    measurements (a JSON-ready dict)."""
    decoder = stepper.decoder
    hidden = decoder.hidden
    ring = hidden.shape[0]
    checks = check_steps(steps) if variant.impl != "none" else []
    index = {t: k for k, t in enumerate(checks)}
    history_hidden = torch.empty((len(checks),) + tuple(hidden.shape[1:]), dtype=hidden.dtype,
                                 device=hidden.device)
    scores_dtype = scoring.local.dtype if variant.impl == "in_process" else torch.float32
    history_scores = torch.full((len(checks),) + tuple(scoring.out.shape[1:]), float("nan"),
                                dtype=scores_dtype, device=hidden.device)
    stream = device.current_stream()
    marks = [device.event() for _ in range(steps + 1)]
    call_us: list[float] = []  # wall time of the variant's calls on the decode thread
    call_cpu_us: list[float] = []  # CPU time of this thread in them (a wait for the GPU is none)
    outstanding: dict[int, object] = {}
    tap = scoring.taps.get(variant.name)
    first_tap_step = tap.stats.steps if tap is not None else 0

    def settle(t: int) -> None:
        """sidecar_async: step t's scores are waited for (on the GPU) before the slot is reused."""
        handle = outstanding.pop(t)
        handle.wait_stream(stream)
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
        if variant.impl == "sidecar_async" and t - ring in outstanding:
            settle(t - ring)  # before this step overwrites hidden[slot] and out[slot]
        stepper(slot, variant)
        if t in index:
            history_hidden[index[t]].copy_(hidden[slot])
            if variant.impl == "in_process":
                history_scores[index[t]].copy_(scoring.local[slot])
        if tap is not None:
            start, cpu = time.perf_counter(), time.thread_time()
            if variant.tap == "eager":
                tap.write(hidden[slot])
            tap.step()
            call_us.append((time.perf_counter() - start) * 1e6)
            call_cpu_us.append((time.thread_time() - cpu) * 1e6)
        elif variant.impl == "sidecar_sync":
            start = time.perf_counter()
            scoring.client.score(hidden[slot], scoring.rows_host, scoring.probe_set,
                                 out=scoring.out[slot])
            call_us.append((time.perf_counter() - start) * 1e6)
            if t in index:  # v1 answers once the scores are written
                history_scores[index[t]].copy_(scoring.out[slot])
        elif variant.impl == "sidecar_async":
            start = time.perf_counter()
            outstanding[t] = scoring.client.score_async(hidden[slot], scoring.rows,
                                                        scoring.probe_set, out=scoring.out[slot],
                                                        stream=stream)
            call_us.append((time.perf_counter() - start) * 1e6)
    for t in sorted(outstanding):
        settle(t)
    marks[steps].record(stream)
    device.synchronize()
    wall_s = time.perf_counter() - wall_start

    step_us = [marks[t].elapsed_time(marks[t + 1]) * 1e3 for t in range(steps)]
    run = dict(impl=variant.impl, variant=variant.name, window=variant.window, tap=variant.tap,
               submit=variant.submit, steps=steps,
               total_us=marks[0].elapsed_time(marks[steps]) * 1e3, wall_s=wall_s,
               step_us=[round(x, 2) for x in step_us])
    if call_us:
        run["call_us"] = [round(x, 2) for x in call_us]
    if call_cpu_us:
        run["call_cpu_us"] = [round(x, 2) for x in call_cpu_us]
    if tap is not None:
        tap.flush()  # nothing when steps is a multiple of the window
        tap.wait_delivered()
        windows = [w for w in tap.windows() if w.first_step >= first_tap_step]
        # Per window: steps, GPU time from its close to its scores in device memory and in host
        # memory, and host time from step() closing it to delivery (seconds).
        run["windows"] = [[w.steps, w.device_latency_s, w.host_memory_latency_s, w.latency_s]
                          for w in windows]
        run["window_errors"] = [str(w.error) for w in windows if w.error is not None]
        for w in windows:
            for i in range(w.steps):
                t = w.first_step - first_tap_step + i
                if t in index and w.error is None:
                    history_scores[index[t]].copy_(torch.from_numpy(w.scores[i, :hidden.shape[1]]))
    if checks:
        run["check"] = _check(history_hidden, history_scores, scoring,
                              IN_PROCESS_TOL if variant.impl == "in_process" else SIDECAR_TOL)
    return run


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
