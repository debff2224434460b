"""probe-bench, the load generator, against the real server (CPU backend) and the bare echo
server: open-loop rates are met, every call is counted exactly as the server counts it, requests
over --max-outstanding are reported as not sent, and the JSON, the CSV and the receipts agree."""

from __future__ import annotations

import csv
import json
import os
import pathlib
import re
import subprocess
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BIN, Sidecar

BENCH_BIN = pathlib.Path(os.environ.get("PROBE_BENCH_BIN", BIN.parent / "probe-bench")).resolve()
ECHO_BIN = pathlib.Path(
    os.environ.get("PROBE_ECHO_SERVER_BIN", BIN.parent / "probe-echo-server")).resolve()
FAKE_GIT = "0123456789abcdef0123456789abcdef01234567"
SMALL = ["--rows=1", "--probes=1", "--hidden=64"]
HAS_GPU = pathlib.Path("/dev/nvidiactl").exists()


@pytest.fixture(scope="module", autouse=True)
def built():
    for path in (BENCH_BIN, ECHO_BIN):
        if not path.exists():
            pytest.fail(f"{path} is missing: build the probe-bench and probe-echo-server targets "
                        "(PROBESIDECAR_BUILD_BENCH=ON), or set PROBE_BENCH_BIN and "
                        "PROBE_ECHO_SERVER_BIN")


@pytest.fixture(scope="module")
def echo_server(tmp_path_factory):
    socket = tmp_path_factory.mktemp("echo") / "echo.sock"
    process = subprocess.Popen([str(ECHO_BIN), f"--listen=unix:{socket}"],
                               stderr=subprocess.PIPE, text=True)
    assert "serving on" in process.stderr.readline()
    yield f"unix:{socket}"
    process.terminate()
    assert process.wait(timeout=30) == 0


def bench(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    environment = {k: v for k, v in os.environ.items() if k != "PROBE_SIDECAR_GIT"}
    environment.update(env or {})
    return subprocess.run([str(BENCH_BIN), *args], capture_output=True, text=True, timeout=120,
                          env=environment)


def run_ok(*args: str, **kwargs) -> subprocess.CompletedProcess:
    result = bench(*args, **kwargs)
    assert result.returncode == 0, result.stderr
    return result


def server_counts(sidecar, rpc: str) -> dict[str, float]:
    """The server's own count of answered calls of `rpc`, by status code."""
    text = urllib.request.urlopen(f"http://{sidecar.metrics_address}/metrics", timeout=10).read()
    counts = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            if (sample.name == "probesidecar_rpc_requests_total"
                    and sample.labels["rpc"] == rpc and sample.value):
                counts[sample.labels["code"]] = sample.value
    return counts


def counted_between(before: dict[str, float], after: dict[str, float]) -> dict[str, int]:
    delta = {code: int(after[code] - before.get(code, 0)) for code in after}
    return {code: n for code, n in delta.items() if n}


def client_counts(record: dict) -> dict[str, int]:
    return {code: n for code, n in {"OK": record["ok"], **record["errors"]}.items() if n}


def measure(sidecar, rpc: str, out: pathlib.Path, *args: str) -> tuple[dict, dict[str, int], str]:
    """Runs probe-bench for one record, written to `out`; returns the record, what the server
    counted meanwhile, and probe-bench's stderr."""
    before = server_counts(sidecar, rpc)
    result = run_ok(*args, f"--git={FAKE_GIT}", f"--out={out}")
    counted = counted_between(before, server_counts(sidecar, rpc))
    records = json.loads(out.read_text())["records"]
    assert len(records) == 1
    return records[0], counted, result.stderr


def check_latency(record: dict) -> None:
    lat = record["latency_us"]
    assert 0 < lat["p50"] <= lat["p90"] <= lat["p99"] <= lat["p99_9"]


@pytest.fixture
def out(tmp_path):
    return tmp_path / "out.json"


def test_open_loop_meets_its_rate_and_counts_what_the_server_counts(sidecar, out, tmp_path):
    csv_path = tmp_path / "out.csv"
    record, counted, stderr = measure(
        sidecar, "Score", out, f"--target={sidecar.uds_target}", "--modes=score_inline", *SMALL,
        "--rate=300", "--arrivals=constant", "--seconds=3", "--warmup=0", "--bad-fraction=0.1",
        f"--csv={csv_path}", "--server-label=after")
    assert record["impl"] == "score_inline" and record["server_label"] == "after"
    assert record["shape"] == {"R": 1, "H": 64, "P": 1, "rate": 300.0, "arrivals": "constant",
                               "transport": "uds"}
    # A constant schedule of 300/s for 3 s: 900 sends, every one sent and answered.
    assert record["scheduled"] == 900 and record["not_sent"] == 0 and record["calls"] == 900
    assert record["offered_rps"] == pytest.approx(300)
    assert record["throughput_rps"] == pytest.approx(300, rel=0.05)
    # Every tenth call names a probe set that is not loaded: both sides count 90 NOT_FOUND.
    assert record["errors"] == {"NOT_FOUND": 90}
    assert "bench_not_loaded" in record["first_errors"]["NOT_FOUND"]
    assert client_counts(record) == counted == {"OK": 810, "NOT_FOUND": 90}
    check_latency(record)
    assert record["send_lag_us"]["p50"] >= 0
    # The progress line, once per second.
    progress = [line for line in stderr.splitlines() if "sent" in line]
    assert len(progress) >= 2, stderr
    assert re.search(r"sent \d+ +ok \d+ +errors \d+ +\d+/s +p50 \d+ us +p99 \d+ us", progress[-1])
    check_csv_matches_json(csv_path, out)


@pytest.fixture(scope="module")
def token_sidecar(tmp_path_factory):
    """A server with an admin token: over TCP, probe-bench loads its probe sets with it."""
    token = tmp_path_factory.mktemp("admin") / "token"
    token.write_text("probe-bench-admin-token-0123\n")
    with Sidecar(["--backend=cpu", f"--admin-token-file={token}"]) as s:
        s.token_file = token
        yield s


@pytest.mark.parametrize("transport", ["uds", "tcp"])
def test_closed_loop_counts_what_the_server_counts(sidecar, token_sidecar, out, transport):
    if transport == "uds":
        target, admin = sidecar.uds_target, []
    else:
        # Without an admin credential a server lets only its own user load probe sets, over its
        # Unix socket: probe-bench says so over TCP, and loads with the token where there is one.
        refused = bench(f"--target={sidecar.tcp_target}", "--modes=score_inline", *SMALL,
                        "--concurrency=1", "--seconds=0.1", "--warmup=0", "--quiet")
        assert refused.returncode != 0
        assert "PERMISSION_DENIED" in refused.stderr and "--admin-token-file" in refused.stderr
        sidecar = token_sidecar
        target, admin = sidecar.tcp_target, [f"--admin-token-file={sidecar.token_file}"]
    record, counted, stderr = measure(
        sidecar, "Score", out, f"--target={target}", "--modes=score_inline", *SMALL,
        "--concurrency=2", "--seconds=1", "--warmup=0", "--bad-fraction=0.25", "--quiet", *admin)
    assert record["shape"]["concurrency"] == 2 and record["shape"]["arrivals"] == "closed"
    assert record["shape"]["transport"] == transport
    assert record["offered_rps"] is None and record["scheduled"] is None
    assert record["calls"] > 100
    assert record["errors"]["NOT_FOUND"] == pytest.approx(record["calls"] / 4, abs=2)
    assert client_counts(record) == counted
    assert record["throughput_rps"] == pytest.approx(record["calls"] / record["seconds"])
    check_latency(record)
    assert stderr == ""  # --quiet


def test_overload_is_not_sent_and_the_schedule_holds(sidecar, out):
    heavy = [f"--target={sidecar.uds_target}", "--modes=score_inline", "--rows=64",
             "--probes=16", "--hidden=4096", "--quiet"]
    closed, _, _ = measure(sidecar, "Score", out, *heavy, "--concurrency=1", "--seconds=1",
                           "--warmup=5")
    rate = round(4 * closed["throughput_rps"])
    record, counted, _ = measure(
        sidecar, "Score", out, *heavy, f"--rate={rate}", "--arrivals=constant",
        "--max-outstanding=4", "--seconds=1", "--warmup=0")
    # Four times what one client gets through, at most 4 in flight: sends that find 4 in flight
    # are reported as not sent, never silently skipped, and the server saw exactly the others.
    # Sends that waited for a free slot instead would stretch the schedule and none would be
    # "not sent". (How late sends go out is probe-bench's send_lag_us, a measurement.)
    assert record["scheduled"] == rate
    assert record["not_sent"] > 0
    assert record["calls"] + record["not_sent"] == record["scheduled"]
    assert client_counts(record) == counted
    # Calls queue in the server: they take longer than one call alone.
    assert record["latency_us"]["p50"] > 1.5 * closed["latency_us"]["p50"]


def test_score_stream_counts_each_message_as_the_server_does(sidecar, out):
    for load in (["--concurrency=2", "--seconds=1"],
                 ["--rate=200", "--arrivals=poisson", "--seconds=1", "--max-outstanding=8"]):
        record, counted, _ = measure(
            sidecar, "ScoreStream", out, f"--target={sidecar.uds_target}",
            "--modes=score_stream", *SMALL, *load, "--warmup=0", "--bad-fraction=0.2", "--quiet")
        assert record["impl"] == "score_stream"
        assert record["errors"]["NOT_FOUND"] > 0
        assert client_counts(record) == counted
        check_latency(record)


def test_echo_modes_against_the_echo_server(echo_server, out):
    result = run_ok(f"--echo-target={echo_server}", "--modes=echo,echo_stream", *SMALL,
                    "--concurrency=1", "--rate=500", "--seconds=0.5", "--warmup=10", "--quiet",
                    f"--git={FAKE_GIT}", f"--out={out}")
    doc = json.loads(out.read_text())
    assert [(r["impl"], r["shape"]["arrivals"]) for r in doc["records"]] == [
        ("echo", "closed"), ("echo_stream", "closed"), ("echo", "poisson"),
        ("echo_stream", "poisson")]
    for record in doc["records"]:
        assert record["errors"] == {} and record["ok"] == record["calls"] > 0
        check_latency(record)
    if not HAS_GPU:  # no GPU: no ceilings, and no probe-sidecar asked
        assert doc["device"] == "none" and doc["server"] is None
        assert doc["ceilings"] == {"copy_gbps": None, "bf16_tflops": None}
    assert len(result.stdout.splitlines()) == 4


def test_results_file_names_its_commit(sidecar, tmp_path):
    out = tmp_path / "r.json"
    args = [f"--target={sidecar.uds_target}", "--modes=score_inline", *SMALL, "--concurrency=1",
            "--seconds=0.2", "--warmup=0", "--quiet", f"--out={out}"]
    for git, why in ((None, "not a full 40-character commit"),
                     (FAKE_GIT[:12], "not a full 40-character commit"),
                     (FAKE_GIT + "+dirty", "uncommitted changes")):
        result = bench(*args, *([f"--git={git}"] if git else []))
        assert result.returncode == 2 and why in result.stderr, result.stderr
        assert not out.exists()
    run_ok(*args, f"--git={FAKE_GIT}+dirty", "--allow-dirty")
    doc = json.loads(out.read_text())
    assert doc["git"] == FAKE_GIT + "+dirty"
    run_ok(*args, env={"PROBE_SIDECAR_GIT": FAKE_GIT})
    doc = json.loads(out.read_text())
    assert doc["git"] == FAKE_GIT
    assert set(doc) >= {"device", "git", "date", "command", "ceilings", "records"}
    assert doc["command"].startswith(str(BENCH_BIN)) and "--modes=score_inline" in doc["command"]
    assert doc["server"]["backend"] == "cpu" and doc["device"] == doc["server"]["device_name"]
    # Nothing written: no commit needed.
    run_ok(*args[:-1])


@pytest.mark.parametrize("flag, message", [
    ("--rate=fast", "--rate=fast: expected numbers"),
    ("--arrivals=bursty", "poisson or constant"),
    ("--modes=score_nope", "unknown mode 'score_nope'"),
    ("--max-outstanding=0", "positive integers"),
    ("--impl-suffix=_x", "--server-label"),
    ("--seconds", "needs a value"),
    ("--frobnicate=1", "unknown flag --frobnicate"),
])
def test_bad_flags_are_refused_with_a_reason(sidecar, flag, message):
    result = bench(f"--target={sidecar.uds_target}", flag)
    assert result.returncode == 2 and message in result.stderr, result.stderr


def test_help_names_every_flag():
    result = run_ok("--help")
    for flag in ("--target", "--echo-target", "--transport", "--modes", "--rows", "--probes",
                 "--hidden", "--tokens", "--bad-fraction", "--concurrency", "--rate",
                 "--arrivals", "--max-outstanding", "--connections", "--seconds", "--warmup",
                 "--timeout", "--seed", "--quiet", "--out", "--csv", "--server-label", "--git",
                 "--allow-dirty"):
        assert f"  {flag}" in result.stdout, flag
    for mode in ("echo", "echo_stream", "score_ipc", "score_inline", "score_stream",
                 "score_stream_ipc"):
        assert f" {mode}: " in result.stdout, mode
    assert "SCHEDULED" in result.stdout  # what open-loop latency is measured from


@pytest.mark.skipif(HAS_GPU, reason="a GPU is present")
def test_ipc_modes_need_a_gpu_and_say_so(sidecar):
    result = bench(f"--target={sidecar.uds_target}", "--modes=score_inline,score_ipc", *SMALL,
                   "--concurrency=1", "--seconds=0.2")
    assert result.returncode == 1 and "need a CUDA device" in result.stderr, result.stderr


def check_csv_matches_json(csv_path: pathlib.Path, json_path: pathlib.Path) -> None:
    doc = json.loads(json_path.read_text())
    rows = list(csv.DictReader(csv_path.open()))
    assert len(rows) == len(doc["records"])
    columns = {"bench": "bench", "impl": "impl", "server_label": "server_label", "dtype": "dtype",
               "transport": "shape.transport", "arrivals": "shape.arrivals", "R": "shape.R",
               "H": "shape.H", "P": "shape.P", "concurrency": "shape.concurrency",
               "rate": "shape.rate", "max_outstanding": "max_outstanding",
               "p50_us": "latency_us.p50", "p90_us": "latency_us.p90",
               "p99_us": "latency_us.p99", "p99_9_us": "latency_us.p99_9",
               "throughput_rps": "throughput_rps", "offered_rps": "offered_rps",
               "calls": "calls", "ok": "ok", "scheduled": "scheduled", "not_sent": "not_sent",
               "seconds": "seconds", "request_bytes": "request_bytes",
               "send_lag_p99_us": "send_lag_us.p99"}
    for row, record in zip(rows, doc["records"]):
        assert row["git"] == doc["git"]
        assert set(row) == {"git", "errors", *columns}
        for column, path in columns.items():
            value = record
            for key in path.split("."):
                value = value.get(key) if isinstance(value, dict) else None
            if value is None:
                assert row[column] == "", column
            elif isinstance(value, str):
                assert row[column] == value, column
            else:
                assert float(row[column]) == pytest.approx(value, rel=1e-12), column
        errors = dict(item.split("=") for item in row["errors"].split(";") if item)
        assert {code: int(n) for code, n in errors.items()} == record["errors"]
