"""Probe outcomes on the CPU backend, against the real server: sessions declare labels (checked),
every score a client gets back is counted (ListProbeSets and /metrics equal a host recount, raw
scores with buckets derived from the thresholds or given in the file), a reload starts from zero,
--max-probe-labels folds a set into one series, counting turned off (--probe-outcomes, the
set's own choice) counts nothing and changes no answer, and `probe-client watch` shows live fire
rates."""

from __future__ import annotations

import re
import subprocess
import time

import grpc
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import CLIENT_BIN, Sidecar
from outcome_recount import Recount, assert_matches_proto
from probe_files import ProbeFile
from probe_sidecar import ProbeSidecarError
from probe_sidecar.client import score_request
from probesidecar.v1 import probes_pb2

H = 32


def samples(sidecar, family: str) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of one family of /metrics."""
    out = {}
    for fam in text_string_to_metric_families(sidecar.metrics_text()):
        for s in fam.samples:
            if s.name.startswith(family):
                out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


@pytest.fixture(scope="module")
def server():
    with Sidecar(["--backend=cpu", "--session-labels=model,replica", "--max-probe-labels=4",
                  "--max-session-label-sets=8"]) as s:
        yield s
        assert s.process.poll() is None, s.log()


def test_sessions_on_the_cpu_backend_declare_checked_labels(server):
    with server.client() as c:
        info = c.server_info()
        assert list(info.session_labels) == ["model", "replica"]
        assert info.limits.max_session_label_sets == 8 and info.limits.max_probe_labels == 4
        with c.open_session({"model": "llama-3.1/8b", "replica": "3"}) as session:
            assert session.id > 0 and not session.labels_folded
        for bad, fragment in [({"request_id": "17"}, "not a session label of this server"),
                              ({"model": "has space"}, "must be 1 to 64 characters"),
                              ({"model": "x" * 65}, "must be 1 to 64 characters"),
                              ({"replica": "_other"}, "must be 1 to 64 characters")]:
            with pytest.raises(ProbeSidecarError) as refused:
                c.open_session(bad)
            assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
            assert fragment in refused.value.message


def test_a_score_naming_a_session_that_is_not_open_is_refused(server):
    x = np.zeros((2, 4096), np.float32)
    with server.client() as c:
        session = c.open_session({"model": "a"})
        c.score(x, [0], "demo", session=session)
        session.close()

        def refused():
            try:
                c.score(x, [0], "demo", session=session)
            except ProbeSidecarError as e:
                return e
            return None

        # The server closes the session once it sees the call end.
        deadline = time.monotonic() + 60
        while (error := refused()) is None:
            assert time.monotonic() < deadline, "the session stayed open"
            time.sleep(0.05)
        assert error.code == grpc.StatusCode.NOT_FOUND and "is not open" in error.message


def test_raw_scores_count_with_buckets_from_thresholds_and_from_the_file(server):
    derived = ProbeFile(3, H, seed=21, thresholds=[0.5, -1.0, None])
    given = ProbeFile(2, H, seed=22, thresholds=[0.0, None],
                      extra_metadata={"score_buckets": "[-2, -0.5, 0, 0.5, 2]"})
    rng = np.random.default_rng(3)
    with server.client() as c:
        for name, probe in (("raw_derived", derived), ("raw_given", given)):
            info = c.load_probe_set(name, data=probe.data)
            if name == "raw_given":
                assert info.score_bucket_bounds == [-2, -0.5, 0, 0.5, 2]
            else:
                # [lo - w, hi + w] in twentieths: lo = -1, hi = 0.5, w = 1.5.
                bounds = info.score_bucket_bounds
                assert len(bounds) == 20 and bounds[0] == pytest.approx(-2.5 + 0.225)
                assert bounds[-1] == pytest.approx(2.0)
            recount = Recount.for_set(info)
            with c.open_session({"model": name}) as session:
                for i in range(40):
                    x = rng.standard_normal((16, H)).astype(np.float32) * 4
                    if i % 7 == 0:
                        x[3] = np.inf
                    rows = rng.integers(0, 16, size=1 + i % 11)
                    recount.add(c.score(x, rows, name, session=session).scores)
                # Streamed requests count the same way.
                stream = [score_request(x, [0, 1, 2], name, session_id=session.id)
                          for _ in range(3)]
                for result in c.score_stream(stream):
                    recount.add(result.scores)
            listed = c.probe_set_info(name)
            (labelled,) = listed.proto.outcomes_by_labels
            assert dict(labelled.labels) == {"model": name}
            assert_matches_proto(recount, labelled.outcomes, name)
            assert_matches_proto(recount, listed.outcomes, name)
            assert recount.non_finite.sum() > 0 and recount.fired.sum() > 0
            metrics = samples(server, "probesidecar_probe_")
            for p, probe_name in enumerate(probe.names):
                key = (("model", name), ("probe", probe_name), ("probe_set", name),
                       ("replica", ""))
                assert metrics[("probesidecar_probe_fired_total", key)] == recount.fired[p]
                assert metrics[("probesidecar_probe_scored_total", key)] == recount.rows
                assert metrics[("probesidecar_probe_score_count", key)] == recount.buckets[p].sum()


def test_session_label_sets_past_the_cap_count_as_other():
    x = np.random.default_rng(5).standard_normal((4, 4096)).astype(np.float32)
    with Sidecar(["--backend=cpu", "--max-session-label-sets=2"]) as s, s.client() as c:
        sessions = [c.open_session({"replica": str(i)}) for i in range(4)]
        assert [session.labels_folded for session in sessions] == [False, False, True, True]
        again = c.open_session({"replica": "1"})  # values seen before keep their slot
        assert not again.labels_folded
        for rows, session in zip(([0], [0, 1], [0, 1, 2], [0, 1, 2, 3]), sessions):
            c.score(x, rows, "demo", session=session)
        by_labels = {tuple(sorted(l.labels.items())): l.outcomes.rows_scored
                     for l in c.probe_set_info("demo").proto.outcomes_by_labels}
        assert by_labels == {(("replica", "0"),): 1, (("replica", "1"),): 2,
                             (("model", "_other"), ("replica", "_other")): 7}
        rows = samples(s, "probesidecar_probe_set_rows_scored_total")
        assert {dict(k)["replica"]: v for (_, k), v in rows.items()} == \
            {"0": 1, "1": 2, "_other": 7}
        for session in [*sessions, again]:
            session.close()


def test_a_reload_starts_from_zero(server):
    x = np.ones((1, H), np.float32)
    with server.client() as c:
        c.load_probe_set("reloaded", data=ProbeFile(1, H, seed=2).data)
        c.score(x, [0], "reloaded")
        assert c.probe_set_info("reloaded").outcomes.rows_scored == 1
        c.load_probe_set("reloaded", data=ProbeFile(1, H, seed=2).data, replace=True)
        assert c.probe_set_info("reloaded").outcomes.rows_scored == 0
        c.unload_probe_set("reloaded")
    assert not [k for _, k in samples(server, "probesidecar_probe_scored_total")
                if dict(k).get("probe_set") == "reloaded"]


def test_a_set_not_counted_has_no_outcomes_and_the_same_answers():
    """--probe-outcomes=off: the sets loaded at start and those whose load does not choose are not
    counted (no outcome series, empty outcomes); a load may turn counting on; the scores and
    fired flags are what a counted set answers; a bad choice is refused and loads nothing."""
    probe = ProbeFile(3, H, seed=31, thresholds=[0.0, 1.0, None])
    x = np.random.default_rng(7).standard_normal((8, H)).astype(np.float32) * 2
    with Sidecar(["--backend=cpu", "--probe-outcomes=off"]) as s, s.client() as c:
        assert not c.probe_set_info("demo").outcomes_counted  # loaded at start
        off = c.load_probe_set("off", data=probe.data)
        on = c.load_probe_set("on", data=probe.data, count_outcomes=True)
        assert (off.outcomes_counted, on.outcomes_counted) == (False, True)
        with pytest.raises(ValueError):
            c.load_probe_set("bad", data=probe.data, count_outcomes="yes")
        with pytest.raises(ProbeSidecarError) as refused:
            c.call(c.stub.LoadProbeSet, probes_pb2.LoadProbeSetRequest(
                name="bad", safetensors=probe.data, outcome_counting=7), c._admin_metadata)
        assert refused.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "is not an OutcomeCounting" in refused.value.message
        assert "bad" not in [i.name for i in c.list_probe_sets()]
        answers = {name: c.score(x, [0, 3, 5, 7], name) for name in ("off", "on")}
        c.score(np.ones((2, 4096), np.float32), [0, 1], "demo")
        np.testing.assert_array_equal(answers["off"].scores, answers["on"].scores)
        np.testing.assert_array_equal(answers["off"].fired, answers["on"].fired)
        assert answers["off"].fired.any()
        assert c.probe_set_info("on").outcomes.rows_scored == 4
        for name in ("off", "demo"):
            info = c.probe_set_info(name)
            assert info.outcomes.rows_scored == 0 and not list(info.outcomes.fired)
            assert not list(info.proto.outcomes_by_labels)
        scored = {dict(k)["probe_set"]: v
                  for (_, k), v in samples(s, "probesidecar_probe_set_rows_scored_total").items()}
        assert scored == {"on": 4}


def test_a_set_of_more_probes_than_the_cap_has_set_level_series_only():
    with Sidecar(["--backend=cpu", "--max-probe-labels=3"]) as s:
        with s.client() as c:
            x = np.random.default_rng(0).standard_normal((3, 4096)).astype(np.float32)
            scores = c.score(x, [0, 1, 2], "demo").scores  # demo: 4 probes > 3
            recount = Recount.for_set(c.probe_set_info("demo"))
            recount.add(scores)
        merged = recount.merged()
        metrics = samples(s, "probesidecar_probe_")
        demo = {k: v for k, v in metrics.items() if dict(k[1]).get("probe_set") == "demo"}
        probes = {dict(k[1]).get("probe") for k in demo if dict(k[1]).get("probe")}
        assert probes == {"_all"}
        key = (("model", ""), ("probe", "_all"), ("probe_set", "demo"), ("replica", ""))
        assert demo[("probesidecar_probe_scored_total", key)] == 12  # 3 rows x 4 probes
        assert demo[("probesidecar_probe_fired_total", key)] == merged.fired[0]
        assert demo[("probesidecar_probe_score_count", key)] == merged.buckets[0].sum()
        assert demo[("probesidecar_probe_set_rows_scored_total",
                     (("model", ""), ("probe_set", "demo"), ("replica", "")))] == 3


def test_probe_client_watch_shows_fire_rates(server):
    x = np.random.default_rng(9).standard_normal((8, 4096)).astype(np.float32)
    with server.client() as c:
        with c.open_session({"model": "watched"}) as session:
            for _ in range(5):
                c.score(x, list(range(8)), "demo", session=session)
    out = subprocess.run([str(CLIENT_BIN), f"--target=unix:{server.socket}", "watch",
                          "--probe-set=demo", "--interval=0.2", "--count=2"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    tables = out.stdout.split("== probe outcomes at ")
    assert len(tables) == 3, out.stdout  # (before the first) + 2 tables
    for table in tables[1:]:
        assert "demo (sigmoid, 4 probes):" in table
        for probe in ("probe_a", "probe_b", "probe_c", "probe_d"):
            assert re.search(rf"^  {probe} ", table, re.M), table
    # Nothing was scored between the two tables: no rate over the last interval.
    assert "0.0 rows/s" in tables[2]
    by_labels = subprocess.run([str(CLIENT_BIN), f"--target=unix:{server.socket}", "watch",
                                "--probe-set=demo", "--count=1", "--by-labels", "--top=2"],
                               capture_output=True, text=True, timeout=60)
    assert by_labels.returncode == 0, by_labels.stderr
    assert "demo (sigmoid, 4 probes) {model=watched}" in by_labels.stdout
    block = by_labels.stdout.split("{model=watched}")[1].split("\n\n")[0]
    assert len(re.findall(r"^  probe_[abcd] ", block, re.M)) == 2  # --top=2
    bad = subprocess.run([str(CLIENT_BIN), f"--target=unix:{server.socket}", "watch",
                          "--interval=0"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--interval" in bad.stderr


def test_a_taps_padding_rows_are_neither_scored_nor_counted(server):
    """A tap's window holds max_batch rows per step; only those each step wrote are real. Inline
    windows (host and CPU rings) send only those, so the outcomes count exactly the delivered
    records (a CUDA ring names its per-step counts: counted_rows, tests/python/test_gpu_*)."""
    torch = pytest.importorskip("torch")
    from probe_sidecar.torch import cpu_tap

    probe = ProbeFile(3, H, seed=31, thresholds=[0.0, 0.5, None])
    rng = np.random.default_rng(5)
    with server.client() as c:
        for kind in ("host", "cpu"):
            name = f"tap_{kind}"
            info = c.load_probe_set(name, data=probe.data)
            recount = Recount.for_set(info)
            if kind == "host":
                tap = c.tap(name, max_batch=8, window=3)
            else:
                tap = cpu_tap(c, name, max_batch=8, window=3, dtype=torch.float32)
            written = 0
            for step, n in enumerate([2, 5, 0, 8, 1, 3, 0]):
                x = rng.standard_normal((max(n, 1), H)).astype(np.float32)
                rows = x if kind == "host" else torch.from_numpy(x)
                count = n if kind == "host" else torch.tensor(n, dtype=torch.int32)
                tap.write(rows, count)
                tap.step()
                written += n
            tap.close()
            windows = list(tap.windows())
            records = [r for w in windows for r in w.records()]
            assert len(records) == written and all(w.error is None for w in windows)
            recount.add(np.array([r.scores for r in records]))
            assert_matches_proto(recount, c.probe_set_info(name).outcomes, name)
