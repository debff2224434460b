"""Probe scoring at every step of a CUDA-graphed decode loop, without stalling it.

Needs a GPU with torch and transformers, and a probe-sidecar serving on the same GPU. Start both
under one MPS control daemon: without MPS the two processes' CUDA contexts take turns on the GPU,
and every sidecar kernel costs the decode loop a time slice.

    export CUDA_MPS_PIPE_DIRECTORY=/tmp/mps CUDA_MPS_LOG_DIRECTORY=/tmp/mps-log
    nvidia-cuda-mps-control -d
    probe-sidecar --backend=cuda &
    python3 decode_loop.py [unix:///tmp/probe-sidecar.sock]

A tiny random Llama stands in for the model. What carries over to a real one: two hidden-state
slots, rows and scores in device buffers, score_async after each replay, and the stream's wait
for a step's scores just before its slot is overwritten.
"""

import sys
import time

import torch
from safetensors.torch import save
from transformers import LlamaConfig, LlamaForCausalLM, StaticCache

from probe_sidecar.torch import TorchClient

target = sys.argv[1] if len(sys.argv) > 1 else "unix:///tmp/probe-sidecar.sock"
BATCH, PROMPT, STEPS, PROBES = 8, 32, 64, 4
torch.manual_seed(0)
config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=4)
model = LlamaForCausalLM(config).to("cuda", torch.bfloat16).eval()
cache = StaticCache(config=config, max_cache_len=PROMPT + STEPS)  # fixed addresses: graphable

client = TorchClient(target)
if not client.client.server_info().mps:
    print("warning: the sidecar is not an MPS client; its kernels and this loop's are time-sliced")
weight = torch.randn(PROBES, config.hidden_size) / config.hidden_size**0.5
bias = torch.randn(PROBES) * 0.1
client.client.load_probe_set(  # once: the server keeps the probe set until it is unloaded
    "example", replace=True, data=save({"weight": weight.bfloat16(), "bias": bias.bfloat16()},
                                       metadata={"activation": "sigmoid"}))

# Everything the graphed step reads or writes lives at a fixed address.
ids = torch.zeros(BATCH, 1, dtype=torch.long, device="cuda")
pos = torch.zeros(1, 1, dtype=torch.long, device="cuda")
kv_index = torch.arange(PROMPT + STEPS, device="cuda").view(1, 1, 1, -1)
mask = torch.zeros(1, 1, 1, PROMPT + STEPS, dtype=torch.bfloat16, device="cuda")
# Two slots: step t writes hidden[t % 2] and the sidecar writes scores[t % 2], so the sidecar reads
# step t's hidden state while step t + 1 runs. One slot would make every step wait for the scores.
hidden = torch.zeros(2, BATCH, config.hidden_size, dtype=torch.bfloat16, device="cuda")
scores = torch.zeros(2, BATCH, PROBES, dtype=torch.float32, device="cuda")
# Which rows of hidden to score, on the device: a request then carries only buffer ids (the
# buffers are registered with the sidecar once, at the first request).
rows = torch.arange(BATCH, dtype=torch.int32, device="cuda")


@torch.no_grad()
def step(slot):
    """One greedy decode step, all on the GPU (capturable): no token ever reaches the host."""
    mask.zero_().masked_fill_(kv_index > pos, float("-inf"))  # attend to the cache written so far
    out = model.model(input_ids=ids, past_key_values=cache, position_ids=pos, attention_mask=mask)
    hidden[slot].copy_(out.last_hidden_state[:, -1])  # final-norm output: what lm_head reads
    ids.copy_(model.lm_head(hidden[slot]).argmax(-1, keepdim=True))
    pos.add_(1)


def rewind():
    """Back to the end of the prompt (the warm-up steps advanced the cache's write position)."""
    ids.copy_(first_ids)
    pos.fill_(PROMPT)
    for layer in cache.layers:
        layer.cumulative_length.fill_(PROMPT)


with torch.no_grad():  # prefill, eager
    prompt = torch.randint(config.vocab_size, (BATCH, PROMPT), device="cuda")
    out = model.model(input_ids=prompt, past_key_values=cache,
                      position_ids=torch.arange(PROMPT, device="cuda").unsqueeze(0))
    first_ids = model.lm_head(out.last_hidden_state[:, -1]).argmax(-1, keepdim=True)
rewind()
side = torch.cuda.Stream()
side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):  # warm up outside the capture (cuBLAS handles, lazy allocations)
    step(0)
    step(1)
torch.cuda.current_stream().wait_stream(side)
graphs = []
for slot in (0, 1):  # one graph per slot; they replay in turn, so they share a memory pool
    graphs.append(torch.cuda.CUDAGraph())
    with torch.cuda.graph(graphs[-1], pool=graphs[0].pool() if slot else None):
        step(slot)
rewind()

stream = torch.cuda.current_stream()
seen = torch.empty(STEPS, BATCH, config.hidden_size, dtype=torch.bfloat16, device="cuda")
history = torch.empty(STEPS, BATCH, PROBES, device="cuda")
pending = {}
start = time.perf_counter()
for t in range(STEPS):
    slot = t % 2
    if t >= 2:
        # Step t is about to overwrite the slot of step t - 2: the stream waits, on the GPU, until
        # the sidecar has read that hidden state and written its scores. The host only waits for
        # the server's answer, which left as soon as the work was queued there, a step ago.
        pending.pop(t - 2).wait_stream(stream)
        history[t - 2].copy_(scores[slot])  # after the wait on the stream: final scores
    graphs[slot].replay()
    seen[t].copy_(hidden[slot])  # kept only for the check below
    # Returns at once (no host sync). It records a ready event on the stream after this replay;
    # the sidecar's stream waits for it on the GPU, so the sidecar reads this step's hidden state.
    pending[t] = client.score_async(hidden[slot], rows, "example", out=scores[slot])
for t in sorted(pending):  # the last two steps
    pending.pop(t).wait_stream(stream)
    history[t].copy_(scores[t % 2])
torch.cuda.synchronize()  # only now does the host wait for the GPU: to print
elapsed = time.perf_counter() - start

expected = torch.sigmoid(seen.double() @ weight.bfloat16().double().T + bias.bfloat16().double())
error = float((history.double() - expected).abs().max())
print(f"{STEPS} steps x {BATCH} sequences in {elapsed * 1e3:.1f} ms; scores of the last step:")
print(history[-1].cpu())
print(f"max |sidecar - float64 reference| over every step: {error:.2e}")
client.close()
sys.exit(0 if error < 1e-3 else 1)
