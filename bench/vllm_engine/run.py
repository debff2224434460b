#!/usr/bin/env python3
"""What the vLLM plugin costs a vLLM engine on the GPU, by vLLM's own measures: tokens/s, time to
first token and inter-token latency, with the plugin (windows of K steps) and without it, in the
same run, interleaved.

    python3 bench/vllm_engine/run.py --out-dir "$OUT" --model-dir DIR     (tests/gpu/run.sh vllm)

Engines, one process each (engine_worker.py), started together and kept for the whole run:
`none V2` (no plugin: what a user runs today, on vLLM's default Model Runner V2), `none V1` (no
plugin, on the V1 model runner, which the plugin taps) and `plugin` at each window (K=16,
K=64), all on the
same random-weight Llama of Llama 3.2 1B's shape (tests/vllm/gpu_models.py), vLLM's defaults
(torch.compile, its CUDA graph mode, asynchronous scheduling), max_num_seqs 256, no MPS; the
plugin's sidecar is the real server on its CUDA backend with one probe set of P=16.

Each repetition runs every batch size on every engine, the engines in a rotated order, so that
drifts of the machine fall on all of them alike; the first repetition is a warm-up and is not
counted. A record per (engine, batch): tokens/s (median over repetitions, and each repetition's),
inter-token latency p50/p99 and time to first token p50 (pooled over the repetitions), and for the
plugin the kept ratio (its tokens/s over `none`'s) with a bootstrap 95% interval over the
repetitions, against `none V2` (`kept`) and `none V1` (`kept_vs_v1_runner`: the plugin's own
share). The correctness records of tests/vllm/test_gpu_vllm.py
(--correctness FILE) join the same results file: vllm_engine.json and .md in --out-dir.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.append(str(HERE.parent))  # bench/: receipt.py
sys.path.append(str(ROOT / "tests" / "vllm"))  # gpu_models.py
sys.path.append(str(ROOT / "tests" / "python"))  # conftest.Sidecar: the real server

import receipt  # noqa: E402

import report  # noqa: E402

P = 16


def ceilings() -> dict:
    """cudaMemcpy device-to-device (bytes read + written per second) and a large bf16 GEMM, in
    this run (torch: CUDA events, median of 10 after warm-up)."""
    import torch

    def timed(fn, reps=10):
        for _ in range(3):
            fn()
        times = []
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) * 1e-3)
        return sorted(times)[len(times) // 2]

    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy_s = timed(lambda: dst.copy_(src))
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    gemm_s = timed(lambda: a @ b)
    result = {"copy_gbps": round(2 * src.numel() / copy_s / 1e9, 1),
              "bf16_tflops": round(2 * 8192 ** 3 / gemm_s / 1e12, 1)}
    del src, dst, a, b
    torch.cuda.empty_cache()
    return result


class Engine:
    def __init__(self, name: str, window: int | None, runner: str, model: pathlib.Path,
                 env: dict, log: pathlib.Path):
        self.name, self.window, self.runner = name, window, runner
        self.log = open(log, "wb")  # noqa: SIM115 (closed in stop())
        self.process = subprocess.Popen(
            [sys.executable, str(HERE / "engine_worker.py"), str(model)], stdin=subprocess.PIPE,
            stdout=subprocess.PIPE, stderr=self.log, env=env, text=True, bufsize=1)
        self.ready: dict | None = None

    def wait_ready(self) -> dict:
        self.ready = self._read()
        return self.ready

    def _read(self) -> dict:
        line = self.process.stdout.readline()
        if not line:
            raise RuntimeError(f"engine {self.name} exited ({self.process.wait()}): see its log")
        return json.loads(line)

    def ask(self, **command) -> dict:
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._read()

    def stop(self) -> dict | None:
        final = None
        if self.process.poll() is None:
            try:
                final = self.ask(quit=True)
            except (RuntimeError, OSError, ValueError):
                pass
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        return final


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, type=pathlib.Path)
    parser.add_argument("--model-dir", required=True, type=pathlib.Path,
                        help="where gpu_models.py keeps (or makes) its models")
    parser.add_argument("--model", default="llama-1b")
    parser.add_argument("--batches", default="1,8,32,64,256")
    parser.add_argument("--windows", default="16,64")
    parser.add_argument("--reps", type=int, default=8, help="counted repetitions (plus a warm-up)")
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--output-len", type=int, default=256)
    # 260 s: under tests/gpu/run.sh's 330 s limit with a repetition (~25 s) and the engines' stop
    # (~20 s, which collects the plugin's counters) after it.
    parser.add_argument("--budget-s", type=float, default=260.0,
                        help="no repetition starts past this many seconds (at least 2 run)")
    parser.add_argument("--correctness", type=pathlib.Path,
                        help="records of tests/vllm/test_gpu_vllm.py to join")
    parser.add_argument("--server", default=os.environ.get("PROBE_SIDECAR_BIN"))
    receipt.add_arguments(parser)
    args = parser.parse_args()
    identity = receipt.from_args(args)
    import numpy as np
    import torch
    from safetensors.numpy import save

    import gpu_models

    started = time.monotonic()
    args.out_dir.mkdir(parents=True, exist_ok=True)
    doc = {"device": torch.cuda.get_device_name(0), "git": identity,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([pathlib.Path(sys.argv[0]).name] + sys.argv[1:]),
           "ceilings": ceilings(), "complete": False, "records": []}
    import vllm

    doc["vllm"] = vllm.__version__
    model = gpu_models.make(args.model_dir, args.model)
    h = gpu_models.hidden_size(args.model)
    torch.cuda.empty_cache()
    if args.server:
        os.environ["PROBE_SIDECAR_BIN"] = args.server
    from conftest import Sidecar

    batches = [int(b) for b in args.batches.split(",")]
    windows = [int(k) for k in args.windows.split(",")]
    work = pathlib.Path(tempfile.mkdtemp(prefix="vllm-engine-bench-"))
    rng = np.random.default_rng(5)
    weight = (rng.standard_normal((P, h)) / np.sqrt(h)).astype(np.float32)
    bias = (rng.standard_normal(P) * 0.1).astype(np.float32)
    runs: list[dict] = []
    engines: list[Engine] = []
    with Sidecar(["--backend=cuda", "--metrics-listen=none"]) as sidecar:
        with sidecar.client() as c:
            c.load_probe_set("bench", data=save({"weight": weight, "bias": bias}, metadata={
                "activation": "sigmoid", "thresholds": json.dumps([0.5] * P)}))
        base = {**os.environ, "TOKENIZERS_PARALLELISM": "false"}
        base.pop("PROBE_SIDECAR_VLLM", None)
        base.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
        try:
            # (window, model runner): vLLM 0.26 runs these models on its Model Runner V2 by
            # default; the plugin taps the V1 runner (and selects it), so the engine without the
            # plugin runs on both, telling the runner's share of the cost from the plugin's.
            for window, runner in [(None, "V2"), (None, "V1")] + [(k, "V1") for k in windows]:
                env = dict(base, VLLM_CACHE_ROOT=str(work / f"cache-{window}-{runner}"))
                if window is None:
                    env["VLLM_USE_V2_MODEL_RUNNER"] = "1" if runner == "V2" else "0"
                else:
                    env["PROBE_SIDECAR_VLLM"] = json.dumps({
                        "target": sidecar.uds_target, "probe_sets": ["bench"], "window": window})
                name = f"none {runner}" if window is None else f"plugin K={window}"
                engines.append(Engine(name, window, runner, model, env,
                                      args.out_dir / f"vllm_engine_{name.replace(' ', '_')}.log"))
            for engine in engines:
                ready = engine.wait_ready()
                print(f"{engine.name}: started in {ready['start_s']:.0f} s, {ready['config']}",
                      flush=True)
            doc["engine_config"] = {e.name: e.ready["config"] for e in engines}
            rep = 0
            while rep <= args.reps:
                if rep > 2 and time.monotonic() - started > args.budget_s:
                    print(f"budget: stopping after {rep - 1} counted repetitions", flush=True)
                    break
                for batch in batches:
                    order = engines[rep % len(engines):] + engines[:rep % len(engines)]
                    for engine in order:
                        result = engine.ask(batch=batch, prompt_len=args.prompt_len,
                                            output_len=args.output_len, seed=rep * 1000 + batch)
                        result.update(engine=engine.name, window=engine.window,
                                      runner=engine.runner, rep=rep, warmup=rep == 0)
                        runs.append(result)
                print(f"repetition {rep} done at {time.monotonic() - started:.0f} s", flush=True)
                rep += 1
                doc["records"] = report.records(runs, args.model, doc["engine_config"])
                report.write(doc, args.out_dir, args.correctness)
        finally:
            doc["plugin_state"] = {e.name: (e.stop() or {}).get("plugin_state") for e in engines}
    doc["complete"] = True
    doc["records"] = report.records(runs, args.model, doc["engine_config"])
    path = report.write(doc, args.out_dir, args.correctness)
    print(path.with_suffix(".md").read_text(), flush=True)
    # Each run in brief (the latencies' percentiles, not every token's), beside the records.
    brief = [{k: v for k, v in r.items() if k not in ("itl_us", "ttft_ms")}
             | {"itl_us_p50": report._pct(r["itl_us"], 50),
                "itl_us_p99": report._pct(r["itl_us"], 99),
                "ttft_ms_p50": report._pct(r["ttft_ms"], 50)} for r in runs]
    (args.out_dir / "vllm_engine_runs.json").write_text(json.dumps(brief, indent=0))
    return 0


if __name__ == "__main__":
    sys.exit(main())
