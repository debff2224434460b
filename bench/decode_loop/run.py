#!/usr/bin/env python3
"""The decode-loop benchmark: what scoring every decode step with P=16 probes costs a ~1B-parameter
Llama-style model's CUDA-graphed greedy decode loop (or its eager loop, --modes), with no scoring,
an in-process tap, and the sidecar through a tap (one Score per window of K steps; variants.py
lists every variant), with and without MPS. `kept` is measured against the loop without MPS and
without scoring (what a user runs today without the sidecar), and against the same MPS setting.

    python3 bench/decode_loop/run.py --out-dir "$OUT"           # full: about 6 min on an H200
    python3 bench/decode_loop/run.py --out-dir "$OUT" --quick   # smoke: about 1 min

For each MPS setting (without first) it starts, in this order: the MPS control daemon (private
pipe and log directories; none without MPS), the real sidecar (--backend=cuda on a private Unix
socket) and one worker process (worker.py) with the daemon's environment; then stops them. Every
timed run becomes a JSON line; decode_loop.json, .md and .png in --out-dir are rendered from
them as they arrive, so a run stopped early still leaves what it measured.

Needs the probe-sidecar binary ($PROBE_SIDECAR_BIN or --server), the Python client on
PYTHONPATH, torch with CUDA, transformers, nvidia-cuda-mps-control, and a receipt
($PROBE_SIDECAR_GIT or a clean checkout; bench/receipt.py). Exits 1 when a check or a step failed.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import pathlib
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))  # bench/: receipt.py (after this folder)

import receipt  # noqa: E402

import mps  # noqa: E402
import results  # noqa: E402

QUICK = dict(batches="8", steps=64, graph_reps=2, eager_reps=1, budget_s=80)
FULL = dict(batches="1,8,32,64", steps=256, graph_reps=3, eager_reps=2, budget_s=330)
FINAL_S = 6.0  # kept for the last render
GRACE_S = 20.0  # past its deadline, a worker is stopped
RENDER_EVERY_S = 20.0
SERVER_FLAGS = ["--backend=cuda", "--metrics-listen=none", "--warmup-rows=1,8,32,64"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="where decode_loop.{json,md,png} go")
    parser.add_argument("--quick", action="store_true",
                        help=f"a smoke run: {QUICK} (explicit flags still win)")
    parser.add_argument("--batches", help=f"default {FULL['batches']}")
    parser.add_argument("--modes", default="graph",
                        help="graph and/or eager (eager steps are host-bound and noisy: see "
                             "docs/benchmarks.md)")
    parser.add_argument("--variants", help="comma-separated, see variants.py (default: "
                                           "none, in_process, tap_k1/4/16/64, tap_k16/64_graph, "
                                           "tap_k16_host)")
    parser.add_argument("--profile", action="store_true",
                        help="profile the plain graphed step's kernels at the first batch, for "
                             "each MPS setting")
    parser.add_argument("--steps", type=int, help=f"decode steps per run (default {FULL['steps']})")
    parser.add_argument("--graph-reps", type=int, help="repeats per variant, graph mode")
    parser.add_argument("--eager-reps", type=int, help="repeats per variant, eager mode")
    parser.add_argument("--budget-s", type=float,
                        help=f"wall-time budget of the whole run (default {FULL['budget_s']} s)")
    parser.add_argument("--mps", choices=("both", "on", "off"), default="both")
    parser.add_argument("--server", default=os.environ.get("PROBE_SIDECAR_BIN",
                                                           "build/bin/probe-sidecar"))
    parser.add_argument("--runs", help="keep the raw JSON lines here (default: a temporary file)")
    parser.add_argument("--render", metavar="RUNS",
                        help="only render the results files from a saved --runs file")
    parser.add_argument("--cpu-dry-run", action="store_true",
                        help="no GPU, no sidecar: a tiny model with stand-ins (checks the code)")
    receipt.add_arguments(parser)
    args = parser.parse_args()
    for key, value in (QUICK if args.quick else FULL).items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if args.render:
        return finish(write_results(out_dir, pathlib.Path(args.render), args.allow_dirty,
                                    complete=True, plot=True))

    identity = receipt.from_args(args)  # refuses a dirty tree before anything runs
    scratch = tempfile.TemporaryDirectory(prefix="decode-loop-")
    runs = pathlib.Path(args.runs or os.path.join(scratch.name, "runs.jsonl"))
    runs.write_text("")
    # The receipt travels with the runs, so that --render names the code that measured them.
    append(runs, type="meta", what="orchestrator", git=identity,
           date=datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
           command=" ".join(shlex.quote(a) for a in ["python3", *sys.argv]))
    render = lambda complete, plot=True: write_results(  # noqa: E731
        out_dir, runs, args.allow_dirty, complete, plot)
    start = time.time()
    end = start + args.budget_s - FINAL_S
    settings = {"both": [False, True], "on": [True], "off": [False]}[args.mps]
    print(f"== decode_loop: git {identity}, budget {args.budget_s:.0f} s, batches {args.batches}, "
          f"{args.steps} steps, MPS {'/'.join('on' if s else 'off' for s in settings)}", flush=True)
    for i, mps_on in enumerate(settings):
        deadline = time.time() + (end - time.time()) / (len(settings) - i)
        run_setting(args, mps_on, deadline, runs, first=i == 0, render=render)
        doc = render(complete=i == len(settings) - 1)
    print(f"== decode_loop done in {time.time() - start:.0f} s", flush=True)
    scratch.cleanup()
    return finish(doc)


def run_setting(args, mps_on: bool, deadline: float, runs: pathlib.Path, first: bool,
                render) -> None:
    def fail(message: str) -> None:
        append(runs, type="error", mps=mps_on, where="orchestrator", message=message)

    with contextlib.ExitStack() as stack:  # unwinds: sidecar, then MPS daemon, then files
        try:
            env = stack.enter_context(mps.environment(mps_on and not args.cpu_dry_run))
        except (OSError, subprocess.SubprocessError) as error:
            fail(f"cannot start the MPS control daemon: {error}")
            return
        if mps_on and not args.cpu_dry_run:
            stack.callback(lambda: print(f"MPS control log (end):\n{mps.log_tail(env, 5)}",
                                         flush=True))
        tmp = pathlib.Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="decode-loop-")))
        server, target = None, "dry-run"
        if not args.cpu_dry_run:
            server, target, problem = start_server(args.server, env, tmp)
            if problem:
                fail(f"the sidecar did not start: {problem}")
                return
            stack.callback(lambda: print(f"sidecar log (end):\n{tail(tmp / 'sidecar.log', 5)}",
                                         flush=True))
            stack.callback(stop, server)  # unwinds first: stopped, then its log shown
        until = time.strftime("%H:%M:%S", time.localtime(deadline))
        print(f"== MPS {'on' if mps_on else 'off'}: worker until {until} (sidecar {target})",
              flush=True)
        command = [sys.executable, str(HERE / "worker.py"), f"--target={target}",
                   f"--mps={int(mps_on)}", f"--batches={args.batches}", f"--modes={args.modes}",
                   f"--steps={args.steps}", f"--graph-reps={args.graph_reps}",
                   f"--eager-reps={args.eager_reps}", f"--deadline={deadline}", f"--out={runs}"]
        if args.variants:
            command.append(f"--variants={args.variants}")
        if args.profile:
            command.append("--profile")
        if first:
            command.append("--ceilings")
        if args.cpu_dry_run:
            command.append("--cpu-dry-run")
        worker = subprocess.Popen(command, env=env)
        last_render = time.time()
        while worker.poll() is None:
            if time.time() > deadline + GRACE_S:
                fail(f"the worker ran past its deadline by {GRACE_S:.0f} s and was stopped")
                stop(worker)
                break
            if time.time() - last_render > RENDER_EVERY_S:
                render(complete=False, plot=False)
                last_render = time.time()
            time.sleep(0.5)
        if worker.returncode not in (0, -signal.SIGTERM):
            fail(f"the worker exited with status {worker.returncode}")
        if server is not None and server.poll() is not None:
            fail(f"the sidecar exited during the run (status {server.returncode}): "
                 f"{tail(tmp / 'sidecar.log')}")


def start_server(binary: str, env: dict, tmp: pathlib.Path, flags: list[str] | None = None):
    """(process, target, problem): the sidecar on a private socket, started with `env` and
    SERVER_FLAGS, `flags` after them (a later flag wins)."""
    socket, log = tmp / "sidecar.sock", tmp / "sidecar.log"
    probes = tmp / "probes"  # empty: the benchmark loads its own probe set
    probes.mkdir()
    argv = [binary, *SERVER_FLAGS, *(flags or []), f"--listen=unix:{socket}", f"--probes={probes}"]
    try:
        with open(log, "wb") as sink:  # the child keeps its own descriptor
            process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    except OSError as error:
        return None, "", f"{argv[0]}: {error}"
    # A safety net far past a start (a loaded CI machine's included); it returns once serving.
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if re.search(r"serving on", log.read_text(errors="replace")):
            return process, f"unix://{socket}", None
        if process.poll() is not None:
            return None, "", f"exited with {process.returncode}: {tail(log)}"
        time.sleep(0.05)
    stop(process)
    return None, "", f"not serving after 300 s: {tail(log)}"


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def tail(path: pathlib.Path, lines: int = 15) -> str:
    try:
        return "".join(path.read_text(errors="replace").splitlines(True)[-lines:])
    except OSError:
        return ""


def append(path: pathlib.Path, **line) -> None:
    with open(path, "a") as f:
        f.write(json.dumps(line) + "\n")


def write_results(out_dir: pathlib.Path, runs: pathlib.Path, allow_dirty: bool, complete: bool,
                  plot: bool) -> dict:
    """Renders the results files from the runs so far; `complete` is false while more may come
    (a run stopped early leaves the partial files)."""
    lines = results.read_lines(str(runs))
    head = next((line for line in lines if line.get("what") == "orchestrator"), None)
    if head is None:
        raise SystemExit(f"{runs}: no orchestrator line, so no receipt: not a --runs file")
    identity = receipt.check(receipt.identify(head["git"]), allow_dirty)
    doc = results.document(lines, git=identity, date=head["date"], command=head["command"])
    doc["server_flags"] = SERVER_FLAGS
    doc["complete"] = complete
    (out_dir / "decode_loop.json").write_text(json.dumps(doc, indent=1) + "\n")
    (out_dir / "decode_loop.md").write_text(results.markdown(doc))
    if plot and not results.plot(doc, str(out_dir / "decode_loop.png")):
        print("matplotlib is missing: no decode_loop.png", flush=True)
    return doc


def finish(doc: dict) -> int:
    md = results.markdown(doc)
    print(md[md.find("## Targets"):] if "## Targets" in md else md, flush=True)
    reasons = results.failed(doc)
    for reason in reasons:
        print(f"FAILED: {reason}", flush=True)
    return 1 if reasons else 0


if __name__ == "__main__":
    sys.exit(main())
