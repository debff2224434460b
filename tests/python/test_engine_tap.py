"""probe_sidecar.vllm.EngineTap without vLLM: an engine's steps (arm, the forward's gathered
write, count) driven by hand against the real server (CPU backend, CPU rings): rows become
records of their requests and positions, partial prefill chunks are never delivered, a finished
request gets its summary once its windows are in, an idle engine's window closes by time, a
failed window marks its requests' summaries incomplete, and nothing is held afterwards."""

from __future__ import annotations

import signal
import threading
import time

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from conftest import Sidecar  # noqa: E402
from probe_files import ProbeFile  # noqa: E402

from probe_sidecar import tap_op  # noqa: E402
from probe_sidecar.torch import cpu_tap  # noqa: E402
from probe_sidecar.vllm import EngineTap, StepRows  # noqa: E402
from probe_sidecar.vllm.engine_tap import _caller_id  # noqa: E402

H, P = 32, 3
DEADLINE = 60.0  # far past the work: a safety net for a loaded machine under ASan


# The engine's probe set: thresholds 0, 1 and one that never fires; named x, y, z.
ENGINE_PROBES = ProbeFile(P, H, seed=7, activation="none", thresholds=[0, 1, 100],
                          names=["x", "y", "z"])


@pytest.fixture(scope="module")
def probe_set(sidecar):
    with sidecar.client() as c:
        c.load_probe_set("engine", replace=True, data=ENGINE_PROBES.data)
    return ENGINE_PROBES.weight.astype(np.float64), ENGINE_PROBES.bias.astype(np.float64)


class Engine:
    """Steps an EngineTap the way the vLLM plugin does around a forward."""

    def __init__(self, client, window=3, max_window_s=None, follow=False, **options):
        def make_tap(name, on_window):
            return cpu_tap(client, name, max_batch=4, window=window, dtype=torch.float32,
                           on_window=on_window, raise_errors=False)

        self.tap = EngineTap(make_tap, {"engine": ("x", "y", "z")}, window=window,
                             max_window_s=max_window_s, max_queued_records=1000, **options)
        self.hidden = {}  # (request, position) -> the row written
        # follow: the rings follow a starts vector (vLLM's query_start_loc) instead of being
        # armed per forward, as the plugin runs them once vLLM's graphs are captured.
        self.follow = follow
        if follow:
            with self.tap.lock:
                self.tap.follow()

    def step(self, rows: list[tuple[str, int, bool]], new=(), finished=(), lengths=None):
        """One forward over `rows` (request, position, produces a token): a batch of 6 tokens of
        which the engine samples rows 5, 4, ... (as vLLM's logits_indices). `finished`: requests
        the engine reports ended at this step, `lengths` their lengths where known."""
        batch = torch.randn(6, H)
        index = torch.tensor([5 - i for i in range(len(rows))])
        starts = None
        if self.follow:  # request i's tokens: starts[i] .. starts[i + 1] - 1, padding empty
            ends = np.sort(np.random.default_rng(len(self.hidden)).choice(
                np.arange(1, 7), len(rows), replace=False))
            starts = torch.tensor(np.r_[0, ends, np.full(4 - len(rows), ends[-1] if len(rows)
                                                           else 0)], dtype=torch.int32)
            index = torch.from_numpy(ends - 1)
        with self.tap.lock:
            self.tap.finish(finished, lengths)
            if not rows:
                return  # vLLM's step with nothing scheduled: no forward, no step
            self.tap.arm(None if self.follow else index,
                         StepRows(tuple(r for r, _, _ in rows),
                                  np.array([p for _, p, _ in rows], np.int64),
                                  np.array([s for _, _, s in rows])), new)
            for t in self.tap.taps.values():  # the forward hook
                tap_op.tap_write(batch, t.ring.raw, t.ring.layout_args, gather=True,
                                 starts=starts)
            self.tap.count_step()
        for (request, position, sampled), i in zip(rows, index.tolist()):
            if sampled:
                self.hidden[(request, position)] = batch[i].double().numpy()


@pytest.mark.parametrize("follow", [False, True], ids=["armed", "following"])
def test_rows_become_records_and_summaries_of_their_requests(client, probe_set, follow):
    weight, bias = probe_set
    engine = Engine(client, follow=follow)
    e = engine.tap
    try:
        engine.step([("a-00000001", 9, False), ("b-00000002", 2, True)],
                    new=["a-00000001", "b-00000002"])  # a: a partial prefill chunk
        engine.step([("a-00000001", 14, True), ("b-00000002", 3, True)])
        engine.step([("a-00000001", 15, True), ("b-00000002", 4, True),
                     ("c-00000003", 0, True)], new=["c-00000003"])
        engine.step([("a-00000001", 16, True), ("c-00000003", 1, True)],
                    finished=["b-00000002"])
        engine.step([], finished=["a-00000001", "c-00000003"])  # vLLM's empty step: no rows
        taken = e.collect(timeout=DEADLINE)
        records = list(e.records())
    finally:
        e.close()
    seen = sorted((r.request_id, r.position) for r in records)
    assert seen == sorted(engine.hidden)  # every sampled row once; the partial chunk never
    for r in records:
        want = engine.hidden[(r.request_id, r.position)] @ weight.T + bias
        np.testing.assert_allclose(r.scores, want, rtol=1e-5, atol=1e-5)
        assert r.fired.tolist() == [bool(s >= t) for s, t in zip(r.scores, [0, 1, 100])]
    assert set(taken) == {"a-00000001", "b-00000002", "c-00000003"}
    for request_id, by_set in taken.items():
        s = by_set["engine"]
        mine = [r for r in records if r.request_id == request_id]
        assert s.rows == len(mine) and s.complete and s.probes == ("x", "y", "z")
        assert s.max_score == pytest.approx([max(float(r.scores[p]) for r in mine)
                                             for p in range(P)], rel=0, abs=0)
        for p in range(P):
            fired = [r.position for r in mine if r.fired[p]]
            assert s.first_fired[p] == (min(fired) if fired else None)
    state = e.state()
    assert state["requests_summarised"] == 0 and state["steps_pending"] == 0
    assert state["rows_from"] == ("starts" if follow else "armed")
    assert set(state["host"]) == {"engine_us_per_step", "close_us_per_window",
                                  "threads_us_per_window", "threads_us_per_step"}


def test_a_request_is_summarised_only_after_its_windows_and_once(client, probe_set):
    finished = []
    called = threading.Event()

    def on_request(request_id, by_set):
        finished.append(request_id)
        called.set()

    engine = Engine(client, window=2, on_request=on_request)
    e = engine.tap
    try:
        engine.step([("r-00000001", 4, True)], new=["r-00000001"])
        engine.step([], finished=["r-00000001"])  # its one row is in a window still open
        assert finished == [] and e.state()["requests_finishing"] == 1
        e.flush()
        e.wait_delivered(DEADLINE)
        # The callback runs on the sinks' thread, after the delivery that completed the request.
        assert called.wait(DEADLINE)
        assert finished == ["r-00000001"]
        assert e.collect(["r"], timeout=DEADLINE)["r-00000001"]["engine"].rows == 1
        assert e.collect(["r"], timeout=DEADLINE) == {}  # taken once
        state = e.state()
        assert all(state[k] == 0 for k in ("steps_pending", "requests_live", "requests_finishing",
                                           "requests_summarised", "requests_accumulating"))
    finally:
        e.close()


def test_an_idle_engine_window_closes_by_time(client, probe_set):
    """max_window_s: an engine that stops stepping (no requests) still gets its last window
    scored, by the tap's flusher thread."""
    engine = Engine(client, window=16, max_window_s=0.05)
    e = engine.tap
    try:
        engine.step([("s-00000001", 1, True)], new=["s-00000001"])
        engine.step([("s-00000001", 2, True)])
        records = []
        # No flush(): the time bound closes the window. records() ends only when none arrives
        # within its timeout, so the loop stops at the two rows the window holds.
        for record in e.records(timeout=DEADLINE):
            records.append(record)
            if len(records) == 2:
                break
        assert sorted(r.position for r in records) == [1, 2], "the idle window was never scored"
        assert list(e.records()) == []  # and nothing else
    finally:
        e.close()


def test_a_failed_window_marks_its_requests_incomplete(sidecar, client, probe_set):
    engine = Engine(client, window=2)
    e = engine.tap
    try:
        engine.step([("f-00000001", 3, True)], new=["f-00000001"])
        engine.step([("f-00000001", 4, True)])  # window 0 closes: scored
        e.wait_delivered(DEADLINE)
        with sidecar.client() as admin:
            admin.unload_probe_set("engine")  # window 1's Score fails: NOT_FOUND
        engine.step([("f-00000001", 5, True)])
        engine.step([], finished=["f-00000001"])
        summary = e.collect(timeout=DEADLINE)["f-00000001"]["engine"]
        assert summary.rows == 2 and not summary.complete
        assert e.state()["windows_failed"] == 1
    finally:
        e.close()
        with sidecar.client() as admin:  # for the other tests of this session
            admin.load_probe_set("engine", replace=True, data=ENGINE_PROBES.data)


def test_a_row_past_a_requests_end_is_dropped(client, probe_set):
    """Asynchronous scheduling: the step after the one that sampled a request's stop token was
    scheduled before the token was seen, so the request gets one more row (position 6, the stop
    token's own). With hold_last_row the newest row of each request waits; the request's length
    at its end (prompt 3 + 4 generated = 7: rows 2 ... 5) drops it from the records and the
    summary. A request that ended on its length cap (no extra row) keeps every row."""
    engine = Engine(client, window=2, hold_last_row=True)
    e = engine.tap
    try:
        engine.step([("s-00000001", 2, True), ("m-00000002", 0, True)],
                    new=["s-00000001", "m-00000002"])
        for p in (3, 4, 5):
            engine.step([("s-00000001", p, True), ("m-00000002", p - 2, True)])
        engine.step([("s-00000001", 6, True)])  # the forward past its stop token
        e.wait_delivered(DEADLINE)
        e.flush()
        e.wait_delivered(DEADLINE)
        held = {(r.request_id, r.position) for r in e.records()}
        # Each request's newest row waits; the rows before it are delivered.
        assert ("s-00000001", 6) not in held and ("m-00000002", 3) not in held
        assert ("s-00000001", 5) in held and ("m-00000002", 2) in held
        engine.step([], finished=["s-00000001", "m-00000002"],
                    lengths={"s-00000001": 7, "m-00000002": 5})
        taken = e.collect(timeout=DEADLINE)
        records = held | {(r.request_id, r.position) for r in e.records()}
    finally:
        e.close()
    assert sorted(p for r, p in records if r == "s-00000001") == [2, 3, 4, 5]
    assert sorted(p for r, p in records if r == "m-00000002") == [0, 1, 2, 3]
    assert taken["s-00000001"]["engine"].rows == 4 and taken["m-00000002"]["engine"].rows == 4
    assert e.state()["rows_past_end"] == 1 and e.state()["rows_held"] == 0


def test_the_front_end_finishes_what_the_runner_was_not_told(client, probe_set):
    """The engine's last step reaches the model runner only with the next one: a request the
    front end has returned is finished by its caller's id (and its length) when collected."""
    engine = Engine(client, window=4)
    e = engine.tap
    try:
        engine.step([("q-00000001", 4, True)], new=["q-00000001"])
        engine.step([("q-00000001", 5, True)])
        assert e.state()["requests_live"] == 1
        e.finish_callers({"q": 7, "unknown": None})
        taken = e.collect(["q"], timeout=DEADLINE)
    finally:
        e.close()
    assert taken["q-00000001"]["engine"].rows == 2
    assert e.state()["requests_live"] == 0 and e.state()["requests_summarised"] == 0


def test_the_callers_id_is_the_engines_without_vllms_suffix():
    assert _caller_id("req-7-0123abcd") == "req-7"
    assert _caller_id("plain") == "plain"
    assert _caller_id("a-short") == "a-short"


def test_a_slow_sink_never_holds_up_the_engine(client, probe_set, monkeypatch):
    """A record callback that blocks: the engine's steps, windows and collect() go on (they never
    wait for the sinks' thread); what the full sink queue cannot take is counted, not waited
    for; the summaries are complete regardless."""
    from probe_sidecar.vllm import engine_tap

    monkeypatch.setattr(engine_tap, "MAX_SINK_BATCHES", 2)
    release = threading.Event()
    seen = []

    def blocking(record):
        release.wait(DEADLINE)
        seen.append(record)

    engine = Engine(client, window=2, on_record=blocking)
    e = engine.tap
    try:
        for p in range(12):
            engine.step([("b-00000001", p, True)], new=["b-00000001"] if p == 0 else ())
            if p % 2:  # a window closed: a sidecar keeping pace with the engine has scored it
                e.wait_delivered(DEADLINE)
        engine.step([], finished=["b-00000001"])
        summary = e.collect(["b"], timeout=DEADLINE)["b-00000001"]["engine"]  # sink still held
        state = e.state()
    finally:
        release.set()
        e.close()
    assert summary.rows == 12 and summary.complete, state
    assert state["sink_dropped_records"] > 0
    assert len(seen) + state["sink_dropped_records"] == 12  # every record delivered or counted


@pytest.fixture
def own_sidecar(tmp_path):
    """A CPU-backend sidecar of this test's own (which it may pause, kill and start again), its
    probe set in a --probes folder so that a restart loads it."""
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "engine.safetensors").write_bytes(ENGINE_PROBES.data)
    flags = ["--backend=cpu", f"--probes={probes}"]
    servers = [Sidecar(flags, workdir=tmp_path).start()]
    yield servers, flags, tmp_path
    for server in servers:
        server.stop()


def plugin_engine_tap(target: str, window: int):
    """The vLLM plugin's EngineTap for the CPU (inline taps, a session it renews), without vLLM."""
    from probe_sidecar.vllm.config import parse
    from probe_sidecar.vllm.install import _make_engine_tap

    config = parse({"target": target, "probe_sets": ["engine"], "window": window,
                    "max_window_s": None, "max_queued_records": 10000})
    return _make_engine_tap(config, device=torch.device("cpu"), dtype=torch.float32,
                            max_batch=4, hidden_size=H, hold_last_row=False)


def drive(e, positions, request="r-00000001", new=False):
    """Engine steps of one row each (the plugin's arm, write and count), the rows random."""
    for i, p in enumerate(positions):
        with e.lock:
            e.arm(torch.tensor([0]), StepRows((request,), np.array([p]), np.array([True])),
                  [request] if new and i == 0 else ())
            for t in e.taps.values():
                tap_op.tap_write(torch.randn(1, H), t.ring.raw, t.ring.layout_args, gather=True)
            e.count_step()


def begin(own_sidecar):
    """The plugin's EngineTap on the test's own sidecar, four steps scored before the trouble."""
    servers, _, _ = own_sidecar
    e = plugin_engine_tap(servers[0].uds_target, window=2)
    drive(e, range(0, 4), new=True)
    e.wait_delivered(DEADLINE)
    return e


def end(e):
    """The request finished and collected: (its summary, the tap's state)."""
    with e.lock:
        e.finish(["r-00000001"])
    return e.collect(["r"], timeout=DEADLINE)["r-00000001"]["engine"], e.state()


def in_a_thread(work) -> None:
    """Runs `work` on a thread and asserts it returns (a stalled engine would not)."""
    done = threading.Thread(target=work, daemon=True)
    done.start()
    done.join(DEADLINE)
    assert not done.is_alive(), "the engine's steps waited on the sidecar"


def test_a_paused_sidecar_costs_windows_not_steps(own_sidecar):
    """The sidecar stopped (SIGSTOP) mid-generation for as long as it takes: the engine's steps go
    on, the windows it cannot take are lost (counted), and once it runs again (SIGCONT) windows
    are scored again; every row is scored or counted lost, the summary marked incomplete."""
    servers, _, _ = own_sidecar
    e = begin(own_sidecar)
    try:
        servers[0].pause()
        try:
            in_a_thread(lambda: drive(e, range(4, 40)))
        finally:
            servers[0].resume()
        e.wait_delivered(DEADLINE)
        drive(e, range(40, 44))
        summary, state = end(e)
    finally:
        e.close()
    assert state["windows_lost"] > 0 and not summary.complete
    assert summary.rows + state["rows_lost"] == 44
    assert summary.rows >= 8  # before the pause, and after it
    assert state["requests_live"] == state["steps_pending"] == 0


def test_a_summary_waits_for_its_rows_still_being_scored_while_later_windows_are_lost(
        own_sidecar):
    """A request whose last rows are in a window still with the (paused) sidecar, while the
    windows after it are lost: its summary is made once that window is scored, with every row —
    not when a later window is reported lost (a lost window is known at its close, before the
    window still with the sidecar), which made it with rows missing and marked complete, and
    left its late rows under no request."""
    servers, _, _ = own_sidecar
    e = begin(own_sidecar)  # request r: steps 0-3 scored (windows 0 and 1)
    try:
        servers[0].pause()
        try:
            in_a_thread(lambda: drive(e, range(4, 6)))  # window 2, r's last rows: not answered
            with e.lock:
                e.finish(["r-00000001"])
            # Request s: its windows queue behind window 2, then are lost.
            in_a_thread(lambda: drive(e, range(0, 16), request="s-00000001", new=True))
            assert e.taps["engine"].stats.windows_lost > 0  # counted at their close
            made = e.take(lambda request_id: True)
            assert not made, "a summary was made before its rows were scored"
        finally:
            servers[0].resume()
        e.wait_delivered(DEADLINE)
        summary = e.collect(["r"], timeout=DEADLINE)["r-00000001"]["engine"]
        with e.lock:
            e.finish(["s-00000001"])
        other = e.collect(["s"], timeout=DEADLINE)["s-00000001"]["engine"]
        state = e.state()
        records = list(e.records())
    finally:
        e.close()
    assert summary.rows == 6 and summary.complete, (summary, state)
    assert not other.complete and other.rows + state["rows_lost"] == 16, (other, state)
    assert {r.request_id for r in records} == {"r-00000001", "s-00000001"}
    assert state["requests_live"] == state["steps_pending"] == 0


def test_a_restarted_sidecar_scores_again(own_sidecar):
    """The sidecar killed mid-generation and started again on the same socket: windows fail while
    it is gone (the engine's steps go on), then the plugin opens a session on the new server and
    windows are scored again."""
    servers, flags, workdir = own_sidecar
    e = begin(own_sidecar)
    try:
        servers[0].signal(signal.SIGKILL)
        servers[0].wait()
        in_a_thread(lambda: drive(e, range(4, 10)))
        e.wait_delivered(DEADLINE)
        servers.append(Sidecar(flags, workdir=workdir).start())
        position, deadline = 10, time.monotonic() + DEADLINE
        while e.state().get("recoveries", 0) == 0 or (
                e.state()["rows_delivered"] <= 4 and time.monotonic() < deadline):
            drive(e, range(position, position + 2))  # a window each: its failure asks to recover
            position += 2
            e.wait_delivered(DEADLINE)
            assert time.monotonic() < deadline, "never scored again"
        drive(e, range(position, position + 2))
        position += 2
        summary, state = end(e)
    finally:
        e.close()
    assert state["recoveries"] >= 1 and not summary.complete
    assert summary.rows + state["rows_lost"] == position
    assert summary.rows >= 6  # the 4 before, and the last window at least
