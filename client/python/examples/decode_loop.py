"""Probe scoring of every step of a CUDA-graphed decode loop through a tap, without slowing it.

Needs a GPU with torch and transformers, and a probe-sidecar serving on the same GPU (no MPS
needed: docs/mps.md says why a window of steps per Score is the cheaper way):

    probe-sidecar --backend=cuda &
    python3 decode_loop.py [unix:///tmp/probe-sidecar.sock]

A tiny random Llama stands in for the model. What carries over to a real one: the tap's write
captured in the step's graph (each replay writes the next slot of the tap's ring), one step()
per replay, and the scores arriving a window later on a background thread.
"""

import sys
import time

import torch
from safetensors.torch import save
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from probe_sidecar.torch import TorchClient

target = sys.argv[1] if len(sys.argv) > 1 else "unix:///tmp/probe-sidecar.sock"
BATCH, PROMPT, STEPS, PROBES, WINDOW = 8, 32, 64, 4, 16
torch.manual_seed(0)
config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4)
model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
cache = StaticCache(config=config, max_cache_len=PROMPT + STEPS + 2)  # fixed addresses: graphable

client = TorchClient(target)
weight = torch.randn(PROBES, config.hidden_size) / config.hidden_size**0.5
bias = torch.randn(PROBES) * 0.1
client.client.load_probe_set(  # once: the server keeps the probe set until it is unloaded
    "example", replace=True, data=save({"weight": weight.bfloat16(), "bias": bias.bfloat16()},
                                       metadata={"activation": "sigmoid"}))
# The tap owns a ring of 2 x WINDOW slots of [BATCH, H] rows; one Score per WINDOW steps.
windows = []
tap = client.tap("example", max_batch=BATCH, window=WINDOW, on_window=windows.append)

# Everything the graphed step reads or writes lives at a fixed address.
ids = torch.zeros(BATCH, 1, dtype=torch.long, device="cuda")
pos = torch.zeros(1, 1, dtype=torch.long, device="cuda")
kv_index = torch.arange(cache.max_cache_len, device="cuda").view(1, 1, 1, -1)
mask = torch.zeros(1, 1, 1, cache.max_cache_len, dtype=torch.bfloat16, device="cuda")
seen = torch.zeros(STEPS, BATCH, config.hidden_size, dtype=torch.bfloat16, device="cuda")
t_dev = torch.zeros(1, dtype=torch.long, device="cuda")  # kept only for the check below


@torch.no_grad()
def step(tapped: bool):
    """One greedy decode step, all on the GPU (capturable): no token ever reaches the host."""
    mask.zero_().masked_fill_(kv_index > pos, float("-inf"))  # attend to the cache written so far
    out = model.model(input_ids=ids, past_key_values=cache, position_ids=pos, attention_mask=mask)
    hidden = out.last_hidden_state[:, -1]  # [BATCH, H], final-norm output: what lm_head reads
    if tapped:
        tap.write(hidden)  # inside the graph: each replay copies its rows into the next slot
        seen.index_copy_(0, t_dev, hidden.unsqueeze(0))
        t_dev.add_(1)
    ids.copy_(model.lm_head(hidden).argmax(-1, keepdim=True))
    pos.add_(1)


with torch.no_grad():  # prefill, eager
    prompt = torch.randint(config.vocab_size, (BATCH, PROMPT), device="cuda")
    out = model.model(input_ids=prompt, past_key_values=cache,
                      position_ids=torch.arange(PROMPT, device="cuda").unsqueeze(0))
    ids.copy_(model.lm_head(out.last_hidden_state[:, -1]).argmax(-1, keepdim=True))
pos.fill_(PROMPT)
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm up outside the capture (cuBLAS handles, lazy allocations)
    step(tapped=False)
torch.cuda.current_stream().wait_stream(side)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    step(tapped=True)

start = time.perf_counter()
for _ in range(STEPS):
    graph.replay()
    tap.step()  # the decode thread's only per-step work: a count; every WINDOW steps, one Score
tap.close()  # scores a partial window, waits for every window's scores
elapsed = time.perf_counter() - start

expected = torch.sigmoid(seen.cpu().double() @ weight.bfloat16().double().T
                         + bias.bfloat16().double())
error = 0.0
for window in windows:
    for record in window.records():
        got = torch.from_numpy(record.scores).double()
        error = max(error, float((got - expected[record.step, record.row]).abs().max()))
print(f"{STEPS} steps x {BATCH} sequences in {elapsed * 1e3:.1f} ms, {len(windows)} windows; "
      f"window latency (GPU, close -> scores): "
      f"{max(w.device_latency_s for w in windows) * 1e3:.2f} ms at most")
print(f"max |sidecar - float64 reference| over every step: {error:.2e}")
client.close()
sys.exit(0 if error < 1e-3 and sum(w.steps for w in windows) == STEPS else 1)
