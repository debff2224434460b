"""Probe scoring inside vLLM: a `vllm.general_plugins` entry point that taps a model's hidden
states (the final norm by default, or a decoder layer) with the tap operator, which vLLM's
torch.compile and CUDA graphs keep, and scores every generated token of every request on the
sidecar, a window of steps at a time.

Configured by PROBE_SIDECAR_VLLM (probe_sidecar.vllm.config); off when it is unset:

    export PROBE_SIDECAR_VLLM='{"target": "unix:///tmp/probe-sidecar.sock", "probe_sets": ["demo"]}'

    llm = LLM(model=...)                              # CUDA graphs and torch.compile as usual
    outputs = llm.generate(prompts, params)
    outputs[0].probe_summary["demo"].max_score        # per probe; .first_fired: positions

Per row, in the engine's process: `callback` / `jsonl` in the configuration, or records() here
(with VLLM_ENABLE_V1_MULTIPROCESSING=0 the engine runs in the caller's process). For requests
that LLM.generate() did not return (LLMEngine, aborted ones): collect(llm, ids).
`docs/vllm.md` says what it does inside vLLM and what it refuses.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator
from typing import TYPE_CHECKING, Any

from .config import ConfigError, PluginConfig
from .engine_tap import EngineTap, StepRows
from .records import ProbeRecord, ProbeSummary

if TYPE_CHECKING:
    from vllm import LLM  # Any to mypy: it does not follow vLLM (pyproject.toml)


def register() -> None:
    """The entry point (does nothing unless PROBE_SIDECAR_VLLM is set)."""
    from .install import register as install

    install()


def collect(llm: LLM, request_ids: Collection[str] | None = None, timeout: float = 60.0,
            lengths: dict[str, int | None] | None = None) -> dict[str, dict[str, ProbeSummary]]:
    """{engine request id: {probe set: ProbeSummary}} of finished requests, taken from the
    workers (flushed and waited for): those named (the caller's ids or the engine's), or all.
    `lengths` ({id: prompt + generated tokens, or None}): requests the caller knows have ended
    (returned by LLMEngine.step() as finished, or aborted), finished in the workers first, with
    rows past their lengths dropped."""
    from .install import collect as collect_from

    return collect_from(llm, request_ids, timeout, lengths)


def state(llm: LLM) -> list[dict[str, Any]]:
    """Each worker's tap state (empty on ranks that do not tap): collective_rpc of the method the
    plugin's worker extension adds (extension.py)."""
    from .extension import STATE

    return llm.collective_rpc(STATE)


def current() -> EngineTap | None:
    """This process's engine tap (in the tapping worker's process), or None."""
    from . import install

    return install._ENGINE_TAP


def records(timeout: float = 0.0) -> Iterator[ProbeRecord]:
    """This process's delivered ProbeRecords, oldest first (see EngineTap.records)."""
    engine_tap = current()
    return iter(()) if engine_tap is None else engine_tap.records(timeout)


__all__ = ["ConfigError", "EngineTap", "PluginConfig", "ProbeRecord", "ProbeSummary", "StepRows",
           "collect", "current", "records", "register", "state"]
