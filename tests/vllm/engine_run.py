"""Runs a real vLLM engine (CPU build) with the probe_sidecar plugin and writes what happened to a
JSON file, for test_vllm_plugin.py to check. One process per engine start (vLLM's engine core is a
spawned process, so the engine is made under the __main__ guard).

    python engine_run.py MODEL_DIR OUT.json SCENARIO

Scenarios:
  batch    several prompts of different lengths in one LLM.generate(): continuous batching (more
           prompts than max_num_seqs), chunked prefill (a prompt longer than the step's token
           budget), requests that end at different lengths; then, on the same engine, requests
           stepped by hand through LLMEngine with one aborted midway
  short    one LLM.generate() of three prompts and one LLM.chat() (a second start of the same
           model, with its tokenizer, and a worker extension class of the user's own,
           user_extension.UserExtension, beside the plugin's): then each worker method called by
           name through collective_rpc, the user's and the plugin's
The plugin's configuration comes from PROBE_SIDECAR_VLLM (set by the test); every record reaches
RECORDS_PATH through record_sink.record (the `callback`), in the engine's process.
"""

from __future__ import annotations

import json
import sys
import time

# Batch geometry: four running requests at most, 32 tokens per step (the 70-token prompt takes
# three chunks), prompts of 3 to 70 tokens, 4 to 13 new tokens.
PROMPTS = [
    (list(range(1, 4)), 9),
    ([(7 * i) % 500 + 1 for i in range(70)], 6),
    ([(11 * i) % 500 + 2 for i in range(17)], 13),
    ([(13 * i) % 500 + 3 for i in range(5)], 4),
    ([(17 * i) % 500 + 4 for i in range(33)], 10),
    ([(19 * i) % 500 + 5 for i in range(9)], 7),
]


def main(model: str, out_path: str, scenario: str) -> None:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    import probe_sidecar.vllm as plugin

    started = time.monotonic()
    # Blocks of 32 tokens (the CPU build's default, 128, is longer than these prompts), so that
    # a prompt sharing another's first 64 tokens hits the prefix cache.
    # The second start ("short") loads the model's tokenizer, for LLM.chat, and has a worker
    # extension class of its own.
    extra = {} if scenario == "batch" else {"worker_extension_cls": "user_extension.UserExtension"}
    llm = LLM(model=model, skip_tokenizer_init=scenario == "batch", dtype="float32",
              gpu_memory_utilization=0.1,
              max_num_seqs=4, max_model_len=256, max_num_batched_tokens=32,
              enable_chunked_prefill=True, enable_prefix_caching=True, block_size=32, seed=0,
              **extra)
    result = {"start_s": time.monotonic() - started, "requests": []}

    def params(n):
        return SamplingParams(max_tokens=n, temperature=0, ignore_eos=True, detokenize=False)

    prompts = PROMPTS if scenario == "batch" else PROMPTS[:3]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p, _ in prompts],
                           [params(n) for _, n in prompts], use_tqdm=False)
    for output in outputs:
        summary = output.probe_summary
        result["requests"].append({
            "request_id": output.request_id, "prompt": list(output.prompt_token_ids),
            "generated": list(output.outputs[0].token_ids),
            "summary": None if summary is None else {k: v.to_dict() for k, v in summary.items()}})
    if scenario == "batch":
        result["aborted"] = stepped_with_an_abort(llm, params)
        result["second"] = second_call(llm, prompts)
    else:
        chat = llm.chat([{"role": "user", "content": "t5 t6 t7 t8"}],
                        SamplingParams(max_tokens=5, temperature=0, ignore_eos=True),
                        use_tqdm=False)
        result["chat"] = [{"request_id": o.request_id, "prompt": list(o.prompt_token_ids),
                           "generated": list(o.outputs[0].token_ids),
                           "summary": None if o.probe_summary is None else
                           {k: v.to_dict() for k, v in o.probe_summary.items()}} for o in chat]
        result["rpc"] = worker_methods(llm)
    result["state"] = plugin.state(llm)
    with open(out_path, "w") as file:
        json.dump(result, file)


def worker_methods(llm) -> dict:
    """The worker methods called by name through collective_rpc: the user's extension class's
    and the plugin's (which the plugin's worker extension adds), and the extension class vLLM
    was given."""
    from probe_sidecar.vllm import extension

    return {"worker_extension_cls": llm.llm_engine.vllm_config.parallel_config.worker_extension_cls,
            "user": llm.collective_rpc("user_extension_echo", args=("hello",)),
            "state": llm.collective_rpc(extension.STATE),
            "collect": llm.collective_rpc(extension.COLLECT, args=(["nothing"], 5.0, None)),
            "take": llm.collective_rpc(extension.TAKE, args=("cmpl-nothing",))}


def second_call(llm, first_prompts) -> dict:
    """A second generate() on the same engine: prompts that begin with the first call's longest
    prompt (prefix-cache hits), sampled (temperature 0.8, no seed: vLLM CPU 0.32 fails on seed=
    with chunked prefill), one with n=2, one that opts out of scoring; then LLM.chat."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    longest = max((p for p, _ in first_prompts), key=len)
    prompts = [longest + [7, 8, 9], longest[:40] + [11, 12], [3, 4, 5, 6], [30, 31, 32]]
    params = [SamplingParams(max_tokens=6, temperature=0.8, ignore_eos=True, detokenize=False,
                             **extra) for extra in ({}, {}, {"n": 2},
                                                    {"extra_args": {"probe_sidecar": "off"}})]
    outputs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params,
                           use_tqdm=False)

    def described(output):
        return {"request_id": output.request_id, "prompt": list(output.prompt_token_ids),
                "num_cached_tokens": output.num_cached_tokens,
                "completions": [{"index": c.index, "generated": list(c.token_ids),
                                 "summary": None if getattr(c, "probe_summary", None) is None
                                 else {k: v.to_dict() for k, v in c.probe_summary.items()}}
                                for c in output.outputs]}

    return {"generate": [described(o) for o in outputs]}


def stepped_with_an_abort(llm, params) -> dict:
    """Two requests stepped by hand; one aborted after a few steps, the other finished."""
    import probe_sidecar.vllm as plugin

    engine = llm.llm_engine
    engine.add_request("keep", {"prompt_token_ids": [5, 6, 7, 8]}, params(8))
    engine.add_request("drop", {"prompt_token_ids": [9, 10, 11]}, params(50))
    generated = {"keep": [], "drop": []}
    steps = 0
    while engine.has_unfinished_requests():
        for output in engine.step():
            rid = "keep" if output.request_id.startswith("keep") else "drop"
            generated[rid] = list(output.outputs[0].token_ids)
        steps += 1
        if steps == 5:
            engine.abort_request(["drop"])
    summaries = plugin.collect(llm, ["keep", "drop"])
    return {"generated": generated, "prompts": {"keep": [5, 6, 7, 8], "drop": [9, 10, 11]},
            "summaries": {rid: {k: v.to_dict() for k, v in by_set.items()}
                          for rid, by_set in summaries.items()},
            "state_after": plugin.state(llm)}


if __name__ == "__main__":
    main(*sys.argv[1:4])
