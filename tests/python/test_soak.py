"""An overload soak against the real server (CPU backend, ~40 s): the time one scoring thread takes
per request is measured first (closed loop), then two open-loop probe-bench clients offer 4x
what that thread serves, one with patient deadlines (2 s, or ten requests' time on a slower
machine), one with impatient ones (two requests' time: less than a full queue's wait). Every
request gets exactly one answer, the clients' counts by status code are the server's (but for the
rare calls that cross their deadline in transit, counted and bounded), the queue bound refuses
(RESOURCE_EXHAUSTED) and waiting past a deadline is not run (DEADLINE_EXCEEDED), the server's
memory stays flat, and it serves normally afterwards. The load is set from the measured time so
that it overloads the server on any machine (a fixed rate did not on a faster one), with room for
the machine to run twice as fast during the soak as while it was measured (a loaded CI machine
did: 2.5x offered was then served at 0.84 of it). Figures go to
<build>/reliability/soak.json."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import threading
import time

import numpy as np

from conftest import BIN, Sidecar
from server_state import (answered_by_code, difference, metric, record_figures, rss_bytes,
                          wait_for)

BENCH_BIN = pathlib.Path(os.environ.get("PROBE_BENCH_BIN", BIN.parent / "probe-bench")).resolve()
FAKE_GIT = "0123456789abcdef0123456789abcdef01234567"
SOAK_SECONDS = 25
# Each request is R x P x H multiply-adds: 64 x 1024 x H for one client, 256 x 256 x H for the
# other (probe-bench loads their probe sets with 30 s deadlines at least, whatever the calls'
# timeout). H is 4096 (268 M, ~30-60 ms on one thread of a release build) unless that takes
# longer than REQUEST_SECONDS: then H shrinks so that a request takes about that long. A sanitized
# build on a loaded CI machine takes up to 1.5 s a request at 4096: 25 s of that hold ~50
# requests, too few for the queue to be caught at every depth (no impatient call expires).
HIDDEN = 4096
REQUEST_SECONDS = 0.08
WORKLOAD = ["--modes=score_inline", "--quiet"]
SHAPES = {"patient": ["--rows=64", "--probes=1024", "--seed=1"],
          "impatient": ["--rows=256", "--probes=256", "--seed=2"]}
OVERLOAD = 4.0  # offered / served by one scoring thread, split 2:1 between the two clients
QUEUE = 4  # --max-queued-requests
MiB = 1 << 20
# Under AddressSanitizer (the CI's asan stage runs this test against the sanitized server) freed
# memory waits in a quarantine of 256 MB by default before it is reused, so the server's RSS climbs
# by up to that much with no leak at all (once 72 MB over the 64 MB bound below). The server here
# gets a 16 MB quarantine: the bound then holds for a sanitized build too, and a per-request leak
# (hundreds of MB over this run) still fails it. A release build ignores the variable.
ASAN_QUARANTINE = {"ASAN_OPTIONS": ":".join(
    filter(None, [os.environ.get("ASAN_OPTIONS", ""), "quarantine_size_mb=16"]))}


def probe_bench(sidecar: Sidecar, name: str, args: list[str], seconds: float,
                out_dir: pathlib.Path) -> subprocess.Popen:
    """One probe-bench client; `args` name the hidden size (`--hidden=`) among the rest."""
    return subprocess.Popen(
        [str(BENCH_BIN), f"--target={sidecar.uds_target}", *WORKLOAD, *SHAPES[name], *args,
         f"--seconds={seconds}", f"--git={FAKE_GIT}", f"--out={out_dir / name}.json"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def record_of(process: subprocess.Popen, name: str, seconds: float,
              out_dir: pathlib.Path) -> dict:
    _, stderr = process.communicate(timeout=seconds + 120)
    assert process.returncode == 0, stderr
    return json.loads((out_dir / f"{name}.json").read_text())["records"][0]


def request_seconds(sidecar: Sidecar, hidden: int, out_dir: pathlib.Path) -> float:
    """What one request of the patient client's shape takes the server's one scoring thread: one
    client, each request sent when the last is answered, for 3 s after 3 untimed ones."""
    args = [f"--hidden={hidden}", "--concurrency=1", "--warmup=3", "--timeout=60"]
    record = record_of(probe_bench(sidecar, "patient", args, 3, out_dir), "patient", 3, out_dir)
    assert record["ok"] == record["calls"] > 0, record
    return record["seconds"] / record["ok"]


def request_size(sidecar: Sidecar, out_dir: pathlib.Path) -> tuple[int, float]:
    """The hidden size for the soak and what one request of it takes (see REQUEST_SECONDS)."""
    seconds = request_seconds(sidecar, HIDDEN, out_dir)
    if seconds <= REQUEST_SECONDS:
        return HIDDEN, seconds
    hidden = max(256, int(HIDDEN * REQUEST_SECONDS / seconds) // 256 * 256)
    return hidden, request_seconds(sidecar, hidden, out_dir)


def load_of(hidden: int, seconds_per_request: float) -> dict[str, list[str]]:
    """The open-loop clients' arguments: OVERLOAD times what the thread serves, the patient
    client's deadline past a full queue's wait and the impatient one's short of it."""
    capacity = 1.0 / seconds_per_request
    patient = max(2.0, 10 * seconds_per_request)
    impatient = 2 * seconds_per_request  # < (QUEUE + 1) requests' time: a full queue's wait
    open_loop = [f"--hidden={hidden}", "--arrivals=poisson", "--warmup=0"]
    return {"patient": [*open_loop, f"--rate={OVERLOAD * capacity * 2 / 3:.2f}",
                        f"--timeout={patient:.3f}"],
            "impatient": [*open_loop, f"--rate={OVERLOAD * capacity / 3:.2f}",
                          f"--timeout={impatient:.3f}"]}


def run_clients(sidecar: Sidecar, load: dict[str, list[str]], seconds: float,
                out_dir: pathlib.Path) -> dict[str, dict]:
    """Both open-loop clients at once for `seconds`; their records."""
    processes = {name: probe_bench(sidecar, name, args, seconds, out_dir)
                 for name, args in load.items()}
    return {name: record_of(process, name, seconds, out_dir)
            for name, process in processes.items()}


def by_code(record: dict) -> dict[str, int]:
    return {code: n for code, n in {"OK": record["ok"], **record["errors"]}.items() if n}


def test_overload_soak(tmp_path):
    with Sidecar(["--backend=cpu", "--cpu-threads=1", f"--max-queued-requests={QUEUE}"],
                 env=ASAN_QUARANTINE) as s:
        hidden, seconds_per_request = request_size(s, tmp_path)
        load = load_of(hidden, seconds_per_request)
        # Warm-up: each run loads (then replaces) the clients' probe sets; after two, the
        # allocator has reached its working size.
        for _ in range(2):
            run_clients(s, load, 2, tmp_path)
        assert wait_for(lambda: metric(s, "probesidecar_rpc_in_flight", rpc="Score") == 0, 10)
        pid = s.process.pid
        rss = [rss_bytes(pid)]
        before = answered_by_code(s, "Score")
        dropped_before = metric(s, "probesidecar_executor_expired_requests_total")
        stop = threading.Event()

        def sample():
            while not stop.wait(0.5):
                rss.append(rss_bytes(pid))

        sampler = threading.Thread(target=sample)
        sampler.start()
        started = time.monotonic()
        try:
            records = run_clients(s, load, SOAK_SECONDS, tmp_path)
        finally:
            stop.set()
            sampler.join()
        elapsed = time.monotonic() - started
        assert wait_for(lambda: metric(s, "probesidecar_rpc_in_flight", rpc="Score") == 0, 10)
        assert metric(s, "probesidecar_executor_queued_requests") == 0
        rss_after = rss_bytes(pid)
        server = difference(answered_by_code(s, "Score"), before)
        expired = metric(s, "probesidecar_executor_expired_requests_total") - dropped_before

        # Afterwards it serves normally, at once.
        with s.client() as c:
            start = time.monotonic()
            x = np.ones((1, 4096), np.float32)
            assert c.score(x, [0], "demo").scores.shape == (1, 4)
            recovery = time.monotonic() - start

    clients: dict[str, int] = {}
    for record in records.values():
        for code, n in by_code(record).items():
            clients[code] = clients.get(code, 0) + n
    offered = sum(r["offered_rps"] for r in records.values())
    served = clients.get("OK", 0) / SOAK_SECONDS
    # Where the two sides may differ, and only in one direction: a call the server answers just
    # before its deadline can reach its client just after (OK or RESOURCE_EXHAUSTED for the
    # server, DEADLINE_EXCEEDED for the client), and a call whose deadline passes before its
    # request has reached the server (on a starved host) is counted by its client only, as
    # DEADLINE_EXCEEDED.
    late = {code: server.get(code, 0) - clients.get(code, 0)
            for code in ("OK", "RESOURCE_EXHAUSTED")}
    late_answers = sum(late.values())
    never_arrived = sum(clients.values()) - sum(server.values())
    # Memory. Each probe-bench run begins by replacing its probe set (24 MB of weights, old and
    # new side by side for a moment): the allocator's footprint moves then, and settles within
    # seconds. Under overload it must stay bounded, and flat once settled (a request's payload is
    # 0.5-2 MB at H=4096, and ~300 requests or more arrive at any H: a leak of any per-request
    # buffer would add tens to hundreds of MB here).
    settled = rss[16]  # 8 s in
    record_figures("soak", {
        "seconds": SOAK_SECONDS, "wall_seconds": round(elapsed, 1),
        "server_flags": ["--backend=cpu", "--cpu-threads=1", f"--max-queued-requests={QUEUE}"],
        "workload": WORKLOAD, "hidden": hidden,
        "clients": {name: SHAPES[name] + load[name] for name in load},
        "seconds_per_request": round(seconds_per_request, 4),
        "offered_rps": round(offered, 1), "ok_rps": round(served, 1),
        "requests": sum(clients.values()), "client_by_code": clients, "server_by_code": server,
        "late_answers": late_answers, "never_arrived": never_arrived,
        "executor_expired": int(expired),
        "rss_mib": {"start": round(rss[0] / MiB, 1), "settled_8s": round(settled / MiB, 1),
                    "peak": round(max(rss) / MiB, 1), "after": round(rss_after / MiB, 1),
                    "every_2s": [round(r / MiB, 1) for r in rss[::4]]},
        "recovery_score_s": round(recovery, 4),
    })

    for name, record in records.items():
        # Every scheduled request was sent (none held back by --max-outstanding) and answered
        # exactly once, with some status.
        assert record["calls"] == record["scheduled"] - record["not_sent"], name
        assert sum(by_code(record).values()) == record["calls"], name
        assert record["errors"].get("RESOURCE_EXHAUSTED", 0) > 0, (name, record["errors"])
    assert set(clients) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, clients
    assert records["impatient"]["errors"].get("DEADLINE_EXCEEDED", 0) > 0
    assert served < 0.7 * offered, "the load did not exceed what the server serves"

    # The server counted the calls its clients counted, code by code, but for the two kinds of
    # difference above; those stay rare.
    assert set(server) <= {"OK", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"}, server
    assert min(late.values()) >= 0 and never_arrived >= 0, (server, clients)
    assert (server.get("DEADLINE_EXCEEDED", 0) + late_answers + never_arrived
            == clients.get("DEADLINE_EXCEEDED", 0)), (server, clients)
    assert late_answers + never_arrived <= max(3, sum(clients.values()) // 100), (server, clients)
    # Requests that waited past their deadline were not run (or stopped) by the executor.
    assert 0 < expired <= server.get("DEADLINE_EXCEEDED", 0)

    assert recovery < 30.0  # a safety net: "at once" is one Score on an idle server
    assert max(rss) - rss[0] < 64 * MiB, [round(r / MiB, 1) for r in rss]
    assert rss_after - settled < 16 * MiB, [round(r / MiB, 1) for r in rss]
