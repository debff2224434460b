"""The host tap (Client.tap) against the real server on its CPU backend: windows of K steps, one
Score each, delivered with the right steps, rows, scores and fired flags; partial windows; every
misuse refused with a clear error. The CUDA tap is tested in test_gpu_tap.py."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest
from safetensors.numpy import save

from probe_sidecar import ProbeSidecarError
from probe_sidecar.tap import TapError

H, P = 64, 3
METADATA = {"activation": "none", "probe_names": '["a", "b", "c"]', "thresholds": "[0, 1, -1]"}


@pytest.fixture(scope="module")
def probe_set(sidecar):
    """A small probe set with thresholds and no activation, so scores are plain x @ W.T + b."""
    rng = np.random.default_rng(7)
    weight = rng.standard_normal((P, H)).astype(np.float32)
    bias = rng.standard_normal(P).astype(np.float32)
    data = save({"weight": weight, "bias": bias},
                metadata=METADATA)
    with sidecar.client() as c:
        c.load_probe_set("tap_test", data=data, replace=True)
    return weight.astype(np.float64), bias.astype(np.float64), np.array([0, 1, -1], np.float64)


def reference(hidden: np.ndarray, weight, bias) -> np.ndarray:
    return hidden.astype(np.float64) @ weight.T + bias


def run_loop(tap, rng, steps: int, batches):
    """Writes `steps` steps of random rows (step t has batches[t % len] rows); returns them."""
    written = []
    for t in range(steps):
        rows = rng.standard_normal((batches[t % len(batches)], H)).astype(np.float32)
        tap.write(rows)
        tap.step()
        written.append(rows)
    return written


def test_windows_cover_every_step_and_row_against_float64(client, probe_set):
    weight, bias, thresholds = probe_set
    rng = np.random.default_rng(1)
    tap = client.tap("tap_test", max_batch=5, window=4)
    written = run_loop(tap, rng, 10, batches=[5, 3, 1, 4])  # 2 full windows, then 2 steps
    tap.close()  # scores the partial window
    windows = list(tap.windows())
    assert [w.index for w in windows] == [0, 1, 2]
    assert [w.steps for w in windows] == [4, 4, 2]
    assert [w.first_step for w in windows] == [0, 4, 8]
    records = [r for w in windows for r in w.records()]
    assert [(r.step, r.row) for r in records] == [
        (t, row) for t, rows in enumerate(written) for row in range(len(rows))]
    for r in records:
        expected = reference(written[r.step][r.row], weight, bias)
        np.testing.assert_allclose(r.scores, expected, rtol=1e-5, atol=1e-5)
        np.testing.assert_array_equal(r.fired, r.scores >= thresholds)
    assert all(w.error is None and w.non_finite == 0 for w in windows)
    assert all(w.latency_s >= 0 for w in windows)
    assert tap.stats.windows_closed == tap.stats.windows_delivered == 3
    assert tap.stats.steps == 10


def test_one_score_per_window(sidecar, client, probe_set):
    """The point of a tap: K steps cost one request, not K."""
    def scores_counted():
        text = sidecar.metrics_text()
        return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("probesidecar_rpc_requests_total")
                   and 'rpc="ScoreStream"' in line)

    before = scores_counted()
    tap = client.tap("tap_test", max_batch=2, window=8)
    run_loop(tap, np.random.default_rng(2), 32, batches=[2])
    tap.close()
    assert tap.stats.windows_delivered == 4
    assert scores_counted() - before == 4


def test_a_callback_gets_each_window_on_another_thread(client, probe_set):
    got, threads = [], set()
    done = threading.Event()

    def on_window(window):
        got.append(window.index)
        threads.add(threading.get_ident())
        if window.index == 2:
            done.set()

    tap = client.tap("tap_test", max_batch=1, window=2, on_window=on_window)
    run_loop(tap, np.random.default_rng(3), 6, batches=[1])
    assert done.wait(30)
    tap.close()
    assert got == [0, 1, 2]
    assert threading.get_ident() not in threads
    assert list(tap.windows()) == []  # a callback takes the windows instead of the queue


def test_a_time_bound_closes_a_partial_window(client, probe_set):
    tap = client.tap("tap_test", max_batch=1, window=1000, max_window_s=0.05)
    rng = np.random.default_rng(4)
    tap.write(rng.standard_normal((1, H)).astype(np.float32))
    tap.step()
    time.sleep(0.06)  # the bound is what is tested: a step after it closes the window
    tap.write(rng.standard_normal((1, H)).astype(np.float32))
    tap.step()
    window = tap.get(timeout=30)
    assert window is not None and window.steps == 2
    tap.close()


def test_padded_rows_are_not_delivered(client, probe_set):
    tap = client.tap("tap_test", max_batch=4, window=2)
    rows = np.random.default_rng(5).standard_normal((4, H)).astype(np.float32)
    tap.write(rows, num_rows=2)  # a batch padded to 4, 2 real
    tap.step()
    tap.write(rows, num_rows=3)
    tap.step()
    window = tap.get(timeout=30)
    tap.close()
    assert window.num_rows.tolist() == [2, 3]
    assert [(r.step, r.row) for r in window.records()] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]


def test_16_bit_rows(client, probe_set):
    weight, bias, _ = probe_set
    tap = client.tap("tap_test", max_batch=3, window=2, dtype="float16")
    rows = np.random.default_rng(6).standard_normal((3, H)).astype(np.float16)
    for _ in range(2):
        tap.write(rows)
        tap.step()
    window = tap.get(timeout=30)
    tap.close()
    np.testing.assert_allclose(window.scores[1, :3], reference(rows, weight, bias),
                               rtol=1e-3, atol=1e-3)


def test_non_finite_rows_are_counted_and_never_fire(client, probe_set):
    tap = client.tap("tap_test", max_batch=2, window=1)
    rows = np.ones((2, H), np.float32)
    rows[1, 0] = np.nan
    tap.write(rows)
    tap.step()
    window = tap.get(timeout=30)
    tap.close()
    assert window.non_finite == P
    assert not window.fired[0, 1].any()


def test_misuse_is_refused_clearly(client, probe_set):
    with pytest.raises(TapError, match="does not match probe set"):
        client.tap("tap_test", max_batch=1, window=1, hidden_size=H + 1)
    with pytest.raises(TapError, match="max-rows"):
        client.tap("tap_test", max_batch=1 << 12, window=1 << 12)
    with pytest.raises(ProbeSidecarError, match="NOT_FOUND"):
        client.tap("no_such_set", max_batch=1, window=1)
    with pytest.raises(TapError, match="dtype"):
        client.tap("tap_test", max_batch=1, window=1, dtype="int8")
    tap = client.tap("tap_test", max_batch=2, window=4)
    with pytest.raises(TapError, match="max_batch"):
        tap.write(np.zeros((3, H), np.float32))
    with pytest.raises(TapError, match=r"\[n, 64\]"):
        tap.write(np.zeros((2, H + 1), np.float32))
    with pytest.raises(TapError, match="float32"):
        tap.write(np.zeros((2, H), np.float16))
    with pytest.raises(TapError, match="num_rows"):
        tap.write(np.zeros((2, H), np.float32), num_rows=3)
    tap.close()
    with pytest.raises(TapError, match="closed"):
        tap.write(np.zeros((1, H), np.float32))
    with pytest.raises(TapError, match="closed"):
        tap.step()


def test_steps_without_writes_fail_the_window_and_say_why(client, probe_set):
    tap = client.tap("tap_test", max_batch=1, window=2)
    tap.write(np.zeros((1, H), np.float32))
    tap.step()
    tap.step()  # no write for this step
    tap.flush()
    window = tap.get(timeout=30)
    assert isinstance(window.error, TapError)
    assert "write() landed 1 times but step() was called 2 times" in str(window.error)
    with pytest.raises(TapError, match="landed 1 times"):
        tap.step()  # the decode thread hears about it at its next call
    tap.close()


def test_a_window_the_server_refuses_is_an_error_not_stale_scores(sidecar, probe_set):
    client = sidecar.client()
    tap = client.tap("tap_test", max_batch=1, window=1, raise_errors=False)
    client.unload_probe_set("tap_test")  # the next window names a set that is gone
    try:
        tap.write(np.zeros((1, H), np.float32))
        tap.step()
        window = tap.get(timeout=30)
        assert isinstance(window.error, ProbeSidecarError)
        assert window.error.code.name == "NOT_FOUND"
        # Its step, with no row scored: nothing to read, no stale number.
        assert window.steps == 1 and list(window.records()) == []
        assert np.isnan(window.scores).all() and not window.fired.any()
        assert tap.stats.windows_failed == 1
    finally:
        tap.close()
        weight, bias, _ = probe_set
        client.load_probe_set("tap_test", replace=True, data=save(
            {"weight": weight.astype(np.float32), "bias": bias.astype(np.float32)},
            metadata=METADATA))
        client.close()

def test_a_sidecar_that_never_finishes_a_window_fails_the_tap_instead_of_stalling(client,
                                                                                  probe_set):
    """when_behind="wait" (the default): the decode thread checks on the host that a half's
    previous window has finished before the half is rewritten; past reuse_timeout_s the tap
    fails (loudly) and stops sending, it does not wait forever."""
    from probe_sidecar.pipeline import ScoreStreamPipeline
    from probe_sidecar.tap import HostRing, Tap

    class NeverFinished(HostRing):
        def finished(self, window, deadline):
            return False

    info = client.probe_set_info("tap_test")
    pipeline = ScoreStreamPipeline(client.stub)
    tap = Tap(NeverFinished("tap_test", 0, H, 1, 2, "float32"), pipeline, info,
              reuse_timeout_s=0.05, on_close=pipeline.close)
    row = np.zeros((1, H), np.float32)
    for _ in range(2):  # window 0
        tap.write(row)
        tap.step()
    tap.write(row)
    tap.step()
    tap.write(row)
    with pytest.raises(TapError, match="did not finish window 0 within 0.05 s"):
        tap.step()  # window 1 closes; half 0 would be rewritten next
    for _ in range(2):  # window 2: failed at once, nothing sent
        tap.write(row)
        tap.step()
    tap.close()
    windows = {w.index: w for w in tap.windows()}
    assert windows[0].error is None and windows[1].error is None
    assert isinstance(windows[2].error, TapError)
    assert tap.stats.windows_failed == 1


def test_a_sidecar_that_falls_behind_costs_windows_not_steps(client, probe_set):
    """The decode thread checks, without waiting, that a half's previous window has finished
    before the half is rewritten; when it has not, the next window is lost (its writes kept
    nowhere, never sent, delivered with WindowLost) and scoring resumes by itself with the first
    window whose half is free again. Windows of two steps; answers held back from window 2 on:
    window 4 (whose half window 2 still holds) and 5 (window 3's) are lost; once the answers
    come, window 6 is scored again, with its own rows. Every window is delivered in the order
    they closed."""
    from probe_sidecar.pipeline import ScoreStreamPipeline
    from probe_sidecar.tap import HostRing, Tap, WindowLost

    weight, bias, _ = probe_set
    answers = threading.Event()
    answers.set()

    class Behind(HostRing):
        copies_at_close = False  # as a device ring: a half is free once the sidecar is done

        def answered(self, window, response):
            answers.wait()  # the sidecar "has not finished"
            super().answered(window, response)

    info = client.probe_set_info("tap_test")
    pipeline = ScoreStreamPipeline(client.stub)
    tap = Tap(Behind("tap_test", 0, H, 1, 2, "float32"), pipeline, info, raise_errors=False,
              on_close=pipeline.close, when_behind="lose")
    rows = [np.full((1, H), t / 10, np.float32) for t in range(14)]
    for t in range(14):
        if t == 4:
            answers.clear()  # from window 2 on, the sidecar "has not finished"
        if t == 11:  # windows 2 and 3 answered now, before window 5 closes
            answers.set()
            tap.wait_delivered(60)  # a safety net, far past the work
        tap.write(rows[t])
        tap.step()
        if answers.is_set() and t % 2:  # a window closed: a sidecar keeping pace answers it
            tap.wait_delivered(60)
    tap.close()
    delivered = list(tap.windows())
    # In the order they closed: windows 4 and 5, lost at their close, after 2 and 3.
    assert [w.index for w in delivered] == list(range(7))
    windows = {w.index: w for w in delivered}
    for index in (4, 5):
        assert isinstance(windows[index].error, WindowLost), (index, windows[index].error)
    for index in (0, 1, 2, 3, 6):
        w = windows[index]
        assert w.error is None, (index, w.error)
        got = np.array([r.scores for r in w.records()])
        want = reference(np.concatenate(rows[2 * index:2 * index + 2]), weight, bias)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4)
    assert tap.stats.windows_lost == 2 and tap.stats.windows_failed == 2


def test_a_window_whose_request_cannot_be_sent_is_delivered_with_the_error(client, probe_set):
    """A window whose Score cannot even be queued (the stream cannot be opened) is delivered with
    that error, and the windows after it are still sent and delivered, in order."""
    import grpc

    from probe_sidecar.pipeline import ScoreStreamPipeline
    from probe_sidecar.tap import HostRing, Tap

    weight, bias, _ = probe_set
    refused = []

    class Refusing(ScoreStreamPipeline):
        def submit(self, request, on_answer=None):
            if not refused:
                refused.append(request)
                raise ProbeSidecarError(grpc.StatusCode.UNAVAILABLE, "no stream to send on")
            return super().submit(request, on_answer)

    info = client.probe_set_info("tap_test")
    pipeline = Refusing(client.stub)
    tap = Tap(HostRing("tap_test", 0, H, 1, 1, "float32"), pipeline, info, raise_errors=False,
              on_close=pipeline.close)
    rows = [np.full((1, H), t / 10, np.float32) for t in range(3)]
    for row in rows:  # windows of one step
        tap.write(row)
        tap.step()
    tap.close(timeout=60)  # a safety net, far past the work
    delivered = list(tap.windows())
    assert [w.index for w in delivered] == [0, 1, 2]
    assert isinstance(delivered[0].error, ProbeSidecarError), delivered[0].error
    for w, row in zip(delivered[1:], rows[1:]):
        assert w.error is None, w.error
        np.testing.assert_allclose([r.scores for r in w.records()], reference(row, weight, bias),
                                   rtol=1e-5, atol=1e-4)
