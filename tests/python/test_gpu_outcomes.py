"""Probe outcomes counted on the GPU, against a host recount of every score the client got back:
thousands of windows of two CUDA taps whose writes are replayed in a captured graph, and plain
Scores of several probe sets (rows from 1 to 4096, so that every kernel path runs; scores inline
and into a device output; NaN activations), under two sessions with different labels. The
counters /metrics reads (one copy from the device per scrape) and ListProbeSets must equal the
recount exactly (the score sums to float rounding).

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing.
"""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402
from outcome_recount import Recount, assert_matches_proto  # noqa: E402
from probe_files import ProbeFile  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402

H = 1024
SETS = {
    # name: (P, activation, thresholds)
    "o_small": (4, "sigmoid", [0.5, 0.6, None, 0.3]),
    "o_tc": (16, None, [0.0 if p % 3 else None for p in range(16)]),
    "o_wide": (256, "sigmoid", [0.7] * 256),
    "o_huge": (1024, None, [1.0 if p % 2 else None for p in range(1024)]),
}
TAPS = {"o_small": (8, 4), "o_tc": (16, 8)}  # max_batch, window
STEPS = 4000  # o_small: 1000 windows; o_tc: 500
FIRST = {"model": "gpu", "replica": "0"}
SECOND = {"model": "gpu", "replica": "1"}


def outcome_samples(server) -> dict:
    """{(family sample, probe_set, probe, replica[, le]): value} of the model="gpu" series."""
    out = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        if not family.name.startswith("probesidecar_probe_"):
            continue
        for s in family.samples:
            if s.labels.get("model") != "gpu":
                continue
            key = (s.name, s.labels.get("probe_set"), s.labels.get("probe"),
                   s.labels.get("replica"), s.labels.get("le"))
            out[key] = s.value
    return out


@pytest.fixture(scope="module")
def server():
    with Sidecar(["--backend=cuda", "--warmup-rows=none", "--max-probe-labels=4096"]) as s:
        with s.client() as c:
            for name, (p, activation, thresholds) in SETS.items():
                c.load_probe_set(name, data=ProbeFile(p, H, seed=p, dtype="bf16",
                                                      activation=activation,
                                                      thresholds=thresholds).data)
        yield s
        assert s.process.poll() is None, s.log()


def test_device_counters_equal_a_host_recount_of_every_returned_score(server):
    with server.client() as c:
        infos = {info.name: info for info in c.list_probe_sets()}
    recounts = {(name, replica): Recount.for_set(infos[name])
                for name in SETS for replica in ("0", "1")}
    paths = collections.Counter()
    windows = collections.defaultdict(list)
    lock = threading.Lock()

    def collect(name):
        def on_window(window):
            with lock:
                windows[name].append(window)
        return on_window

    with TorchClient(server.uds_target, session_labels=FIRST) as first, \
            TorchClient(server.uds_target, session_labels=SECOND) as second:
        taps = {name: first.tap(name, max_batch=b, window=k, on_window=collect(name))
                for name, (b, k) in TAPS.items()}
        # What follows is compared with the counters as they are now (a tap's warm-up window
        # counts no row).
        before = outcome_samples(server)

        # One captured decode "step" writes both taps: each replay writes their next slots.
        stream = torch.cuda.Stream()
        noise = {name: torch.randn(STEPS, b, H, device="cuda", dtype=torch.bfloat16) * 2
                 for name, (b, _) in TAPS.items()}
        t_dev = torch.zeros((), dtype=torch.int64, device="cuda")
        state = {name: torch.zeros(b, H, device="cuda", dtype=torch.bfloat16)
                 for name, (b, _) in TAPS.items()}
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                for name, (b, _) in TAPS.items():
                    state[name].copy_(noise[name].index_select(0, t_dev.view(1)).squeeze(0))
                    if name == "o_small":  # a padded batch: 1 to b real rows (counted_rows)
                        taps[name].write(state[name], (t_dev % b + 1).to(torch.int32))
                    else:
                        taps[name].write(state[name])
                t_dev.add_(1)
            t_dev.zero_()
            for _ in range(STEPS):
                graph.replay()
                for tap in taps.values():
                    tap.step()
            for tap in taps.values():
                tap.flush()
                tap.wait_delivered(timeout=120)
                tap.close()
        torch.cuda.synchronize()

        # Plain Scores: every set, many row counts, inline and into a device output, NaN rows.
        gen = torch.Generator(device="cuda").manual_seed(5)
        hidden = torch.randn(8192, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 2
        hidden[17] = float("nan")
        for i in range(600):
            name = list(SETS)[i % len(SETS)]
            client, replica = (first, "0") if i % 3 else (second, "1")
            rows_count = [1, 7, 64, 300, 1024, 4096][(i // len(SETS)) % 6]
            rows = torch.randint(0, 8192, (rows_count,), generator=gen, device="cuda")
            if i % 10 == 0:
                rows[0] = 17
            rows = rows.cpu().numpy().astype(np.int32)
            if i % 4 == 3:
                out = torch.empty(rows_count, SETS[name][0], device="cuda", dtype=torch.float32)
                result = client.score(hidden, rows, name, out=out)
                torch.cuda.synchronize()
                scores = out.cpu().numpy()
            else:
                result = client.score(hidden, rows, name)
                scores = result.scores
            paths[result.kernel_path] += 1
            recounts[(name, replica)].add(scores)

        after = outcome_samples(server)
        with server.client() as c:
            listed = {info.name: info for info in c.list_probe_sets()}

    # The taps' windows: every real row of every step (a padded batch's other rows not counted).
    delivered = 0
    for name, got in windows.items():
        assert sum(w.steps for w in got) == STEPS, name
        for window in got:
            assert window.error is None, window.error
            for i in range(window.steps):
                recounts[(name, "0")].add(window.scores[i, :window.num_rows[i]])
            delivered += 1
    assert delivered >= 1500, delivered
    print(f"windows: {delivered}; plain Scores by kernel path: {dict(paths)}")
    assert len(paths) >= 3, paths  # fused_cuda, fused_tc, gather_gemm / gather_wgmma

    checked = 0
    for (name, replica), recount in recounts.items():
        def delta(sample, probe=None, le=None):
            key = (sample, name, probe, replica, le)
            return after.get(key, 0) - before.get(key, 0)

        assert delta("probesidecar_probe_set_rows_scored_total") == recount.rows, (name, replica)
        for p, probe in enumerate(f"probe_{i}" for i in range(SETS[name][0])):
            assert delta("probesidecar_probe_scored_total", probe) == recount.rows
            assert delta("probesidecar_probe_fired_total", probe) == recount.fired[p], \
                (name, replica, probe)
            assert delta("probesidecar_probe_non_finite_scores_total", probe) == \
                recount.non_finite[p], (name, replica, probe)
            cumulative = np.cumsum(recount.buckets[p])
            les = sorted((k[4] for k in after if k[0] == "probesidecar_probe_score_bucket"
                          and k[1] == name and k[2] == probe and k[3] == replica),
                         key=float)
            assert [delta("probesidecar_probe_score_bucket", probe, le) for le in les] == \
                cumulative.tolist(), (name, replica, probe)
            checked += 1
        assert recount.rows > 0
    assert checked == 2 * sum(p for p, _, _ in SETS.values())
    assert sum(r.non_finite.sum() for r in recounts.values()) > 0
    assert sum(r.fired.sum() for r in recounts.values()) > 0

    # ListProbeSets (the copy the scrape above made): the second session's counts exactly (it has
    # no tap, so no warm-up window in them).
    for name in SETS:
        (labelled,) = [lp for lp in listed[name].proto.outcomes_by_labels
                       if dict(lp.labels) == SECOND]
        assert_matches_proto(recounts[(name, "1")], labelled.outcomes, name)


def test_a_set_not_counted_answers_the_same_and_counts_nothing():
    """A set loaded with counting off, on the GPU: every way of scoring it (scores returned, a
    synchronous device output, an asynchronous one, a tap's windows) answers exactly what the
    same set counted answers, and nothing is counted for it; the counted twin counts every row."""
    probe = ProbeFile(16, H, seed=41, dtype="bf16", thresholds=[0.0] * 16)
    gen = torch.Generator(device="cuda").manual_seed(9)
    hidden = torch.randn(2048, H, device="cuda", dtype=torch.bfloat16, generator=gen) * 2
    rows = np.arange(0, 2048, 7, dtype=np.int32)
    with Sidecar(["--backend=cuda", "--warmup-rows=none", "--probe-outcomes=off"]) as s:
        with s.client() as c:
            assert not c.load_probe_set("off", data=probe.data).outcomes_counted
            assert c.load_probe_set("on", data=probe.data, count_outcomes=True).outcomes_counted
        answers = collections.defaultdict(list)
        with TorchClient(s.uds_target) as tc:
            for name in ("off", "on"):
                answers[name].append(tc.score(hidden, rows, name).scores)
                out = torch.full((len(rows), 16), float("nan"), device="cuda")
                tc.score(hidden, rows, name, out=out)
                answers[name].append(out.cpu().numpy())
                out = torch.full((len(rows), 16), float("nan"), device="cuda")
                tc.score_async(hidden, torch.from_numpy(rows).cuda(), name, out=out).wait()
                answers[name].append(out.cpu().numpy())
                tap = tc.tap(name, max_batch=8, window=4)
                for step in range(8):
                    tap.write(hidden[8 * step:8 * step + 8])
                    tap.step()
                tap.flush()
                tap.wait_delivered(timeout=120)
                answers[name] += [w.scores[i, :n] for w in tap.windows() for i, n in enumerate(w.num_rows)]
                tap.close()
        torch.cuda.synchronize()
        for got, want in zip(answers["off"], answers["on"], strict=True):
            np.testing.assert_array_equal(got, want)
            assert np.isfinite(want).all()
        # A scrape waits for a fresh copy of the counters (ListProbeSets answers with the last).
        samples = outcome_samples_all(s)
        assert sum(v for (name, probe_set, _), v in samples.items()
                   if name == "probesidecar_probe_set_rows_scored_total"
                   and probe_set == "on") == 3 * len(rows) + 8 * 8
        assert not [k for k in samples if k[1] == "off"]
        with s.client() as c:
            listed = {info.name: info for info in c.list_probe_sets()}
        assert not listed["off"].proto.HasField("outcomes")
        assert not listed["off"].proto.outcomes_by_labels


def outcome_samples_all(server) -> dict:
    """outcome_samples() without the model filter: every series of every set."""
    out = {}
    for family in text_string_to_metric_families(server.metrics_text()):
        if family.name.startswith("probesidecar_probe_"):
            for s in family.samples:
                out[(s.name, s.labels.get("probe_set"), s.labels.get("probe"))] = s.value
    return out
