"""probe_sidecar.transformers on a real GPU with a CUDA tap: a tiny random Llama (bf16) tapped by
its final norm, through eager generate() and through a CUDA-graphed decode step with a static
cache; every step's scores against float64 of the hidden states the model produced.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()
transformers = pytest.importorskip("transformers")

from conftest import Sidecar  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file, float64_scores, rel_error  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probe_sidecar.transformers import tap_model  # noqa: E402

H, P, BATCH, PROMPT, STEPS = 256, 8, 4, 16, 24
TOLERANCE = 1e-3


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=H, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    weight, bias = bf16_probes(P, H)
    data = bf16_tensor_file(weight, bias, {"activation": "none"})
    with Sidecar(["--backend=cuda", "--warmup-rows=none"]) as server:
        with server.client() as c:
            c.load_probe_set("llama_gpu", data=data)
        yield server, model, weight, bias
        assert server.process.poll() is None, server.log()


def relative_error(got: np.ndarray, hidden: torch.Tensor, weight, bias) -> float:
    return rel_error(got, float64_scores(hidden, None, weight, bias))


def test_eager_generate(setup):
    server, model, weight, bias = setup
    prompt = torch.randint(0, 512, (BATCH, PROMPT), device="cuda")
    with TorchClient(server.uds_target) as tc:
        model_tap = tap_model(model, tc, "llama_gpu", max_batch=BATCH, window=4)
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=10, do_sample=False,
                                 output_hidden_states=True, return_dict_in_generate=True,
                                 pad_token_id=0)
        model_tap.close()
        windows = list(model_tap.tap.windows())
    assert sum(w.steps for w in windows) == len(out.hidden_states)
    for w in windows:
        assert w.error is None, w.error
        for i in range(w.steps):
            hidden = out.hidden_states[w.first_step + i][-1][:, -1]
            assert relative_error(w.scores[i, :BATCH], hidden, weight, bias) <= TOLERANCE


def test_cuda_graphed_decode_step_with_a_static_cache(setup):
    """The hook runs while the step is captured (capturing(): write, no step), the loop counts
    replays; a history written inside the same graph is the reference."""
    server, model, weight, bias = setup
    length = PROMPT + STEPS + 8
    cache = transformers.StaticCache(config=model.config, max_cache_len=length)
    ids = torch.randint(0, 512, (BATCH, 1), device="cuda")
    pos = torch.full((1, 1), PROMPT, dtype=torch.long, device="cuda")
    kv_index = torch.arange(length, device="cuda").view(1, 1, 1, -1)
    mask = torch.zeros(1, 1, 1, length, dtype=torch.bfloat16, device="cuda")
    t_dev = torch.zeros(1, dtype=torch.long, device="cuda")
    history = torch.zeros(STEPS, BATCH, H, dtype=torch.bfloat16, device="cuda")
    with TorchClient(server.uds_target) as tc, torch.no_grad():
        prompt = torch.randint(0, 512, (BATCH, PROMPT), device="cuda")
        model.model(input_ids=prompt, past_key_values=cache, use_cache=True,
                    position_ids=torch.arange(PROMPT, device="cuda").unsqueeze(0))
        model_tap = tap_model(model, tc, "llama_gpu", max_batch=BATCH, window=8)

        def step():
            mask.zero_().masked_fill_(kv_index > pos, float("-inf"))
            out = model.model(input_ids=ids, past_key_values=cache, position_ids=pos,
                              attention_mask=mask, use_cache=True)
            hidden = out.last_hidden_state[:, -1]
            history.index_copy_(0, t_dev, hidden.unsqueeze(0))
            ids.copy_(model.lm_head(hidden).argmax(-1, keepdim=True))
            pos.add_(1)
            t_dev.add_(1)

        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), model_tap.paused():
            for _ in range(2):
                step()  # warm-up outside the capture, untapped
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with model_tap.capturing(), torch.cuda.graph(graph):
            step()
        t_dev.zero_()
        for _ in range(STEPS):
            graph.replay()
            model_tap.step()
        model_tap.close()
        windows = list(model_tap.tap.windows())
    assert [w.steps for w in windows] == [8, 8, 8]
    for w in windows:
        assert w.error is None, w.error
        for i in range(w.steps):
            rel = relative_error(w.scores[i, :BATCH], history[w.first_step + i], weight, bias)
            assert rel <= TOLERANCE, f"step {w.first_step + i}: {rel:.3g}"
