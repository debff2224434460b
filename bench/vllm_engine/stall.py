#!/usr/bin/env python3
"""What a sidecar that stops, dies or restarts costs a vLLM engine with the plugin: tokens/s of
the engine's steps (LLMEngine, as LLM.generate() steps it) with the sidecar running, stopped
(SIGSTOP) for the whole run, and killed at the run's start and started again during it; and the
rows scored and lost in each. Phases interleaved, repeated.

    python bench/vllm_engine/stall.py --out-dir DIR [--reps 3]

Runs on vLLM's CPU build (tests/vllm/setup.sh) with a tiny random Llama and the real sidecar on
its CPU backend (the plugin's inline taps), or on a GPU with vLLM's CUDA build (CUDA taps: a
restarted sidecar is not bound again there, docs/vllm.md). Writes vllm_stall.json (records of
bench `vllm_stall`: impl `plugin`, shape {phase}, tokens_per_s per repetition and their median,
rows_scored, rows_lost) and a line per run on stdout. The engine runs in this process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so that the plugin's state is read between phases.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import signal
import statistics
import sys
import tempfile
import threading
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.append(str(HERE.parent))  # bench/: receipt.py
sys.path.append(str(ROOT / "tests" / "python"))  # conftest.Sidecar, probe_files

import receipt  # noqa: E402

H, BATCH, TOKENS = 128, 8, 400
PHASES = ("running", "stopped", "restarted")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out-dir", required=True, type=pathlib.Path)
    parser.add_argument("--reps", type=int, default=3)
    receipt.add_arguments(parser)
    args = parser.parse_args()
    identity = receipt.from_args(args)
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    import numpy as np
    import torch
    import transformers
    from conftest import Sidecar
    from probe_files import ProbeFile

    work = pathlib.Path(tempfile.mkdtemp(prefix="vllm-stall-"))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=H, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=512)
    transformers.LlamaForCausalLM(config).save_pretrained(work / "model")
    (work / "probes").mkdir()
    (work / "probes" / "stall.safetensors").write_bytes(
        ProbeFile(4, H, seed=3, activation="none", thresholds=[0, 0, 0, 0]).data)
    flags = ["--backend=auto", f"--probes={work / 'probes'}", "--metrics-listen=none"]
    servers = [Sidecar(flags, workdir=work).start()]
    os.environ["PROBE_SIDECAR_VLLM"] = json.dumps({
        "target": servers[0].uds_target, "probe_sets": ["stall"], "window": 4,
        "max_window_s": 0.5})
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import probe_sidecar.vllm as plugin

    llm = LLM(model=str(work / "model"), skip_tokenizer_init=True, dtype="float32",
              max_num_seqs=BATCH, max_model_len=512, gpu_memory_utilization=0.2, seed=0)
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=TOKENS, temperature=0, ignore_eos=True, detokenize=False)
    runs = []

    def counters():
        (state,) = plugin.state(llm)
        return {k: state.get(k, 0) for k in ("rows_delivered", "rows_lost", "windows_lost",
                                              "windows_failed", "recoveries")}

    try:
        for rep in range(args.reps + 1):  # the first: a warm-up, not counted
            for phase in PHASES:
                prompts = [TokensPrompt(prompt_token_ids=rng.integers(5, 500, 16).tolist())
                           for _ in range(BATCH)]
                before = counters()
                timer = None
                if phase == "stopped":
                    servers[-1].pause()
                elif phase == "restarted":
                    servers[-1].signal(signal.SIGKILL)
                    servers[-1].wait()
                    # Started again while the engine generates.
                    timer = threading.Timer(0.1, lambda: servers.append(
                        Sidecar(flags, workdir=work).start()))
                    timer.start()
                # The engine's own steps are timed (LLMEngine, as generate() steps it); the
                # summaries are collected after, untimed.
                engine = llm.llm_engine
                started = time.perf_counter()
                for i, p in enumerate(prompts):
                    engine.add_request(f"{phase}{rep}_{i}", p, params)
                tokens = 0
                while engine.has_unfinished_requests():
                    tokens += sum(len(o.outputs[0].token_ids) for o in engine.step()
                                  if o.finished)
                wall = time.perf_counter() - started
                if phase == "stopped":
                    servers[-1].resume()
                if timer is not None:
                    timer.join()
                plugin.collect(llm, timeout=60)  # every window of the run delivered
                after = counters()
                run = {"rep": rep, "phase": phase, "tokens_per_s": tokens / wall,
                       "rows_scored": after["rows_delivered"] - before["rows_delivered"],
                       "rows_lost": after["rows_lost"] - before["rows_lost"],
                       "windows_lost": after["windows_lost"] - before["windows_lost"],
                       "windows_failed": after["windows_failed"] - before["windows_failed"],
                       "rows_expected": tokens}
                runs.append(run)
                print(json.dumps(run), flush=True)
    finally:
        for server in servers:
            if server.process is not None and server.process.poll() is None:
                server.signal(signal.SIGCONT)
            server.stop()
    records = []
    for phase in PHASES:
        mine = [r for r in runs if r["phase"] == phase and r["rep"] > 0]
        records.append({
            "bench": "vllm_stall", "impl": "plugin", "dtype": "fp32",
            "shape": {"phase": phase, "batch": BATCH, "tokens": TOKENS, "window": 4},
            "graph_us_p50": None, "eager_us_p50": None,
            "tokens_per_s": round(statistics.median(r["tokens_per_s"] for r in mine), 1),
            "tokens_per_s_runs": [round(r["tokens_per_s"], 1) for r in mine],
            **{k: sum(r[k] for r in mine) for k in ("rows_expected", "rows_scored", "rows_lost",
                                                      "windows_lost", "windows_failed")}})
    device = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "CPU"
    doc = {"device": device, "git": identity,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([pathlib.Path(sys.argv[0]).name] + sys.argv[1:]),
           "ceilings": {"copy_gbps": None, "bf16_tflops": None}, "records": records}
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "vllm_stall.json").write_text(json.dumps(doc, indent=1) + "\n")
    for r in records:
        print(r["shape"]["phase"], r["tokens_per_s"], r["tokens_per_s_runs"], "scored",
              r["rows_scored"], "lost", r["rows_lost"], "of", r["rows_expected"])
    return 0


if __name__ == "__main__":
    sys.exit(main())
