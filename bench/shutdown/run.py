#!/usr/bin/env python3
"""How long probe-sidecar takes to exit after SIGTERM, in the scenarios test_shutdown.py holds to
the promises of docs/reliability.md (tests/python/shutdown_scenarios.py): idle with what clients
leave open, loaded with more work queued than the grace period allows, and just after a 1 MiB
response. Writes bench/results/shutdown.{json,md}.

  bench/shutdown/run.py [--build DIR] [--runs-idle N] [--runs-loaded N] [--runs-large N]
                        [--json OUT.json] [--md OUT.md] [--git HASH] [--allow-dirty]

Runs the CPU backend (no GPU needed) with the Python environment the tests use (grpcio, numpy,
pytest, prometheus_client, the probe_sidecar package).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))
import receipt  # noqa: E402

IDLE_GRACE_S, LOADED_GRACE_S, LARGE_GRACE_S = 5.0, 1.0, 1.0


def device() -> str:
    model = "unknown CPU"
    for line in pathlib.Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    return f"{platform.node()}, {os.cpu_count()} CPUs: {model} (CPU backend, no GPU used)"


def summary(seconds: list[float]) -> dict:
    return {"min": round(min(seconds), 3), "median": round(statistics.median(seconds), 3),
            "max": round(max(seconds), 3)}


def record(case: str, grace: float, runs: list, **extra) -> dict:
    return {"bench": "shutdown", "impl": case, "dtype": None,
            "shape": {"backend": "cpu", "grace_s": grace, **extra.pop("shape", {})},
            "runs": len(runs), "exit_s": summary([r.seconds for r in runs]),
            "promise_s": grace + 1.0, "exit_codes": sorted({r.code for r in runs}),
            "graph_us_p50": None, "eager_us_p50": None, **extra}


def render(doc: dict) -> str:
    lines = ["# Shutdown: SIGTERM to exit", "",
             f"`{doc['command']}` at git {doc['git']}, {doc['date']}, on {doc['device']}.", "",
             "| case | grace | runs | exit min / median / max (s) | promise | exit codes | OK "
             "answers during the drain |", "|---|---|---|---|---|---|---|"]
    for r in doc["records"]:
        e = r["exit_s"]
        drained = r.get("ok_answers_during_drain")
        lines.append(f"| {r['impl']} | {r['shape']['grace_s']:g} s | {r['runs']} | "
                     f"{e['min']:.3f} / {e['median']:.3f} / {e['max']:.3f} | "
                     f"≤ {r['promise_s']:g} s | {r['exit_codes']} | "
                     f"{drained if drained is not None else '—'} |")
    lines += ["", "idle: holding a health Watch, an idle ScoreStream, an idle channel and a TCP "
              "connection that never sends. loaded: one scoring thread, "
              "6 clients with two ~0.2 s requests each in flight. large_response: SIGTERM after a "
              "1 MiB Score response the client read late, its channel closed.", ""]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--build", default=str(ROOT / "build"), help="the build directory")
    ap.add_argument("--runs-idle", type=int, default=10)
    ap.add_argument("--runs-loaded", type=int, default=8)
    ap.add_argument("--runs-large", type=int, default=16)
    ap.add_argument("--json", default=str(ROOT / "bench" / "results" / "shutdown.json"))
    ap.add_argument("--md", default=str(ROOT / "bench" / "results" / "shutdown.md"))
    receipt.add_arguments(ap)
    args = ap.parse_args()
    git = receipt.from_args(args)
    build = pathlib.Path(args.build).resolve()
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")  # the clients see GOAWAY on purpose
    os.environ["PROBE_SIDECAR_BIN"] = str(build / "bin" / "probe-sidecar")
    os.environ["PROBE_CLIENT_BIN"] = str(build / "bin" / "probe-client")
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import shutdown_scenarios as scenarios  # noqa: E402  (reads PROBE_SIDECAR_BIN)

    idle = [scenarios.idle_exit(IDLE_GRACE_S) for _ in range(args.runs_idle)]
    loaded, rows = [], None
    for _ in range(args.runs_loaded):
        run, rows = scenarios.loaded_exit(LOADED_GRACE_S, rows)
        loaded.append(run)
    large = [scenarios.large_response_exit(LARGE_GRACE_S) for _ in range(args.runs_large)]
    records = [
        record("idle", IDLE_GRACE_S, idle,
               shape={"held_open": ["health Watch", "idle ScoreStream", "idle channel",
                                    "silent TCP connection"]}),
        record("loaded", LOADED_GRACE_S, loaded,
               shape={"cpu_threads": 1, "clients": scenarios.CLIENTS, "in_flight_per_client": 2,
                      "rows_per_request": int(len(rows)), "H": scenarios.H, "P": scenarios.P},
               ok_answers_during_drain=[r.drained_ok for r in loaded],
               unanswered_calls=sum(r.unanswered for r in loaded)),
        record("large_response", LARGE_GRACE_S, large, shape={"response_bytes": 65536 * 4 * 4}),
    ]
    doc = {"device": device(), "git": git,
           "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           "command": " ".join(["bench/shutdown/run.py", *sys.argv[1:]]),
           "ceilings": {"copy_gbps": None, "bf16_tflops": None}, "records": records}
    pathlib.Path(args.json).write_text(json.dumps(doc, indent=2) + "\n")
    pathlib.Path(args.md).write_text(render(doc))
    print(render(doc))
    print(f"wrote {args.json} and {args.md}")


if __name__ == "__main__":
    main()
