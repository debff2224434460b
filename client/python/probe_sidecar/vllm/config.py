"""The vLLM plugin's configuration: one environment variable, PROBE_SIDECAR_VLLM, holding a JSON
object or the path of a file holding one. Unset: the plugin does nothing.

    PROBE_SIDECAR_VLLM='{"target": "unix:///tmp/probe-sidecar.sock", "probe_sets": ["demo"]}'

Keys (only `probe_sets` is required):
  target          the sidecar (default unix:///tmp/probe-sidecar.sock)
  probe_sets      probe sets to score every row with (loaded on the sidecar; one tap each)
  layer           "final" (the final norm's output: what the LM head reads; default), a decoder
                  layer's index (its output residual stream; negative counts from the end), or a
                  list of those: every probe set scores every listed layer, and with more than
                  one layer a tap (and what records and summaries name) is "<probe set>@<layer>"
  window          steps per Score (K, default 16)
  max_window_s    a window open this long is scored even if not full, also while the engine is
                  idle (default 1.0; null: only full windows and the end of a generate())
  session_labels  labels of the engine's probe-outcome series on the sidecar's /metrics, e.g.
                  {"model": "llama-3-8b", "replica": "3"} (names the sidecar offers:
                  --session-labels; bounded values only, never request ids)
  tap_rank        the tensor-parallel rank that taps (default 0: the final hidden state is the
                  same on every rank); the others run unchanged
  jsonl           a file to append `fired` and `request` events to (one JSON object per line)
  callback        "module:function" called in the engine's process with every ProbeRecord
  request_callback  "module:function" called with (request_id, {probe_set: ProbeSummary}) when a
                  request's summary is complete
  max_queued_records  records kept for probe_sidecar.vllm.records() in the engine's process
                  (default 0: none kept; the oldest go first)
  max_finished    summaries of finished requests kept until collected (default 10000)
  max_finished_s  and for at most this many seconds (default 600; null: no time bound)
  timeout_s       gRPC deadline for the sidecar's set-up calls (default 30)
  when_behind     "lose" (default): the engine never waits for the sidecar; a window whose half of
                  the ring the sidecar has not finished with is lost (counted; its requests'
                  summaries say complete: false). "wait": the engine's step waits on the host for
                  it, up to timeout_s, so that every row is scored (past that the taps fail for
                  good, loudly): for offline evaluation, where every row counts more than tokens/s
  summary_wait_s  how long LLM.generate() and chat() wait, once generation is over, for the last
                  windows of their requests (default 10): a request whose windows are not scored
                  by then (the sidecar stopped or gone) gets probe_summary None, and its summary
                  stays for collect()
  score_requests  "all" (default): every request is scored unless it opts out; "opted_in": only
                  requests that opt in. A request opts with SamplingParams(extra_args=
                  {"probe_sidecar": "off"}) (or "on"; 0/1 too), over HTTP with
                  "vllm_xargs": {"probe_sidecar": "off"}; its rows are then not written at all.

Also accepted as the "probe_sidecar" key of vLLM's additional config (`vllm serve
--additional-config '{"probe_sidecar": {...}}'`, `LLM(additional_config=...)`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from collections.abc import Callable, Mapping
from typing import Any

ENV = "PROBE_SIDECAR_VLLM"


class ConfigError(ValueError):
    """The plugin's configuration is wrong: the engine does not start."""


@dataclasses.dataclass(frozen=True)
class PluginConfig:
    probe_sets: tuple[str, ...]
    target: str = "unix:///tmp/probe-sidecar.sock"
    layer: str | int | tuple[str | int, ...] = "final"  # "final" or an index, or several
    window: int = 16
    max_window_s: float | None = 1.0
    tap_rank: int = 0
    session_labels: tuple[tuple[str, str], ...] = ()  # ((name, value), ...)
    jsonl: str | None = None
    callback: str | None = None
    request_callback: str | None = None
    max_queued_records: int = 0
    max_finished: int = 10000
    max_finished_s: float | None = 600.0
    timeout_s: float = 30.0
    when_behind: str = "lose"  # or "wait"
    score_requests: str = "all"
    summary_wait_s: float = 10.0

    @property
    def layers(self) -> tuple[str | int, ...]:
        return self.layer if isinstance(self.layer, tuple) else (self.layer,)

    def taps(self) -> dict[str, tuple[str, str | int]]:
        """{tap name: (probe set, layer)}: one tap per probe set and layer."""
        several = len(self.layers) > 1
        return {f"{p}@{layer}" if several else p: (p, layer)
                for layer in self.layers for p in self.probe_sets}

    def digest(self) -> str:
        """What changes the compiled model (which layer is tapped, by which probe sets): vLLM's
        compile cache key must include it, or a graph compiled without the tap would come back."""
        graph = {"layers": list(self.layers), "probe_sets": list(self.probe_sets),
                 "tap_rank": self.tap_rank}
        return hashlib.sha256(json.dumps(graph, sort_keys=True).encode()).hexdigest()[:16]


def load(environ: Mapping[str, str] = os.environ) -> PluginConfig | None:
    """The configuration from PROBE_SIDECAR_VLLM, or None when it is unset or empty."""
    text = environ.get(ENV, "").strip()
    if not text:
        return None
    if not text.startswith("{"):
        try:
            with open(text, encoding="utf-8") as file:
                text = file.read()
        except OSError as error:
            raise ConfigError(f"{ENV}: cannot read {text!r}: {error.strerror}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise ConfigError(f"{ENV}: not valid JSON: {error}") from None
    return parse(data)


def parse(data: object) -> PluginConfig:
    """The configuration of a decoded JSON object; ConfigError for anything wrong in it."""
    if not isinstance(data, dict):
        raise ConfigError(f"{ENV}: expected a JSON object, got {type(data).__name__}")
    fields = {f.name: f for f in dataclasses.fields(PluginConfig)}
    unknown = sorted(set(data) - set(fields))
    if unknown:
        raise ConfigError(f"{ENV}: unknown key(s) {', '.join(unknown)} (known: "
                          f"{', '.join(sorted(fields))})")
    values = dict(data)
    probe_sets = values.get("probe_sets")
    if isinstance(probe_sets, str):
        probe_sets = [probe_sets]
    if (not isinstance(probe_sets, list) or not probe_sets
            or not all(isinstance(p, str) and p for p in probe_sets)):
        raise ConfigError(f"{ENV}: probe_sets must be a non-empty list of probe set names")
    if len(set(probe_sets)) != len(probe_sets):
        raise ConfigError(f"{ENV}: probe_sets names a set twice")
    values["probe_sets"] = tuple(probe_sets)
    layer = values.get("layer", "final")
    layers = layer if isinstance(layer, list) else [layer]
    if not layers or not all(v == "final" or (isinstance(v, int) and not isinstance(v, bool))
                             for v in layers):
        raise ConfigError(f"{ENV}: layer must be \"final\", a decoder layer's index, or a list "
                          f"of those, got {layer!r}")
    if len(set(layers)) != len(layers):
        raise ConfigError(f"{ENV}: layer names a layer twice")
    if isinstance(layer, list):
        values["layer"] = tuple(layers)

    def number(name: str, kind: type[int] | tuple[type[int], type[float]], low: float,
               allow_none: bool = False) -> None:
        value = values.get(name, fields[name].default)
        if value is None and allow_none:
            return
        if not isinstance(value, kind) or isinstance(value, bool) or value < low:
            raise ConfigError(f"{ENV}: {name} must be a number >= {low}, got {value!r}")

    number("window", int, 1)
    number("max_window_s", (int, float), 0.001, allow_none=True)
    number("tap_rank", int, 0)
    number("max_queued_records", int, 0)
    number("max_finished", int, 1)
    number("max_finished_s", (int, float), 0.001, allow_none=True)
    number("timeout_s", (int, float), 0.001)
    number("summary_wait_s", (int, float), 0)

    def choice(name: str, options: tuple[str, ...]) -> None:
        value = values.get(name, fields[name].default)
        if value not in options:
            named = " or ".join(f'"{o}"' for o in options)
            raise ConfigError(f"{ENV}: {name} must be {named}, got {value!r}")

    for name in ("target", "jsonl", "callback", "request_callback"):
        value = values.get(name)
        if value is not None and not isinstance(value, str):
            raise ConfigError(f"{ENV}: {name} must be a string, got {value!r}")
    labels = values.get("session_labels", {})
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                               for k, v in labels.items()):
        raise ConfigError(f"{ENV}: session_labels must be an object of strings, got {labels!r}")
    values["session_labels"] = tuple(sorted(labels.items()))
    choice("when_behind", ("lose", "wait"))
    choice("score_requests", ("all", "opted_in"))
    for name in ("callback", "request_callback"):
        if values.get(name) is not None and ":" not in values[name]:
            raise ConfigError(f"{ENV}: {name} must be \"module:function\", got {values[name]!r}")
    return PluginConfig(**values)


REQUEST_KEY = "probe_sidecar"  # a request's choice, in SamplingParams.extra_args


def request_choice(extra_args: Mapping[str, object] | None) -> bool | None:
    """A request's own choice (extra_args["probe_sidecar"]: "on"/"off", 1/0, true/false), or
    None when it made none; anything else is no choice (vLLM has accepted the request already)."""
    if not extra_args or REQUEST_KEY not in extra_args:
        return None
    value = extra_args[REQUEST_KEY]
    if isinstance(value, str):
        value = value.strip().lower()
    if value in ("on", "1", 1, True, "true"):
        return True
    if value in ("off", "0", 0, False, "false"):
        return False
    return None


def resolve(qualified: str) -> Callable[..., Any]:
    """The function named "module:function"."""
    import importlib

    module, _, name = qualified.partition(":")
    try:
        function = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"{ENV}: cannot import {qualified!r}: {error}") from None
    if not callable(function):
        raise ConfigError(f"{ENV}: {qualified!r} is not callable")
    return function
