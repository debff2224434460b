"""Probe scoring for a `transformers` causal LM: a forward hook on the model's final norm writes the
last position of every sequence into a tap (probe_sidecar.tap) at every forward pass — the hidden
state that the next token is read from. The write is the tap's operator (probe_sidecar.tap_op), so
it is traced into a compiled forward and recorded in a captured CUDA graph like any other op.

generate() — eager, or with a compiled decode forward (`cache_implementation="static"`, which
compiles it on a GPU, or a `torch.compile`d forward): while the tapped model generates, the steps
are counted where generate() steps (once per forward, by a stopping criterion the tap adds), not
in the hook, whose Python a compiled forward never runs:

    model_tap = tap_model(model, client, "demo", max_batch=8, window=16)
    out = model.generate(**inputs, max_new_tokens=64)   # eager or cache_implementation="static"
    model_tap.flush()                      # score the partial window
    for window in model_tap.tap.windows(timeout=1):
        ...
    model_tap.close()

Outside generate(), an eager forward writes and counts a step; a compiled forward only writes
(call model_tap.step() after it). A CUDA-graphed decode step: the hook runs only while the step is
captured, so it writes inside the graph and the loop counts replays:

    with model_tap.capturing():            # inside: write only, no step()
        graph = capture(decode_step)
    for _ in range(steps):
        graph.replay()
        model_tap.step()

`client` is a TorchClient for a model on a GPU (a CUDA tap: rows never leave the device) or a
plain Client (or a TorchClient) for a model on the CPU (a CPU tap: windows travel inline).
Chunked prefill (`prefill_chunk_size`) runs several forwards per step: not supported (the window
then reports more writes than steps).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import torch
from transformers import StoppingCriteriaList

from .client import Client
from .errors import TapError
from .tap import Tap
from .torch import TorchClient, cpu_tap

if TYPE_CHECKING:
    from typing_extensions import Unpack  # typing's from Python 3.11; the package runs on 3.10

    from ._torch_ring import TorchRing
    from .client import HostTapOptions

_NORM_NAMES = ("norm", "final_layernorm", "final_layer_norm", "ln_f")


def final_norm(model: torch.nn.Module) -> torch.nn.Module:
    """The module whose output is the last hidden state (what the LM head reads)."""
    # get_decoder and base_model: a transformers PreTrainedModel's (looked up by name: any
    # torch module may be given).
    bases: list[object] = [getattr(model, "get_decoder")()] if hasattr(model, "get_decoder") else []
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
        self.model = model
        self.module = module if module is not None else final_norm(model)
        self._mode = "eager"  # eager: write + step; capture: write only; paused: nothing
        self._generating = False  # inside generate(): its stopping criterion counts the steps
        self._handle = self.module.register_forward_hook(self._hook)
        # The model's own generate() (a transformers model's: any signature, any output).
        self._generate: Callable[..., Any] | None = None
        generate = getattr(model, "generate", None)
        if callable(generate):
            self._generate = generate
            counted = self._counted_generate
            # setattr: torch.nn.Module's __setattr__, typed for tensors and modules only.
            setattr(model, "generate", functools.wraps(generate)(
                lambda *args, **kwargs: counted(*args, **kwargs)))

    def _hook(self, module: torch.nn.Module, args: tuple[Any, ...],
              output: torch.Tensor | tuple[torch.Tensor, ...] | list[torch.Tensor]) -> None:
        if self._mode == "paused":
            return
        hidden = output[0] if isinstance(output, (tuple, list)) else output
        if hidden.dim() == 3:
            hidden = hidden[:, -1]  # [batch, seq, H] -> each sequence's last position
        if torch.compiler.is_compiling():
            # Traced into a compiled forward: the operator alone (its shape checks run at trace
            # time); a compiled forward runs no Python, so it never counts a step.
            # The ring of a tap made for a model (tap_model: CudaRing or CpuRing).
            cast("TorchRing", self.tap.ring).write_op(hidden)
            return
        self.tap.write(hidden)
        if (self._mode == "eager" and not self._generating
                and not (hidden.is_cuda and torch.cuda.is_current_stream_capturing())):
            self.tap.step()

    def _counted_generate(self, *args: Any, **kwargs: Any) -> Any:
        """model.generate while tapped: one step per forward, counted by a stopping criterion
        (generate() asks it once after every forward, compiled or not) instead of the hook."""
        generate = self._generate
        if generate is None:  # a reference to the counting generate() kept past detach()
            raise TapError("this ModelTap was detached: call model.generate itself")
        criteria = StoppingCriteriaList(kwargs.pop("stopping_criteria", None) or [])
        criteria.append(_StepCounter(self))
        previous, self._generating = self._generating, True
        try:
            return generate(*args, stopping_criteria=criteria, **kwargs)
        finally:
            self._generating = previous

    @contextlib.contextmanager
    def capturing(self) -> Iterator[ModelTap]:
        """Inside: forwards write but do not count a step (the replays will; call step())."""
        previous, self._mode = self._mode, "capture"
        try:
            yield self
        finally:
            self._mode = previous

    @contextlib.contextmanager
    def paused(self) -> Iterator[ModelTap]:
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
        """Removes the hook and the counting generate() (the tap stays open)."""
        self._handle.remove()
        if self._generate is not None and self.model.__dict__.get("generate") is not None:
            del self.model.generate  # the class's generate again
            self._generate = None

    def close(self) -> None:
        self.detach()
        self.tap.close()

    def __enter__(self) -> "ModelTap":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def tap_model(model: torch.nn.Module, client: TorchClient | Client, probe_set: str, *,
              max_batch: int, window: int = 16, module: torch.nn.Module | None = None,
              **options: Unpack[HostTapOptions]) -> ModelTap:
    """Makes a tap for `model`'s hidden size, device and dtype, and attaches it.

    `client`: a TorchClient (model on a GPU) or a Client (model on the CPU). Options: those of
    TorchClient.tap / Client.tap (max_window_s, on_window, submit, ...)."""
    parameter = next(model.parameters())
    hidden_size = getattr(getattr(model, "config", None), "hidden_size", None)
    if parameter.is_cuda:
        if not isinstance(client, TorchClient):
            raise TapError("a model on a GPU needs a TorchClient (probe_sidecar.torch)")
        tap = client.tap(probe_set, max_batch=max_batch, window=window, dtype=parameter.dtype,
                         hidden_size=hidden_size, device=parameter.device, **options)
    else:
        plain = client.client if isinstance(client, TorchClient) else client  # it wraps a Client
        tap = cpu_tap(plain, probe_set, max_batch=max_batch, window=window,
                      dtype=parameter.dtype, hidden_size=hidden_size, **options)
    try:
        return ModelTap(model, tap, module)
    except BaseException:
        tap.close()
        raise


class _StepCounter:
    """A stopping criterion that never stops: it counts the tapped model's steps in generate()."""

    def __init__(self, model_tap: ModelTap):
        self._model_tap = model_tap
        # its answer, made once (never written: generate() combines it)
        self._never: torch.Tensor | None = None

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor,
                 **kwargs: Any) -> torch.Tensor:
        if self._model_tap._mode != "paused":
            self._model_tap.tap.step()
        never = self._never
        batch, device = input_ids.shape[0], input_ids.device
        if never is None or never.shape[0] != batch or never.device != device:
            never = self._never = torch.zeros(batch, dtype=torch.bool, device=device)
        return never


__all__ = ["ModelTap", "final_norm", "tap_model"]
