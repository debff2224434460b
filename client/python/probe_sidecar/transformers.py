"""Probe scoring for a `transformers` causal LM: a forward hook on the model's final norm writes the
last position of every sequence into a tap (probe_sidecar.tap) at every forward pass — the hidden
state that the next token is read from.

Eager generation (each forward is one step; left padding, as generate() pads decoder-only models,
puts every sequence's newest token last):

    model_tap = tap_model(model, client, "demo", max_batch=8, window=16)
    out = model.generate(**inputs, max_new_tokens=64)
    model_tap.flush()                      # score the partial window
    for window in model_tap.tap.windows(timeout=1):
        ...
    model_tap.close()

A CUDA-graphed decode step (static cache): the hook runs only while the step is captured, so it
writes inside the graph and the loop counts replays:

    with model_tap.capturing():            # inside: write only, no step()
        graph = capture(decode_step)
    for _ in range(steps):
        graph.replay()
        model_tap.step()

`client` is a TorchClient for a model on a GPU (a CUDA tap: rows never leave the device) or a
plain Client for a model on the CPU (a host tap: windows travel inline).
"""

from __future__ import annotations

import contextlib

import torch

from .tap import Tap, TapError

_NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f")


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output is the last hidden state (what the LM head reads)."""
    bases = [model.get_decoder()] if hasattr(model, "get_decoder") else []
    bases += [getattr(model, "base_model", None), model]
    for base in bases:
        for name in _NORM_NAMES:
            module = getattr(base, name, None) if base is not None else None
            if isinstance(module, torch.nn.Module):
                return module
    raise TapError(f"cannot find the final norm of {type(model).__name__} (looked for "
                   f"{', '.join(_NORM_NAMES)} on its decoder): pass module= explicitly")


class ModelTap:
    """A tap attached to a model by a forward hook. `step()`, `flush()`, `close()` and the
    results are the tap's (`.tap`)."""

    def __init__(self, model: torch.nn.Module, tap: Tap, module: torch.nn.Module | None = None):
        self.tap = tap
        self.module = module if module is not None else final_norm(model)
        self._mode = "eager"  # eager: write + step; capture: write only; paused: nothing
        self._handle = self.module.register_forward_hook(self._hook)

    def _hook(self, module, args, output) -> None:
        if self._mode == "paused":
            return
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        if hidden.dim() == 3:
            hidden = hidden[:, -1]  # [batch, seq, H] -> each sequence's last position
        self.tap.write(hidden)
        if self._mode == "eager" and not (hidden.is_cuda and
                                          torch.cuda.is_current_stream_capturing()):
            self.tap.step()

    @contextlib.contextmanager
    def capturing(self):
        """Inside: forwards write but do not count a step (the replays will; call step())."""
        previous, self._mode = self._mode, "capture"
        try:
            yield self
        finally:
            self._mode = previous

    @contextlib.contextmanager
    def paused(self):
        """Inside: forwards are not tapped (e.g. a graph's warm-up runs)."""
        previous, self._mode = self._mode, "paused"
        try:
            yield self
        finally:
            self._mode = previous

    def step(self) -> None:
        self.tap.step()

    def flush(self) -> None:
        self.tap.flush()

    def detach(self) -> None:
        """Removes the hook (the tap stays open)."""
        self._handle.remove()

    def close(self) -> None:
        self.detach()
        self.tap.close()

    def __enter__(self) -> "ModelTap":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def tap_model(model: torch.nn.Module, client, probe_set: str, *, max_batch: int,
              window: int = 16, module: torch.nn.Module | None = None, **options) -> ModelTap:
    """Makes a tap for `model`'s hidden size, device and dtype, and attaches it.

    `client`: a TorchClient (model on a GPU) or a Client (model on the CPU). Options: those of
    TorchClient.tap / Client.tap (max_window_s, on_window, submit, ...)."""
    parameter = next(model.parameters())
    hidden_size = getattr(getattr(model, "config", None), "hidden_size", None)
    if parameter.is_cuda:
        if not hasattr(client, "session_id"):
            raise TapError("a model on a GPU needs a TorchClient (probe_sidecar.torch)")
        tap = client.tap(probe_set, max_batch=max_batch, window=window, dtype=parameter.dtype,
                         hidden_size=hidden_size, device=parameter.device, **options)
    else:
        names = {torch.float32: "float32", torch.float16: "float16", torch.bfloat16: "bfloat16"}
        if parameter.dtype not in names:
            raise TapError(f"a model in {parameter.dtype} cannot be tapped (float32, float16 or "
                           f"bfloat16)")
        plain = getattr(client, "client", client)  # a TorchClient wraps a Client
        tap = plain.tap(probe_set, max_batch=max_batch, window=window,
                        dtype=names[parameter.dtype], hidden_size=hidden_size, **options)
    try:
        return ModelTap(model, tap, module)
    except BaseException:
        tap.close()
        raise


__all__ = ["ModelTap", "final_norm", "tap_model"]
