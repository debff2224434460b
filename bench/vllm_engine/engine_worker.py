"""One vLLM engine of the vllm_engine benchmark, driven by run.py over stdin/stdout (one JSON
object per line). With PROBE_SIDECAR_VLLM set the plugin taps it; without, it is the engine a user
runs today. vLLM's defaults otherwise: torch.compile, its CUDA graph mode, asynchronous scheduling,
the engine core in a process of its own.

    python engine_worker.py MODEL_DIR
    <- {"ready": true, "start_s": ..., "config": {...}}
    -> {"batch": 8, "prompt_len": 128, "output_len": 256, "seed": 1}
    <- {"batch": 8, "tokens": 2048, "wall_s": ..., "ttft_ms": [...], "itl_us": [...]}
    -> {"quit": true}

A run adds `batch` requests at once (random prompt tokens, greedy, ignore_eos: every request
generates output_len tokens) and steps the engine (LLMEngine.step(), as LLM.generate does) until
they finish, stamping each token when its output reaches this process: time to first token per
request, inter-token latency per generated token after the first (the time between two of a
request's tokens reaching the caller), and the run's wall time.
"""

from __future__ import annotations

import json
import os
import sys
import time

import numpy as np

MAX_NUM_SEQS = 256


def make_engine(model: str):
    from vllm import LLM

    return LLM(model=model, skip_tokenizer_init=True, dtype="bfloat16", max_model_len=1024,
               max_num_seqs=MAX_NUM_SEQS, gpu_memory_utilization=0.2,
               # Three engines share the GPU: their KV caches are sized here (256 x 384 tokens
               # fit), so that none profiles memory while another allocates.
               kv_cache_memory_bytes=8 << 30, seed=0)


def run(llm, batch: int, prompt_len: int, output_len: int, seed: int) -> dict:
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind

    engine = llm.llm_engine
    rng = np.random.default_rng(seed)
    params = SamplingParams(max_tokens=output_len, temperature=0, ignore_eos=True,
                            detokenize=False, output_kind=RequestOutputKind.DELTA)
    stamps: dict[str, list[float]] = {}
    started = time.perf_counter()
    for i in range(batch):
        request_id = f"s{seed}_{i}"  # no "-": vLLM's own id is this one, "-" and 8 characters
        engine.add_request(request_id, {"prompt_token_ids": rng.integers(
            1000, 30000, size=prompt_len).tolist()}, params)
        stamps[request_id] = []
    while engine.has_unfinished_requests():
        outputs = engine.step()
        now = time.perf_counter()
        for output in outputs:
            stamps[output.request_id.split("-")[0]] += [now] * len(output.outputs[0].token_ids)
    wall = time.perf_counter() - started
    ttft, itl, tokens = [], [], 0
    for times in stamps.values():
        tokens += len(times)
        if times:
            ttft.append((times[0] - started) * 1e3)
            itl += [(b - a) * 1e6 for a, b in zip(times, times[1:])]
    return {"batch": batch, "tokens": tokens, "expected_tokens": batch * output_len,
            "wall_s": wall, "ttft_ms": ttft, "itl_us": itl}


def resolved(llm) -> dict:
    config = llm.llm_engine.vllm_config
    return {"cudagraph_mode": str(config.compilation_config.cudagraph_mode).split(".")[-1],
            "compilation_mode": str(config.compilation_config.mode).split(".")[-1],
            "async_scheduling": bool(config.scheduler_config.async_scheduling)}


def main(model: str) -> None:
    # The replies get a descriptor of their own; file descriptor 1 becomes stderr, so that
    # nothing vLLM or its engine-core process prints mixes with them.
    reply = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    started = time.monotonic()
    llm = make_engine(model)
    reply.write(json.dumps({"ready": True, "start_s": time.monotonic() - started,
                            "config": resolved(llm)}) + "\n")
    reply.flush()
    for line in sys.stdin:
        command = json.loads(line)
        if command.get("quit"):
            break
        reply.write(json.dumps(run(llm, command["batch"], command["prompt_len"],
                                   command["output_len"], command["seed"])) + "\n")
        reply.flush()
    state = None
    if os.environ.get("PROBE_SIDECAR_VLLM"):
        import probe_sidecar.vllm as plugin

        plugin.collect(llm)  # the runs' summaries: the worker keeps nothing
        state = plugin.state(llm)
    reply.write(json.dumps({"done": True, "plugin_state": state}) + "\n")
    reply.flush()


if __name__ == "__main__":
    main(sys.argv[1])
