"""The tap operator where inference servers run it, on a real GPU: inside torch.compile's CUDA
graphs (mode="reduce-overhead"), inside transformers' static-cache generate() (which compiles its
decode forward that way), and in gather mode as the vLLM plugin uses it (rows armed before each
replay of a captured graph). Every window's scores are checked against float64 of the rows the
model produced, and CUDA graphs must not have been skipped.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()
transformers = pytest.importorskip("transformers")

from conftest import Sidecar  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file, float64_scores, rel_error  # noqa: E402
from probe_sidecar import tap_op  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probe_sidecar.transformers import tap_model  # noqa: E402

H, P = 256, 8
TOLERANCE = 1e-3  # relative L2 error of fp32-accumulated bf16 scores against float64


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(3)
    weight, bias = bf16_probes(P, H)
    data = bf16_tensor_file(weight, bias, {"activation": "none"})
    with Sidecar(["--backend=cuda", "--warmup-rows=none"]) as server:
        with server.client() as c:
            c.load_probe_set("compiled", data=data)
        yield server, weight, bias
        assert server.process.poll() is None, server.log()


def relative_error(got: np.ndarray, rows: torch.Tensor, weight, bias) -> float:
    return rel_error(got, float64_scores(rows, None, weight, bias))


def cudagraph_skips() -> int:
    return int(torch._dynamo.utils.counters["inductor"]["cudagraph_skips"])


def test_reduce_overhead_replays_write_every_step(setup, kernel):
    """torch.compile(mode="reduce-overhead"): the step (a matmul, the tap's write, a history copy)
    runs as a CUDA graph; every replay writes the next slot."""
    server, weight, bias = setup
    calls, batch = 27, 6
    w = torch.randn(H, H, device="cuda", dtype=torch.bfloat16) / H**0.5
    x = torch.randn(batch, H, device="cuda", dtype=torch.bfloat16)
    history = torch.zeros(calls, batch, H, device="cuda", dtype=torch.bfloat16)
    t_dev = torch.zeros(1, dtype=torch.long, device="cuda")
    torch._dynamo.mark_static_address(history)
    torch._dynamo.mark_static_address(t_dev)
    with TorchClient(server.uds_target) as tc:
        tap = tc.tap("compiled", max_batch=8, window=8, dtype=torch.bfloat16)

        def step(x):
            hidden = torch.tanh(x @ w)
            tap.ring.write_op(hidden)
            history.index_copy_(0, t_dev, hidden.unsqueeze(0))
            t_dev.add_(1)
            return hidden

        torch._dynamo.reset()
        skips = cudagraph_skips()
        compiled = torch.compile(step, mode="reduce-overhead", fullgraph=True)
        # Every call writes once, whether cudagraph trees run it eagerly (warm-up), record it
        # (then replay it) or replay it: the history, written in the same graph, says what.
        for _ in range(calls):
            x = compiled(x).clone()
            tap.step()
        tap.close()
        windows = list(tap.windows())
        assert cudagraph_skips() == skips, "Inductor skipped CUDA graphs"
    assert sum(w.steps for w in windows) == calls
    assert all(w.error is None for w in windows), [w.error for w in windows]
    checked = 0
    for w in windows:
        for i in range(w.steps):
            t = w.first_step + i
            assert w.num_rows[i] == batch
            rel = relative_error(w.scores[i, :batch], history[t], weight, bias)
            assert rel <= TOLERANCE, (t, rel)
            checked += 1
    assert checked == calls


def test_static_cache_generate_compiles_and_is_scored(setup):
    """transformers' generate(cache_implementation="static") on a GPU compiles the decode
    forward (reduce-overhead); the tapped model keeps its CUDA graphs and every step is scored.
    The reference is float64 teacher forcing over the generated sequence (the compiled forward's
    own hidden states live in its graph's memory, rewritten at each replay)."""
    server, weight, bias = setup
    torch.manual_seed(5)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=H, intermediate_size=512,
                                      num_hidden_layers=2, num_attention_heads=4,
                                      num_key_value_heads=2, max_position_embeddings=256)
    model = transformers.LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
    reference = copy.deepcopy(model).double()
    batch, prompt_len, new_tokens = 4, 12, 20
    prompt = torch.randint(0, 512, (batch, prompt_len), device="cuda")
    torch._dynamo.reset()
    skips = cudagraph_skips()
    with TorchClient(server.uds_target) as tc:
        model_tap = tap_model(model, tc, "compiled", max_batch=batch, window=5)
        with torch.no_grad():
            sequences = model.generate(prompt, max_new_tokens=new_tokens, do_sample=False,
                                       cache_implementation="static", pad_token_id=0)
        model_tap.close()
        windows = list(model_tap.tap.windows())
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] >= 1, "nothing was compiled"
    assert cudagraph_skips() == skips, "Inductor skipped CUDA graphs"
    assert sum(w.steps for w in windows) == new_tokens
    with torch.no_grad():
        hidden = reference(sequences[:, :-1], output_hidden_states=True).hidden_states[-1]
    for w in windows:
        assert w.error is None, w.error
        for i in range(w.steps):
            position = prompt_len - 1 + w.first_step + i  # step 0 is the prefill's last token
            rel = relative_error(w.scores[i, :batch], hidden[:, position], weight, bias)
            # A bf16 model (compiled) against float64: bf16's own rounding, not a wrong row (a
            # row of another position or request is off by O(1)).
            assert rel <= 3e-2, (w.first_step + i, rel)


def test_gathered_rows_armed_before_each_graph_replay(setup, kernel):
    """The vLLM plugin's use: a captured forward over a padded token batch writes the rows armed
    before each replay (a different number each step, none when not armed)."""
    server, weight, bias = setup
    tokens, steps = 32, 12
    hidden = torch.zeros(tokens, H, device="cuda", dtype=torch.bfloat16)
    residual = torch.zeros_like(hidden)
    source = torch.randn(steps, tokens, H, device="cuda", dtype=torch.bfloat16)
    extra = torch.randn(steps, tokens, H, device="cuda", dtype=torch.bfloat16)
    with TorchClient(server.uds_target) as tc:
        tap = tc.tap("compiled", max_batch=8, window=4, dtype=torch.bfloat16)
        ring = tap.ring
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            ring.write_op(hidden, residual=residual, gather=True)  # compiles; not armed: no-op
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            ring.write_op(hidden, residual=residual, gather=True)
        armed = []
        for t in range(steps):
            hidden.copy_(source[t])
            residual.copy_(extra[t])
            n = t % 9  # 0 to 8 rows
            rows = torch.randperm(tokens, device="cuda")[:n]
            armed.append(rows)
            ring.arm(rows, n)
            graph.replay()
            tap.step()
            if t == 5:
                graph.replay()  # a forward that was not armed (a warm-up, a dummy run): no-op
        tap.close()
        windows = list(tap.windows())
    assert sum(w.steps for w in windows) == steps
    for w in windows:
        assert w.error is None, w.error
        for i in range(w.steps):
            t = w.first_step + i
            n = len(armed[t])
            assert w.num_rows[i] == n
            if n:
                # The residual stream as the ring holds it: the float32 sum, rounded to bf16.
                rows = (source[t][armed[t]].float() + extra[t][armed[t]].float()).to(
                    torch.bfloat16)
                rel = relative_error(w.scores[i, :n], rows, weight, bias)
                assert rel <= TOLERANCE, (t, rel)


def test_the_operator_refuses_a_ring_on_another_device(setup):
    server, _, _ = setup
    layout = tap_op.RingLayout.make(window=1, max_batch=1, hidden_size=H, num_probes=P,
                                    dtype=torch.bfloat16, device_scores=False)
    ring = torch.zeros(layout.nbytes, dtype=torch.uint8)  # host memory
    with pytest.raises(ValueError, match="the ring is a uint8 tensor on the rows' device"):
        tap_op.tap_write(torch.zeros(1, H, device="cuda", dtype=torch.bfloat16), ring,
                         layout.op_args())
