"""Runs a real vLLM engine on the GPU (CUDA build) with the probe_sidecar plugin through the
scenario test_gpu_vllm.py checks, and writes what happened to a JSON file. One process per engine
start; the engine runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, set by the test) so
that the profiler and vLLM's compilation counters see its steps.

    python gpu_engine_run.py MODEL_DIR OUT.json MODE [--profile-only]

MODE: "default" (vLLM's own choice of compilation and CUDA graphs), a CUDA graph mode
("FULL_AND_PIECEWISE", "PIECEWISE", "FULL_DECODE_ONLY"), or "eager" (enforce_eager=True, the
control). --profile-only: only the profiled decode steps (the test runs it without the plugin,
as the baseline of what a step launches and synchronises).

The scenario, on one engine (max_num_seqs 8, 256 tokens per step, prefix caching on):
  first      a greedy request; the same prompt is sent again in `batch` with what it generated
             as stop tokens, and so ends on a stop token (with asynchronous scheduling the engine then runs one forward
             for it after the token was sampled)
  batch      14 requests in one generate(): more than max_num_seqs (continuous batching), a
             600-token prompt (chunked prefill: three chunks), greedy and sampled (temperature
             0.8, top-p 0.95, no seed), one with n=2, the stop request
  prefix     after that: three prompts that begin with the long prompt's first 512 tokens
             (prefix-cache hits)
  abort      two requests stepped through LLMEngine, one aborted after five steps
  profile    eight requests in steady decode, 12 steps under torch.profiler: every kernel (and
             whether a CUDA graph launched it), every memcpy and CUDA runtime call
The plugin's configuration comes from PROBE_SIDECAR_VLLM (set by the test); every record reaches
RECORDS_PATH through record_sink.record (the `callback`).
"""

from __future__ import annotations

import collections
import dataclasses
import gzip
import json
import os
import sys
import tempfile
import threading
import time

import numpy as np

MAX_NUM_SEQS = 8
TOKENS_PER_STEP = 256
LONG_PROMPT = 600
PROFILED_STEPS = 12
# Token ids drawn from a range both models' vocabularies hold.
VOCAB = (1000, 30000)
# CUDA runtime and driver calls that make the host wait for the GPU.
SYNCHRONISING = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize",
                 "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "cudaMemcpy",
                 "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cudaStreamWaitEvent")


def engine_args(model: str, mode: str) -> dict:
    args = dict(model=model, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024,
                max_num_seqs=MAX_NUM_SEQS, max_num_batched_tokens=TOKENS_PER_STEP,
                enable_chunked_prefill=True, enable_prefix_caching=True,
                # Several engines share the GPU in the test: their KV caches are sized here, so
                # that none profiles memory while another allocates.
                gpu_memory_utilization=0.08, kv_cache_memory_bytes=2 << 30, seed=0)
    if mode == "eager":
        args["enforce_eager"] = True
    elif mode != "default":
        args["compilation_config"] = {"cudagraph_mode": mode}
    backend = os.environ.get("VLLM_TEST_ATTENTION_BACKEND")
    if backend:
        args["attention_config"] = {"backend": backend}
    return args


def resolved(llm) -> dict:
    config = llm.llm_engine.vllm_config
    compilation = config.compilation_config
    return {"compilation_mode": str(compilation.mode),
            "cudagraph_mode": str(compilation.cudagraph_mode),
            "cudagraph_capture_sizes": list(compilation.cudagraph_capture_sizes or []),
            "async_scheduling": bool(config.scheduler_config.async_scheduling),
            "enforce_eager": bool(config.model_config.enforce_eager),
            "attention_backend": str(getattr(getattr(config, "attention_config", None),
                                             "backend", None))}


def counters() -> dict:
    from vllm.compilation.counter import compilation_counter

    return {k: v for k, v in dataclasses.asdict(compilation_counter).items()
            if isinstance(v, int)}


def prompt(rng, n: int) -> list[int]:
    return rng.integers(*VOCAB, size=n).tolist()


def completions(output) -> list[dict]:
    return [{"index": c.index, "tokens": list(c.token_ids), "finish_reason": c.finish_reason,
             "summary": summary_dict(getattr(c, "probe_summary", None))}
            for c in output.outputs]


def summary_dict(summary):
    return None if summary is None else {k: v.to_dict() for k, v in summary.items()}


def scenario(llm, rng) -> dict:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    def greedy(tokens, **kw):
        return SamplingParams(max_tokens=tokens, temperature=0, detokenize=False, **kw)

    def sampled(tokens, **kw):
        return SamplingParams(max_tokens=tokens, temperature=0.8, top_p=0.95, detokenize=False,
                              **kw)

    result = {}
    stop_prompt = prompt(rng, 24)
    (first,) = llm.generate([TokensPrompt(prompt_token_ids=stop_prompt)], [greedy(16)],
                            use_tqdm=False)
    result["first"] = [{"request_id": first.request_id, "prompt": stop_prompt, "n": 1,
                        "completions": completions(first), "num_cached_tokens": 0,
                        "summary": summary_dict(getattr(first, "probe_summary", None))}]
    # The same prompt, greedy, stops at the first of these it generates (its third token or
    # sooner), whatever a batch's numerics change after that.
    stop_ids = sorted(set(first.outputs[0].token_ids[2:8]))
    result["stop_ids"] = stop_ids
    long_prompt = prompt(rng, LONG_PROMPT)
    lengths = [3, 17, 40, 64, 100, 150, 200, 9, 33, 77, 5]
    batch = [(long_prompt, greedy(12))]
    for i, n in enumerate(lengths):
        batch.append((prompt(rng, n), (greedy if i % 2 else sampled)(6 + 4 * i)))
    batch.append((prompt(rng, 30), sampled(20, n=2)))
    batch.append((stop_prompt, greedy(40, stop_token_ids=stop_ids)))
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in batch],
                           [params for _, params in batch], use_tqdm=False)
    result["batch"] = [{"request_id": o.request_id, "prompt": list(o.prompt_token_ids),
                        "n": len(o.outputs), "completions": completions(o),
                        "num_cached_tokens": o.num_cached_tokens,
                        "summary": summary_dict(getattr(o, "probe_summary", None))}
                       for o in outputs]
    prefix = [long_prompt[:512] + prompt(rng, 10 + 7 * i) for i in range(3)]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prefix],
                           [greedy(8) for _ in prefix], use_tqdm=False)
    result["prefix"] = [{"request_id": o.request_id, "prompt": list(o.prompt_token_ids),
                         "n": 1, "completions": completions(o),
                         "num_cached_tokens": o.num_cached_tokens,
                         "summary": summary_dict(getattr(o, "probe_summary", None))}
                        for o in outputs]
    result["abort"] = stepped_with_an_abort(llm, rng, greedy)
    return result


def stepped_with_an_abort(llm, rng, greedy) -> dict:
    import probe_sidecar.vllm as plugin

    engine = llm.llm_engine
    prompts = {"keep": prompt(rng, 4), "drop": prompt(rng, 3)}
    engine.add_request("keep", {"prompt_token_ids": prompts["keep"]}, greedy(8))
    engine.add_request("drop", {"prompt_token_ids": prompts["drop"]}, greedy(200))
    generated = {"keep": [], "drop": []}
    steps = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            generated[output.request_id.split("-")[0]] = list(output.outputs[0].token_ids)
        steps += 1
        if steps == 5:
            engine.abort_request(["drop"])
    lengths = {k: len(prompts[k]) + len(generated[k]) for k in prompts}
    summaries = plugin.collect(llm, list(prompts), lengths=lengths) if plugin.current() else {}
    return {"generated": generated, "prompts": prompts,
            "summaries": {rid: {k: v.to_dict() for k, v in by_set.items()}
                          for rid, by_set in summaries.items()}}


def profile_decode(llm, rng) -> dict:
    """PROFILED_STEPS engine steps of eight decoding requests under torch.profiler."""
    import torch
    from vllm import SamplingParams

    engine = llm.llm_engine
    params = SamplingParams(max_tokens=PROFILED_STEPS + 24, temperature=0, ignore_eos=True,
                            detokenize=False)
    for i in range(MAX_NUM_SEQS):
        engine.add_request(f"profile{i}", {"prompt_token_ids": prompt(rng, 32)}, params)
    for _ in range(8):  # past the prefill: every request decoding
        engine.step()
    trace = tempfile.NamedTemporaryFile(suffix=".json", delete=False).name
    activities = [torch.profiler.ProfilerActivity.CPU] + (
        [torch.profiler.ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(PROFILED_STEPS):
            engine.step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    prof.export_chrome_trace(trace)
    while engine.has_unfinished_requests():
        engine.step()
    with open(trace) as file:
        events = json.load(file)["traceEvents"]
    os.unlink(trace)
    return summarise_trace(events, PROFILED_STEPS, threading.get_native_id())


def summarise_trace(events: list[dict], steps: int, step_thread: int) -> dict:
    """Kernels (by name: launched by a CUDA graph or directly), memcpys and memsets (by kind and
    bytes), and CUDA runtime calls (by name) of a profile: of every thread, and of the thread
    that stepped the engine (`step_thread`), which is the one whose waits slow the engine."""
    runtime = {}
    on_step_thread = collections.Counter()
    for e in events:
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and e.get("ph") == "X":
            runtime[e.get("args", {}).get("correlation")] = e["name"]
            if e.get("tid") == step_thread:
                on_step_thread[e["name"]] += 1
    kernels = collections.defaultdict(lambda: {"graph": 0, "direct": 0})
    copies = collections.defaultdict(lambda: {"count": 0, "bytes": 0})
    for e in events:
        cat = e.get("cat")
        if cat == "kernel":
            launcher = runtime.get(e.get("args", {}).get("correlation"), "")
            kind = "graph" if "GraphLaunch" in launcher else "direct"
            kernels[e["name"]][kind] += 1
        elif cat in ("gpu_memcpy", "gpu_memset"):
            kind = f"{cat}:{e['name']}"
            copies[kind]["count"] += 1
            copies[kind]["bytes"] += int(e.get("args", {}).get("bytes", 0))
    calls = collections.Counter(runtime.values())
    def synchronising(counts):
        return {k: v for k, v in counts.items() if any(k.startswith(s) for s in SYNCHRONISING)}

    return {"steps": steps, "kernels": dict(kernels), "copies": dict(copies),
            "runtime_calls": dict(calls), "synchronising_calls": synchronising(calls),
            "step_thread_calls": dict(on_step_thread),
            "step_thread_synchronising_calls": synchronising(on_step_thread)}


def main(model: str, out_path: str, mode: str, *flags: str) -> None:
    from vllm import LLM

    import probe_sidecar.vllm as plugin

    started = time.monotonic()
    llm = LLM(**engine_args(model, mode))
    result = {"mode": mode, "plugin": plugin.current() is not None,
              "start_s": time.monotonic() - started, "config": resolved(llm),
              "counters_after_start": counters()}
    rng = np.random.default_rng(0)
    if "--profile-only" not in flags:
        result.update(scenario(llm, rng))
    result["counters_after_scenario"] = counters()
    result["profile"] = profile_decode(llm, rng)
    result["counters_after_profile"] = counters()
    if plugin.current() is not None:
        plugin.collect(llm)  # the profiled requests' summaries: nothing is left behind
        result["state"] = plugin.state(llm)
    opener = gzip.open if out_path.endswith(".gz") else open
    with opener(out_path, "wt") as file:
        json.dump(result, file)


if __name__ == "__main__":
    main(*sys.argv[1:])
