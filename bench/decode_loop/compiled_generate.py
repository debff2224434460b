#!/usr/bin/env python3
"""What the tap costs a compiled decode loop: transformers' generate(cache_implementation="static")
on a GPU compiles the decode forward with torch.compile(mode="reduce-overhead") (CUDA graphs), the
way a user runs it without the sidecar. The same ~1.2B random Llama (Llama 3.2 1B's shape, bf16)
generates with and without a tap on its final norm (the tap operator inside the compiled graph,
P=16 probes scored on the sidecar every K=16 steps, no MPS), interleaved, repeated; tokens/s of
each and kept = tap / none.

    python3 bench/decode_loop/compiled_generate.py --out bench/results/compiled_generate.json
    python3 bench/decode_loop/compiled_generate.py --render bench/results/compiled_generate.json
                                                   (writes the .md next to it)

`none` is the model with the tap's hook paused (traced to nothing: its compiled graph has no tap
kernel) and generate() without the tap's step counter: what the user runs without the sidecar.
Needs the probe-sidecar binary ($PROBE_SIDECAR_BIN), the Python client, torch with CUDA,
transformers, and a receipt ($PROBE_SIDECAR_GIT or a clean checkout; bench/receipt.py).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.append(str(HERE.parent))

import receipt  # noqa: E402


def start_sidecar(binary: str, workdir: str) -> tuple[subprocess.Popen, str]:
    socket = os.path.join(workdir, "sidecar.sock")
    log = open(os.path.join(workdir, "sidecar.log"), "wb")
    process = subprocess.Popen([binary, f"--listen=unix:{socket}", "--backend=cuda",
                                "--metrics-listen=none", "--warmup-rows=none"],
                               stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if b"serving on" in open(log.name, "rb").read():
            return process, f"unix://{socket}"
        if process.poll() is not None:
            break
        time.sleep(0.1)
    raise SystemExit(f"probe-sidecar did not start:\n{open(log.name).read()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", help="the results JSON to write")
    parser.add_argument("--render", help="a results JSON to render as markdown next to it")
    parser.add_argument("--batches", default="8,64")
    parser.add_argument("--new-tokens", type=int, default=512)
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--window", type=int, default=16)
    parser.add_argument("--server", default=os.environ.get("PROBE_SIDECAR_BIN", "probe-sidecar"))
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args()
    if args.render:
        doc = json.loads(pathlib.Path(args.render).read_text())
        pathlib.Path(args.render).with_suffix(".md").write_text(markdown(doc))
        return 0
    if not args.out:
        parser.error("--out or --render")
    git = receipt.identify(None)
    if git.endswith("+dirty") and not args.allow_dirty:
        raise SystemExit(f"refusing to record results of a dirty tree ({git}); --allow-dirty")

    import numpy as np
    import torch

    sys.path.insert(0, str(HERE))
    import model as model_lib
    from probe_sidecar.torch import TorchClient
    from probe_sidecar.transformers import tap_model
    from safetensors.numpy import save

    probes = 16
    llm = model_lib.build(model_lib.LLAMA_1B, "cuda", torch.bfloat16, seed=0)
    llm.set_attn_implementation("sdpa")
    hidden = llm.config.hidden_size
    rng = np.random.default_rng(0)
    weight = (rng.standard_normal((probes, hidden)) / hidden**0.5).astype(np.float32)
    records, notes = [], []
    with tempfile.TemporaryDirectory() as workdir:
        server, target = start_sidecar(args.server, workdir)
        try:
            with TorchClient(target) as client:
                client.load_probe_set("bench", data=save(
                    {"weight": weight, "bias": np.zeros(probes, np.float32)},
                    metadata={"activation": "sigmoid"}))
                for batch in (int(b) for b in args.batches.split(",")):
                    records += measure(llm, client, tap_model, batch, args, notes)
        finally:
            server.terminate()
            server.wait(30)
    doc = {"device": torch.cuda.get_device_name(), "git": git,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "command": " ".join([os.path.relpath(sys.argv[0])] + sys.argv[1:]),
           "ceilings": None, "notes": notes, "records": records}
    pathlib.Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")
    pathlib.Path(args.out).with_suffix(".md").write_text(markdown(doc))
    for r in records:
        print(f"batch {r['shape']['batch']:3d} {r['impl']:5s} {r['tokens_per_s']:9.1f} tokens/s "
              f"(runs {r['runs_tokens_per_s']})" + (f"  kept {r['kept']:.4f}" if "kept" in r
                                                     else ""))
    return 0


def markdown(doc: dict) -> str:
    lines = [f"# A compiled decode loop with and without the tap on {doc['device']}", "",
             f"- commit `{doc['git']}`, {doc['date']}", f"- command: `{doc['command']}`",
             "- transformers' `generate(cache_implementation=\"static\")`, which compiles the "
             "decode forward with `torch.compile(mode=\"reduce-overhead\")` (CUDA graphs); a "
             "random Llama of Llama 3.2 1B's shape, bf16; greedy; `tap`: `tap_model` on the final "
             "norm (the tap operator inside the compiled graph), P=16 probes, one Score per 16 "
             "steps on the sidecar, no MPS; variants interleaved, the order alternating",
             "- kept = median tokens/s with the tap / median without; range: each tap run over "
             "the median without; pairs: the median of each repetition's tap / none (the two run "
             "back to back) with its bootstrap 95% interval", "",
             "| batch | new tokens | none tokens/s | tap tokens/s | kept | kept range | pairs "
             "[95%] | runs (none) | runs (tap) |", "|---|---|---|---|---|---|---|---|---|"]
    records = doc["records"]
    for none, tap in zip(records[0::2], records[1::2]):
        lines.append(
            f"| {none['shape']['batch']} | {none['shape']['new_tokens']} | "
            f"{none['tokens_per_s']:.0f} | {tap['tokens_per_s']:.0f} | {tap['kept']:.4f} | "
            f"{tap['kept_range'][0]:.3f}–{tap['kept_range'][1]:.3f} | "
            + (f"{tap['kept_pairs_median']:.4f} [{tap['kept_interval'][0]:.4f}, "
               f"{tap['kept_interval'][1]:.4f}] | " if "kept_interval" in tap else "— | ")
            + f"{', '.join(f'{v:.0f}' for v in none['runs_tokens_per_s'])} | "
            f"{', '.join(f'{v:.0f}' for v in tap['runs_tokens_per_s'])} |")
    lines += ["", "Notes: " + ("; ".join(doc["notes"]) if doc["notes"] else "none "
                               "(no CUDA graph skipped, no window failed)"), ""]
    return "\n".join(lines)


def measure(llm, client, tap_model, batch: int, args, notes: list) -> list[dict]:
    import torch

    prompt = torch.randint(0, llm.config.vocab_size, (batch, 32), device="cuda")
    model_tap = tap_model(llm, client, "bench", max_batch=batch, window=args.window)
    original_generate = model_tap._generate

    def run(variant: str) -> float:
        kwargs = dict(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens,
                      do_sample=False, cache_implementation="static", pad_token_id=0)
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            if variant == "none":
                with model_tap.paused():
                    original_generate(prompt, **kwargs)
            else:
                llm.generate(prompt, **kwargs)
                model_tap.flush()
        torch.cuda.synchronize()
        return batch * args.new_tokens / (time.perf_counter() - start)

    try:
        for variant in ("none", "tap"):  # compiles and records each variant's graphs
            run(variant)
        skips = int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])
        if skips:
            notes.append(f"batch {batch}: Inductor skipped CUDA graphs {skips} times")
        runs = {"none": [], "tap": []}
        for rep in range(args.reps):  # interleaved, the order alternating: drift hits both
            for variant in (("none", "tap") if rep % 2 == 0 else ("tap", "none")):
                runs[variant].append(run(variant))
        model_tap.tap.wait_delivered(60)
        stats = model_tap.tap.stats
        failed = stats.windows_failed
    finally:
        model_tap.close()
    if failed:
        notes.append(f"batch {batch}: {failed} windows failed")
    out = []
    for variant, values in runs.items():
        record = {"bench": "decode_loop", "impl": "none" if variant == "none" else "tap_k16_compiled",
                  "dtype": "bf16", "shape": {"batch": batch, "mode": "compiled_generate",
                                             "new_tokens": args.new_tokens},
                  "tokens_per_s": round(statistics.median(values), 1),
                  "runs_tokens_per_s": [round(v, 1) for v in values]}
        out.append(record)
    out[1]["kept"] = round(out[1]["tokens_per_s"] / out[0]["tokens_per_s"], 4)
    # Each repetition's pair (run back to back, the order alternating): its ratio, and the
    # median of those with a bootstrap 95% interval (interleave.py).
    import interleave

    pairs = [tap / none for tap, none in zip(runs["tap"], runs["none"])]
    median, interval = interleave.median_interval(pairs)
    out[1]["kept_per_rep"] = [round(x, 4) for x in pairs]
    out[1]["kept_pairs_median"] = round(median, 4)
    out[1]["kept_interval"] = [round(x, 4) for x in interval]
    # Each run's ratio to the median of the other variant: the spread behind `kept`.
    none = statistics.median(runs["none"])
    out[1]["kept_range"] = [round(min(runs["tap"]) / none, 4), round(max(runs["tap"]) / none, 4)]
    out[1]["windows_scored"] = stats.windows_delivered
    return out


if __name__ == "__main__":
    sys.exit(main())
