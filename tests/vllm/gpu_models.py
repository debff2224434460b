"""Random-weight models for the vLLM tests and benchmark on a GPU, saved as safetensors (bf16) and
loaded by vLLM like any checkpoint (not `load_format="dummy"`, whose weights depend only on the
shapes): the float64 reference runs transformers on the same bf16 weights.

    python gpu_models.py DIR [llama-1b qwen2-small]

  llama-1b     Llama 3.2 1B's shape: H=2048, 16 layers, 32 heads / 8 KV heads, FFN 8192,
               vocabulary 128256, tied embeddings
  qwen2-small  Qwen2.5 0.5B's shape: H=896, 24 layers, 14 heads / 2 KV heads, FFN 4864,
               vocabulary 151936, tied embeddings, QKV biases
Weights are drawn on the GPU from a fixed seed (transformers' initialisation), so a model is the
same on every run; a folder that already holds a model is left as it is.
"""

from __future__ import annotations

import json
import pathlib
import sys

SHAPES = {
    "llama-1b": ("LlamaConfig", "LlamaForCausalLM", dict(
        hidden_size=2048, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
        intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True, rope_theta=500000.0,
        max_position_embeddings=4096, rms_norm_eps=1e-5, bos_token_id=128000,
        eos_token_id=128001)),
    "qwen2-small": ("Qwen2Config", "Qwen2ForCausalLM", dict(
        hidden_size=896, num_hidden_layers=24, num_attention_heads=14, num_key_value_heads=2,
        intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
        rope_theta=1000000.0, max_position_embeddings=4096, rms_norm_eps=1e-6,
        bos_token_id=151643, eos_token_id=151643)),
}


def make(root: pathlib.Path, name: str, seed: int = 0) -> pathlib.Path:
    folder = root / name
    if (folder / "model.safetensors").exists() or (folder / "model.safetensors.index.json").exists():
        return folder
    import torch
    import transformers

    config_class, model_class, shape = SHAPES[name]
    config = getattr(transformers, config_class)(**shape, torch_dtype="bfloat16")
    torch.manual_seed(seed)
    with torch.device("cuda" if torch.cuda.is_available() else "cpu"):
        model = getattr(transformers, model_class)(config).to(torch.bfloat16).eval()
    model.save_pretrained(folder, safe_serialization=True)
    (folder / "probe_sidecar_model.json").write_text(json.dumps({"shape": name, "seed": seed}))
    return folder


def hidden_size(name: str) -> int:
    return SHAPES[name][2]["hidden_size"]


def num_layers(name: str) -> int:
    return SHAPES[name][2]["num_hidden_layers"]


if __name__ == "__main__":
    for model in sys.argv[2:] or list(SHAPES):
        print(make(pathlib.Path(sys.argv[1]), model))
