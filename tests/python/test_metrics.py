"""The /metrics endpoint: the text exposition parses with prometheus_client's parser, every
documented family exists with its type, and the values move with traffic (failures included)."""

from __future__ import annotations

import math
import pathlib
import re
import threading
import time

import grpc
import numpy as np
import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from probe_files import ProbeFile
from probe_sidecar import ProbeSidecarError
from probesidecar.v1 import score_pb2, tensor_pb2
from server_state import SAFETY_S

ROOT = pathlib.Path(__file__).resolve().parents[2]
README = ROOT / "dashboards" / "README.md"
H = 64
STAGES_ON_CPU = {"queue", "kernel", "total"}
GPU_ONLY_STAGES = {"staging"}
# kLatencyBucketBounds in server/observability/metrics.h.
BUCKETS = [1e-6, 2.5e-6, 5e-6, 7.5e-6, 1e-5, 1.5e-5, 2e-5, 2.5e-5, 3e-5, 4e-5, 5e-5, 6e-5, 1e-4,
           1.5e-4, 2e-4, 2.5e-4, 3e-4, 4e-4, 5e-4, 7.5e-4, 1e-3, 1.5e-3, 2e-3, 3e-3, 5e-3, 7.5e-3,
           1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, math.inf]
RPCS = ["RegisterBuffer", "UnregisterBuffer", "ListBuffers", "OpenSession", "LoadProbeSet",
        "UnloadProbeSet", "ListProbeSets", "Score", "ScoreStream", "Verify", "ServerInfo"]


def documented_families() -> dict[str, tuple[str, set[str]]]:
    """{name: (type, labels)} from the metrics table of dashboards/README.md."""
    rows = re.findall(r"^\| `(probesidecar_\w+)` \| (\w+) \|([^|]*)\|", README.read_text(), re.M)
    assert len(rows) >= 15, "the metrics table of dashboards/README.md was not found"
    return {name: (kind, set(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows}


def scrape(sidecar) -> str:
    response = requests.get(f"http://{sidecar.metrics_address}/metrics", timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Type"].startswith("text/plain")
    return response.text


def families(sidecar) -> dict:
    """{family name as written in the exposition: Metric}; counters keep their _total."""
    out = {}
    for family in text_string_to_metric_families(scrape(sidecar)):
        name = family.name + "_total" if family.type == "counter" else family.name
        assert name not in out, f"{name} appears twice"
        out[name] = family
    return out


def value(fams, name, sample_name=None, **labels) -> float:
    """The value of the one sample of `name` with exactly these labels (0 when absent)."""
    sample_name = sample_name or name
    found = [s.value for s in fams[name].samples if s.name == sample_name and s.labels == labels]
    assert len(found) <= 1, (sample_name, labels, found)
    return found[0] if found else 0.0


def histogram_count(fams, name, **labels) -> float:
    return value(fams, name, name + "_count", **labels)


@pytest.fixture(scope="module")
def probe(sidecar):
    probe = ProbeFile(3, H, seed=11)
    with sidecar.client() as c:
        c.load_probe_set("metrics_p3", data=probe.data)
    return probe


def score(client, probe_set="metrics_p3", rows=(0, 2), t=4):
    x = np.random.default_rng(0).standard_normal((t, H)).astype(np.float32)
    return client.score(x, list(rows), probe_set)


def test_exposition_parses_and_every_documented_family_exists(sidecar, probe):
    fams = families(sidecar)
    documented = documented_families()
    # This server runs the CPU backend: the per-device families are one series without the
    # device label, and probesidecar_device_up (a series per served CUDA device) is absent
    # (test_gpu_devices.py checks them with devices).
    gpu_only = {"probesidecar_device_up"}
    for name, (kind, labels) in documented.items():
        if name in gpu_only:
            assert name not in fams, name
            continue
        assert name in fams, f"{name} is documented but not exported"
        assert fams[name].type == kind, f"{name} is a {fams[name].type}, documented as {kind}"
        for sample in fams[name].samples:
            expected = set() if labels == {"device"} else labels  # per-device: no label here
            assert set(sample.labels) - {"le"} == expected, (name, sample.labels)
    exported = {n for n in fams if n.startswith("probesidecar_")}
    assert exported == set(documented) - gpu_only, f"undocumented: {exported - set(documented)}"


def test_counters_and_histograms_move_with_traffic(sidecar, client, probe):
    before = families(sidecar)
    n = 7
    for _ in range(n):
        result = score(client)
        assert result.scores.shape == (2, 3)
    with pytest.raises(ProbeSidecarError) as unknown:
        score(client, probe_set="no_such_set_for_metrics")
    assert unknown.value.code == grpc.StatusCode.NOT_FOUND
    for _ in range(2):
        with pytest.raises(ProbeSidecarError) as bad_rows:
            score(client, rows=(0, 99))
        assert bad_rows.value.code == grpc.StatusCode.INVALID_ARGUMENT
    client.list_probe_sets()
    after = families(sidecar)

    def delta(name, **labels):
        return value(after, name, **labels) - value(before, name, **labels)

    req = "probesidecar_rpc_requests_total"
    assert delta(req, rpc="Score", code="OK") == n
    assert delta(req, rpc="Score", code="NOT_FOUND") == 1
    assert delta(req, rpc="Score", code="INVALID_ARGUMENT") == 2
    assert delta(req, rpc="ListProbeSets", code="OK") == 1
    # Every RPC has its OK series from the start (rate() must see the first requests).
    for rpc in RPCS:
        assert any(s.labels == {"rpc": rpc, "code": "OK"} for s in after[req].samples), rpc
        assert value(after, "probesidecar_rpc_in_flight", rpc=rpc) == 0

    dur = "probesidecar_rpc_duration_seconds"

    def count_delta(name, **labels):
        return histogram_count(after, name, **labels) - histogram_count(before, name, **labels)

    assert count_delta(dur, rpc="Score", probe_set="metrics_p3", kernel_path="cpu") == n
    # An unknown probe set is not a label value; a known one that failed before a kernel ran is.
    assert count_delta(dur, rpc="Score", probe_set="", kernel_path="") == 1
    assert count_delta(dur, rpc="Score", probe_set="metrics_p3", kernel_path="") == 2
    labelled_sets = {s.labels["probe_set"] for s in after[dur].samples}
    assert "no_such_set_for_metrics" not in labelled_sets

    stage = "probesidecar_score_stage_duration_seconds"
    for name in STAGES_ON_CPU:
        assert count_delta(stage, stage=name, probe_set="metrics_p3", kernel_path="cpu") == n


def test_stage_histograms_have_the_stages(sidecar, client, probe):
    for _ in range(3):
        score(client)
    fams = families(sidecar)
    stage = "probesidecar_score_stage_duration_seconds"
    labels = [s.labels for s in fams[stage].samples if s.name == stage + "_count"]
    stages = {l["stage"] for l in labels if l["probe_set"] == "metrics_p3"}
    assert stages == STAGES_ON_CPU, "the CPU backend has no staging stage"
    assert all(l["kernel_path"] == "cpu" for l in labels)
    assert not {l["stage"] for l in labels} & GPU_ONLY_STAGES

    def total(name, suffix):
        return value(fams, stage, stage + suffix, stage=name, probe_set="metrics_p3",
                     kernel_path="cpu")

    # queue + kernel happen inside total; every Score has all three.
    assert total("queue", "_sum") + total("kernel", "_sum") <= total("total", "_sum") * 1.001
    assert total("queue", "_count") == total("kernel", "_count") == total("total", "_count")
    assert 0 < total("total", "_sum") / total("total", "_count") < 1.0
    dur = "probesidecar_rpc_duration_seconds"
    assert value(fams, dur, dur + "_count", rpc="Score", probe_set="metrics_p3",
                 kernel_path="cpu") == total("total", "_count")


def check_histograms(fams):
    for name in ("probesidecar_rpc_duration_seconds", "probesidecar_score_stage_duration_seconds"):
        series: dict[tuple, dict] = {}
        for s in fams[name].samples:
            key = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
            entry = series.setdefault(key, {"buckets": []})
            if s.name == name + "_bucket":
                entry["buckets"].append((float(s.labels["le"]), s.value))
            else:
                entry[s.name[len(name):]] = s.value
        assert series, name
        for key, entry in series.items():
            buckets = sorted(entry["buckets"])
            assert [le for le, _ in buckets] == BUCKETS, (name, key)
            counts = [c for _, c in buckets]
            assert counts == sorted(counts), f"{name}{key}: buckets not cumulative: {counts}"
            assert counts[-1] == entry["_count"], f"{name}{key}: +Inf != _count"
            assert entry["_count"] > 0 and entry["_sum"] >= 0


def test_histogram_buckets_are_cumulative_and_inf_equals_count(sidecar, client, probe):
    score(client)
    check_histograms(families(sidecar))


def test_score_stream_messages_are_counted(sidecar, client, probe):
    before = families(sidecar)
    x = np.random.default_rng(1).standard_normal((4, H)).astype(np.float32)
    messages = []
    for i, set_name in enumerate(["metrics_p3", "metrics_p3", "not_loaded", "metrics_p3"]):
        request = score_pb2.ScoreRequest(probe_set=set_name, rows=[0, 1], request_id=i)
        request.activations.dtype = tensor_pb2.DTYPE_FLOAT32
        request.activations.shape[:] = [4, H]
        request.activations.data = x.tobytes()
        messages.append(request)
    results = list(client.score_stream(messages))
    assert [isinstance(r, ProbeSidecarError) for r in results] == [False, False, True, False]
    after = families(sidecar)
    req = "probesidecar_rpc_requests_total"
    ok = value(after, req, rpc="ScoreStream", code="OK") - value(before, req, rpc="ScoreStream",
                                                                  code="OK")
    not_found = (value(after, req, rpc="ScoreStream", code="NOT_FOUND")
                 - value(before, req, rpc="ScoreStream", code="NOT_FOUND"))
    assert (ok, not_found) == (3, 1)
    dur = "probesidecar_rpc_duration_seconds"
    assert (histogram_count(after, dur, rpc="ScoreStream", probe_set="metrics_p3", kernel_path="cpu")
            - histogram_count(before, dur, rpc="ScoreStream", probe_set="metrics_p3",
                              kernel_path="cpu")) == 3


def test_build_info_and_state(sidecar, client, probe):
    info = client.server_info()
    fams = families(sidecar)
    build = fams["probesidecar_build_info"].samples
    assert len(build) == 1 and build[0].value == 1
    labels = build[0].labels
    assert labels["version"] == info.version and labels["version"]
    assert labels["git_commit"] == info.git_commit and labels["git_commit"]
    assert labels["cuda_runtime"] == info.cuda_runtime
    assert labels["device"] == info.device_name and labels["device"]
    assert labels["backend"] == info.backend == "cpu"

    loaded = len(client.list_probe_sets())
    assert value(fams, "probesidecar_probe_sets_loaded") == loaded
    extra = ProbeFile(1, H, seed=12)
    client.load_probe_set("metrics_extra", data=extra.data)
    assert value(families(sidecar), "probesidecar_probe_sets_loaded") == loaded + 1
    client.unload_probe_set("metrics_extra")
    assert value(families(sidecar), "probesidecar_probe_sets_loaded") == loaded

    # The CPU backend has no buffers, IPC handles, device memory or graphs.
    for name in ("probesidecar_registered_buffers", "probesidecar_registered_buffer_bytes",
                 "probesidecar_ipc_handles_open", "probesidecar_device_memory_bytes",
                 "probesidecar_graph_cache_entries", "probesidecar_graph_cache_hits_total",
                 "probesidecar_graph_cache_misses_total", "probesidecar_graph_cache_captures_total",
                 "probesidecar_cuda_errors_total"):
        assert value(fams, name) == 0, name
    start = value(fams, "probesidecar_start_time_seconds")
    assert time.time() - info.uptime_seconds - 5 < start <= time.time()


def test_unknown_probe_set_names_do_not_grow_the_label_set(sidecar, client, probe):
    for i in range(20):
        with pytest.raises(ProbeSidecarError):
            score(client, probe_set=f"made_up_{i}")
    fams = families(sidecar)
    loaded = {s.name for s in client.list_probe_sets()}
    for name in ("probesidecar_rpc_duration_seconds", "probesidecar_score_stage_duration_seconds"):
        sets = {s.labels["probe_set"] for s in fams[name].samples}
        assert sets <= loaded | {"", "metrics_extra"}, sets - loaded


def test_scrapes_during_concurrent_traffic_stay_consistent(sidecar, probe):
    stop = threading.Event()
    errors = []

    def drive():
        try:
            with sidecar.client() as c:
                while not stop.is_set():
                    score(c)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    threads = [threading.Thread(target=drive) for _ in range(4)]
    for t in threads:
        t.start()
    try:
        # Scrapes until at least ten were taken and the count has moved (however slow the
        # machine); every one of them must be consistent.
        counts = []
        deadline = time.monotonic() + SAFETY_S
        while len(counts) < 10 or (counts[-1] == counts[0] and time.monotonic() < deadline):
            fams = families(sidecar)
            check_histograms(fams)
            for s in fams["probesidecar_rpc_in_flight"].samples:
                assert s.value >= 0
            counts.append(value(fams, "probesidecar_rpc_requests_total", rpc="Score", code="OK"))
            time.sleep(0.05)
    finally:
        stop.set()
        for t in threads:
            t.join()
    assert not errors, errors
    assert counts == sorted(counts) and counts[-1] > counts[0]
