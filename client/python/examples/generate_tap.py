"""Probe scores for every token `transformers`' generate() produces, through a tap on the
model's final norm.

Runs on a GPU (a CUDA tap: the rows never leave the device) or on the CPU (a host tap: each
window travels inline; a CPU-backend sidecar is enough):

    probe-sidecar &                       # the CUDA backend on a GPU host, the CPU one elsewhere
    python3 generate_tap.py [unix:///tmp/probe-sidecar.sock]

A tiny random Llama stands in for the model, and a random probe set for yours.
"""

import sys

import torch
from safetensors.torch import save
from transformers import LlamaConfig, LlamaForCausalLM

from probe_sidecar import Client
from probe_sidecar.torch import TorchClient
from probe_sidecar.transformers import tap_model

target = sys.argv[1] if len(sys.argv) > 1 else "unix:///tmp/probe-sidecar.sock"
device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
config = LlamaConfig(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                     num_attention_heads=4, num_key_value_heads=2)
model = LlamaForCausalLM(config).to(device).eval()

client = TorchClient(target) if device == "cuda" else Client(target)
plain = getattr(client, "client", client)
if device == "cuda" and plain.server_info().backend != "cuda":
    sys.exit("this GPU host's sidecar runs the CPU backend: start it with --backend=cuda")
weight, bias = torch.randn(2, config.hidden_size) / config.hidden_size**0.5, torch.zeros(2)
plain.load_probe_set("toxicity", replace=True, data=save(
    {"weight": weight, "bias": bias},
    metadata={"activation": "sigmoid", "probe_names": '["toxic", "off_topic"]',
              "thresholds": "[0.5, 0.6]"}))

prompts = torch.randint(0, config.vocab_size, (3, 8), device=device)
with tap_model(model, client, "toxicity", max_batch=3, window=8) as model_tap, torch.no_grad():
    out = model.generate(prompts, max_new_tokens=20, do_sample=False, pad_token_id=0)
    model_tap.flush()  # the last, partial window
    model_tap.tap.wait_delivered()
    windows = list(model_tap.tap.windows())
records = [r for w in windows for r in w.records()]
fired = [(r.step, r.row) for r in records if r.fired.any()]
print(f"{len(records)} scored rows ({len(windows)} windows) for {out.shape[0]} sequences of "
      f"{out.shape[1] - prompts.shape[1]} new tokens; fired at (step, sequence): {fired[:8]}")
client.close()
sys.exit(0 if len(records) == 3 * 20 else 1)
