"""Metrics on the CUDA backend: the stages the CUDA executor times with events (staging, kernel)
appear with their kernel path, and the buffer, IPC-handle, graph-cache and device-memory metrics
follow what the server holds.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1).
"""

from __future__ import annotations

import re
import urllib.request

import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402

H = 4096
P = 16
CUDA_PATHS = {"fused_cuda", "fused_tc", "gather_gemm", "gather_wgmma"}
STAGE = "probesidecar_score_stage_duration_seconds"


@pytest.fixture(scope="module")
def sidecar():
    # Every request timed (the default --gpu-timing-every=1), so every stage has every request.
    with Sidecar(["--backend=cuda", "--gpu-timing-every=1"]) as s:
        with s.client() as c:
            c.load_probe_set("gpu_m16", data=bf16_tensor_file(*bf16_probes(P, H, device="cpu")))
        yield s
        assert s.process.poll() is None, s.log()


# The GPU machine's Python has torch and grpcio but not necessarily prometheus_client: a minimal
# reader of the text format (test_metrics.py checks the format itself with prometheus_client).
_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})? (?P<value>\S+)$')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape(sidecar) -> list[tuple[str, dict, float]]:
    url = f"http://{sidecar.metrics_address}/metrics"
    text = urllib.request.urlopen(url, timeout=10).read().decode()
    samples = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        assert m, line
        samples.append((m["name"], dict(_LABEL.findall(m["labels"] or "")), float(m["value"])))
    return samples


# The families the CUDA backend labels by device (one series per served GPU, device="0" here).
PER_DEVICE = {"probesidecar_registered_buffers", "probesidecar_registered_buffer_bytes",
              "probesidecar_ipc_handles_open", "probesidecar_device_memory_bytes",
              "probesidecar_stream_slots_parked", "probesidecar_device_up"} | {
    f"probesidecar_graph_cache_{n}" for n in
    ("entries", "capacity", "hits_total", "misses_total", "captures_total", "evictions_total")}


def value(samples, name, **labels) -> float:
    if name in PER_DEVICE:
        labels.setdefault("device", "0")
    found = [v for n, l, v in samples if n == name and l == labels]
    assert len(found) <= 1, (name, labels)
    return found[0] if found else 0.0


def stage_counts(samples, probe_set: str) -> dict[tuple[str, str], float]:
    return {(l["stage"], l["kernel_path"]): v for n, l, v in samples
            if n == STAGE + "_count" and l["probe_set"] == probe_set}


def check_histograms(samples) -> None:
    """Buckets cumulative, +Inf == _count, for every histogram series."""
    series: dict[tuple, list] = {}
    counts = {}
    for n, l, v in samples:
        if n.endswith("_bucket"):
            key = (n[: -len("_bucket")], tuple(sorted((k, x) for k, x in l.items() if k != "le")))
            series.setdefault(key, []).append((float(l["le"]), v))
        elif n.endswith("_count"):
            counts[(n[: -len("_count")], tuple(sorted(l.items())))] = v
    assert series
    for key, buckets in series.items():
        values = [c for _, c in sorted(buckets)]
        assert values == sorted(values), key
        assert values[-1] == counts[key], key


def test_cuda_stages_appear_with_their_kernel_path(sidecar):
    x = torch.randn(1024, H, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(3, P, device="cuda", dtype=torch.float32)
    with TorchClient(sidecar.uds_target) as tc:
        paths = set()
        # Scores come back inline (the kernels write them into mapped host memory: no separate
        # device-to-host stage), or into a registered buffer.
        for _ in range(20):
            paths.add(tc.score(x, [0, 5, 1023], "gpu_m16").kernel_path)
        for _ in range(5):
            tc.score(x, [1, 2, 3], "gpu_m16", out=out)
        fams = scrape(sidecar)
    assert paths <= CUDA_PATHS and len(paths) == 1, paths
    (path,) = paths
    counts = stage_counts(fams, "gpu_m16")
    assert counts[("total", path)] == 25
    assert counts[("queue", path)] == 25
    assert counts[("staging", path)] == 25
    assert counts[("kernel", path)] == 25
    assert {stage for stage, _ in counts} == {"queue", "staging", "kernel", "total"}
    assert value(fams, "probesidecar_rpc_duration_seconds_count", rpc="Score",
                 probe_set="gpu_m16", kernel_path=path) == 25
    check_histograms(fams)

    def mean(stage):
        labels = dict(stage=stage, probe_set="gpu_m16", kernel_path=path)
        return value(fams, STAGE + "_sum", **labels) / value(fams, STAGE + "_count", **labels)

    # GPU times from events: positive, and inside the request's server-side total.
    for stage in ("staging", "kernel"):
        assert 0 < mean(stage) < mean("total"), (stage, mean(stage), mean("total"))
    (build,) = [l for n, l, _ in fams if n == "probesidecar_build_info"]
    assert build["backend"] == "cuda" and build["device"] and build["cuda_runtime"]


def test_buffer_ipc_graph_and_memory_metrics(sidecar):
    before = scrape(sidecar)
    x = torch.randn(512, H, device="cuda", dtype=torch.bfloat16)
    with TorchClient(sidecar.uds_target) as tc:
        for _ in range(10):
            tc.score(x, [7, 8], "gpu_m16")
        during = scrape(sidecar)
    after = scrape(sidecar)

    def delta(name, a=before, b=during):
        return value(b, name) - value(a, name)

    assert delta("probesidecar_registered_buffers") == 1
    assert delta("probesidecar_registered_buffer_bytes") >= x.nbytes
    assert value(during, "probesidecar_ipc_handles_open") >= 1
    # The session's end released the registration.
    assert value(after, "probesidecar_registered_buffers") == value(before,
                                                                   "probesidecar_registered_buffers")
    # One shape: at most one capture per stream slot (4), the rest replays.
    captures = delta("probesidecar_graph_cache_captures_total")
    assert captures <= 4
    assert delta("probesidecar_graph_cache_hits_total") >= 10 - captures
    assert 1 <= value(during, "probesidecar_graph_cache_entries") <= value(
        during, "probesidecar_graph_cache_capacity")
    assert value(during, "probesidecar_device_memory_bytes") > 0
    assert value(during, "probesidecar_cuda_errors_total") == 0
