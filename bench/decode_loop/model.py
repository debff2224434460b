"""The model of the decode-loop benchmark: a Llama-style `transformers` model with random weights
(the shape of Llama 3.2 1B: about 1.24B parameters, bf16), a static KV cache, and one greedy decode
step whose state lives in tensors updated in place, so that the step can be captured in a CUDA
graph and replayed with no host synchronisation.

Nothing is downloaded: the weights are drawn at random from a fixed seed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from transformers import AttentionInterface, LlamaConfig, LlamaForCausalLM, StaticCache
from transformers.integrations.sdpa_attention import sdpa_attention_forward

# Llama 3.2 1B's shape. The default rotary embedding (no rope scaling): the weights are random, so
# only the cost matters, and it is the same.
LLAMA_1B = dict(vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                tie_word_embeddings=True, max_position_embeddings=4096, rms_norm_eps=1e-5)
# For dry runs on a CPU: the same structure (grouped-query attention, tied embeddings), tiny.
TINY = dict(vocab_size=512, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=8, num_key_value_heads=2, head_dim=8, tie_word_embeddings=True,
            max_position_embeddings=1024, rms_norm_eps=1e-5)

ATTENTION = "decode_loop_sdpa"


def _attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """transformers' SDPA attention, except for a single query token against a masked static
    cache. There transformers repeats K and V for every query head (a mask rules out SDPA's
    grouped-query path), copying the whole cache 4x per layer and step, which no serving decode
    kernel does; here the query heads that share a KV head are folded into the query length, so
    the cache is read once, as a real decode kernel reads it."""
    if query.shape[2] != 1 or attention_mask is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=scaling,
                                      dropout=dropout, **kwargs)
    b, h_q, _, d = query.shape
    h_kv = key.shape[1]
    # Query head h uses KV head h // (h_q // h_kv), as transformers' repeat_kv pairs them.
    grouped = query.reshape(b, h_kv, h_q // h_kv, d)
    out = F.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                         scale=scaling)
    return out.reshape(b, h_q, 1, d).transpose(1, 2), None


AttentionInterface.register(ATTENTION, _attention)


def build(shape: dict, device: str, dtype: torch.dtype, seed: int) -> LlamaForCausalLM:
    """A randomly initialised model, built directly on `device` in `dtype`."""
    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(device):
            model = LlamaForCausalLM(LlamaConfig(**shape))
    finally:
        torch.set_default_dtype(previous)
    model.set_attn_implementation(ATTENTION)
    return model.eval().requires_grad_(False)


def parameter_count(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


class Decoder:
    """Greedy decoding of `batch` random prompts with a static cache.

    One step reads `ids` (the previous token of each sequence) and `pos` (its position), writes
    the final-norm hidden state into `hidden[slot]` (what lm_head reads: [batch, H]), and leaves
    the next tokens in `ids` and `pos + 1` in `pos`. All of it is in place on the GPU, so a
    captured step replays correctly and the host never reads a token. Every timed run starts
    from the same state (reset), so every variant decodes the same tokens over the same cache.
    """

    def __init__(self, model: LlamaForCausalLM, batch: int, prompt_len: int, new_tokens: int,
                 ring: int, seed: int):
        config = model.config
        device, dtype = model.device, model.dtype
        self.model = model
        self.batch = batch
        self.prompt_len = prompt_len
        # The mask's last dimension is the cache length; a multiple of 16 keeps SDPA's
        # memory-efficient kernel usable (it needs an aligned mask).
        self.max_len = -(-(prompt_len + new_tokens) // 16) * 16
        self.cache = StaticCache(config=config, max_cache_len=self.max_len)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=device)
        self.pos = torch.zeros(1, 1, dtype=torch.long, device=device)
        self.kv_index = torch.arange(self.max_len, device=device).view(1, 1, 1, -1)
        self.mask = torch.zeros(1, 1, 1, self.max_len, dtype=dtype, device=device)
        # A ring of hidden-state buffers: step t writes slot t % ring, so a reader of step t's
        # hidden state (the sidecar) has until step t + ring before it is overwritten.
        self.hidden = torch.zeros(ring, batch, config.hidden_size, dtype=dtype, device=device)
        self._prefill(seed)

    @torch.no_grad()
    def _prefill(self, seed: int) -> None:
        generator = torch.Generator().manual_seed(seed)
        prompt = torch.randint(self.model.config.vocab_size, (self.batch, self.prompt_len),
                               generator=generator).to(self.ids.device)
        positions = torch.arange(self.prompt_len, device=self.ids.device).unsqueeze(0)
        # No mask: the cache is empty, so a causal prompt attends exactly to its own first
        # prompt_len cache entries (transformers' SDPA path slices them).
        out = self.model.model(input_ids=prompt, past_key_values=self.cache,
                               position_ids=positions, use_cache=True)
        self.first_ids = self.model.lm_head(out.last_hidden_state[:, -1]).argmax(-1, keepdim=True)
        self.reset()

    def reset(self) -> None:
        """Back to the end of the prompt: the next step decodes the first new token again."""
        self.ids.copy_(self.first_ids)
        self.pos.fill_(self.prompt_len)
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.prompt_len)  # where the cache writes next

    @torch.no_grad()
    def step(self, slot: int, tap=None) -> None:
        """One decode step (capturable). `tap(slot)`, if given, runs right after the hidden state
        is written, inside the step, as an in-process probe hook would."""
        hidden = self.hidden[slot]
        hidden.copy_(self._last_position(self.ids, self.pos, self.mask))
        if tap is not None:
            tap(slot)
        self.ids.copy_(self.model.lm_head(hidden).argmax(-1, keepdim=True))
        self.pos.add_(1)

    def _last_position(self, ids, pos, mask) -> torch.Tensor:
        """The forward of one step: the final norm's output at each sequence's last position."""
        # This token attends to the cache entries written so far and to itself; later entries
        # hold an earlier run's tokens (or zeros) and are masked out.
        mask.zero_().masked_fill_(self.kv_index > pos, float("-inf"))
        out = self.model.model(input_ids=ids, past_key_values=self.cache, position_ids=pos,
                               attention_mask=mask, use_cache=True)
        return out.last_hidden_state[:, -1]

    def compiled(self, write=None, compile: bool = True):
        """A step function like step() (call it as step(slot)) whose forward — the mask, the
        model, the final norm's last position, the next token — is one torch.compile'd region;
        `write(h)`, if given, is traced into it on that last position, as a tap's operator is in a
        compiled model (transformers' hook does the same). compile=False: the same function
        uncompiled (a CPU dry run)."""
        def forward(ids, pos, mask):
            last = self._last_position(ids, pos, mask)
            if write is not None:
                write(last)
            return last, self.model.lm_head(last).argmax(-1, keepdim=True)

        run = torch.compile(forward, dynamic=False) if compile else forward

        @torch.no_grad()
        def step(slot: int, tap=None) -> None:
            last, ids = run(self.ids, self.pos, self.mask)
            self.hidden[slot].copy_(last)
            self.ids.copy_(ids)
            self.pos.add_(1)

        return step

    def capture(self, slot: int, tap=None, pool=None, step=None) -> torch.cuda.CUDAGraph:
        """A CUDA graph of step(slot, tap) (or of `step`, e.g. a compiled() one). Graphs of one
        Decoder share `pool` (they replay one at a time, on one stream, so their intermediates
        may share memory). Captured thread-locally: a tap's threads may call CUDA meanwhile."""
        step = step or self.step
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            # Warm-up outside the capture: cuBLAS handles, kernel selection, lazy allocations
            # (and a compiled step's compilation).
            for _ in range(2):
                step(slot, tap)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
            step(slot, tap)
        self.reset()  # the warm-up advanced the state; the capture itself ran nothing
        return graph
