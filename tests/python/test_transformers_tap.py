"""probe_sidecar.transformers on the CPU: a tiny random Llama's generate() tapped through a forward
hook on its final norm, every step's last-position hidden state scored by the real server (CPU
backend, host tap) and checked against float64 of the hidden states generate() itself returns."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from probe_files import ProbeFile  # noqa: E402

from probe_sidecar.tap import TapError  # noqa: E402
from probe_sidecar.transformers import final_norm, tap_model  # noqa: E402

H, P = 64, 4


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=256, hidden_size=H, intermediate_size=128,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def probes(sidecar):
    probe = ProbeFile(P, H, seed=3, activation="none", thresholds=[0] * P)
    with sidecar.client() as c:
        c.load_probe_set("llama_tiny", replace=True, data=probe.data)
    return probe.weight.astype(np.float64), probe.bias.astype(np.float64)


def test_generate_is_scored_step_by_step_against_float64(client, model, probes):
    weight, bias = probes
    batch, new_tokens = 3, 9
    prompt = torch.randint(0, 256, (batch, 5))
    mask = torch.ones_like(prompt)
    mask[0, :2] = 0  # a left-padded prompt: its newest token is still the last position
    model_tap = tap_model(model, client, "llama_tiny", max_batch=4, window=4)
    with torch.no_grad():
        out = model.generate(prompt, attention_mask=mask, max_new_tokens=new_tokens,
                             do_sample=False, output_hidden_states=True,
                             return_dict_in_generate=True, pad_token_id=0)
    model_tap.close()
    windows = list(model_tap.tap.windows())
    # One step per forward: the prefill, then one per new token but the last (generate() does
    # not run a forward after the final token).
    assert sum(w.steps for w in windows) == len(out.hidden_states) == new_tokens
    assert [w.steps for w in windows] == [4, 4, 1]
    records = [r for w in windows for r in w.records()]
    assert len(records) == new_tokens * batch
    for r in records:
        # hidden_states[step][-1]: the final norm's output of that forward, [batch, seq, H].
        hidden = out.hidden_states[r.step][-1][r.row, -1].double().numpy()
        np.testing.assert_allclose(r.scores, hidden @ weight.T + bias, rtol=1e-4, atol=1e-4)
        np.testing.assert_array_equal(r.fired, r.scores >= 0)


def test_a_compiled_static_cache_generate_is_scored_step_by_step(client, model, probes):
    """generate(cache_implementation="static") compiles its decode forward (on a GPU by itself;
    here on the CPU, asked to): the hook is traced into the compiled forward as the tap operator
    (fullgraph: no graph break), and generate()'s own steps are counted. Before the operator,
    this compile failed (BackendCompilerFailed: input mutations on views with different dtypes)."""
    weight, bias = probes
    batch, new_tokens = 2, 7
    prompt = torch.randint(0, 256, (batch, 6))
    model_tap = tap_model(model, client, "llama_tiny", max_batch=4, window=3)
    compile_config = transformers.CompileConfig(fullgraph=True, mode="default")
    compile_config._compile_all_devices = True  # transformers compiles on GPUs only by itself
    torch._dynamo.reset()
    try:
        with torch.no_grad():
            out = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                                 cache_implementation="static", compile_config=compile_config,
                                 output_hidden_states=True, return_dict_in_generate=True,
                                 pad_token_id=0)
        assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1  # it was compiled
    finally:
        model_tap.close()
    windows = list(model_tap.tap.windows())
    assert [w.error for w in windows] == [None] * len(windows)
    assert sum(w.steps for w in windows) == len(out.hidden_states) == new_tokens
    for w in windows:
        for r in w.records():
            hidden = out.hidden_states[r.step][-1][r.row, -1].double().numpy()
            np.testing.assert_allclose(r.scores, hidden @ weight.T + bias, rtol=1e-4, atol=1e-4)
    assert len([r for w in windows for r in w.records()]) == new_tokens * batch


def test_a_captured_step_writes_only_and_the_loop_counts(client, model, probes):
    """capturing(): forwards write without a step (the graph replays are counted by the loop);
    paused(): forwards are not tapped at all."""
    model_tap = tap_model(model, client, "llama_tiny", max_batch=2, window=2)
    ids = torch.randint(0, 256, (2, 3))
    with torch.no_grad():
        with model_tap.paused():
            model(ids)  # e.g. a warm-up before capture
        assert model_tap.tap.stats.steps == 0
        with model_tap.capturing():
            model(ids)
        assert model_tap.tap.stats.steps == 0
        model_tap.step()
        model(ids)  # eager again: write and step
    model_tap.close()
    windows = list(model_tap.tap.windows())
    assert [w.steps for w in windows] == [2]


def test_bf16_model_and_clear_errors(client, model, probes):
    assert final_norm(model) is model.model.norm
    bf16 = transformers.LlamaForCausalLM(model.config).to(torch.bfloat16).eval()
    model_tap = tap_model(bf16, client, "llama_tiny", max_batch=2, window=1)
    with torch.no_grad():
        bf16(torch.randint(0, 256, (2, 4)))
    window = model_tap.tap.get(timeout=30)
    model_tap.close()
    assert window.error is None and window.num_rows.tolist() == [2]
    with pytest.raises(TapError, match="max_batch"):
        model_tap = tap_model(model, client, "llama_tiny", max_batch=1, window=1)
        try:
            with torch.no_grad():
                model(torch.randint(0, 256, (2, 4)))
        finally:
            model_tap.close()
    with pytest.raises(TapError, match="final norm"):
        tap_model(torch.nn.Sequential(torch.nn.Linear(H, H)), client, "llama_tiny",
                  max_batch=1, window=1)
