"""The plugin's worker methods, added to vLLM's worker through vLLM's own extension point:
`ParallelConfig.worker_extension_cls` (`--worker-extension-cls`, `LLM(worker_extension_cls=...)`),
a class vLLM adds to the worker's bases when it makes the worker, and whose methods
`collective_rpc` then calls by name. vLLM 0.26 and 0.32 do the same there
(`WorkerWrapperBase.init_worker`): one qualified class name, resolved in the worker's process,
each of its non-dunder attributes refused if the worker class has it already.

The front end (install.py, where it makes the engine's configuration) sets worker_extension_cls
to this module's WorkerExtension. vLLM takes one class only: when the user gave one, it becomes
a class made here of both, named by the user's class (the dots of its qualified name written as
":"), so that the worker's process, which gets only the name, makes the same class:

    probe_sidecar.vllm.extension.WorkerExtension                  the plugin's alone
    probe_sidecar.vllm.extension.WorkerExtension+my_rl:Extension  the plugin's and my_rl.Extension's

The methods, called with `llm.collective_rpc(name, args=...)` (AsyncLLM's on `vllm serve`):
  probe_sidecar_collect(request_ids, timeout, lengths)  finished requests' summaries (waits)
  probe_sidecar_take(response_id)                       an HTTP response's summaries (no wait)
  probe_sidecar_state()                                 the tap's state ({} where nothing taps)
"""

from __future__ import annotations

import dataclasses
import importlib
import threading
import types
from collections.abc import Callable, Collection
from typing import Any

from .config import ConfigError

COLLECT = "probe_sidecar_collect"
TAKE = "probe_sidecar_take"
STATE = "probe_sidecar_state"
METHODS = (COLLECT, TAKE, STATE)

# A summary as it crosses collective_rpc (ProbeSummary.to_dict): {engine id: {probe set: dict}}.
SummaryDicts = dict[str, dict[str, dict[str, Any]]]


@dataclasses.dataclass(frozen=True)
class WorkerSide:
    """What the plugin does in a worker's process for each method (install.py provides it when
    it is loaded there: `serve_worker`)."""

    collect: Callable[[Collection[str] | None, float, dict[str, int | None] | None], SummaryDicts]
    take: Callable[[str], SummaryDicts]
    state: Callable[[], dict[str, Any]]


_WORKER_SIDE: WorkerSide | None = None


def serve_worker(side: WorkerSide) -> None:
    """Called by install.py as it loads (in every process the plugin is loaded in): where the
    methods below go. (This module stays below install.py: it never imports it.)"""
    global _WORKER_SIDE
    _WORKER_SIDE = side


def _side() -> WorkerSide:
    if _WORKER_SIDE is None:
        raise RuntimeError("the probe-sidecar vLLM plugin is not loaded in this worker's process "
                           "(its entry point did not run there: VLLM_PLUGINS excludes it?)")
    return _WORKER_SIDE


class WorkerExtension:
    """Added to the worker's class by vLLM (its bases); `self` is the worker. The tap itself is
    the process's (install._ENGINE_TAP, made when the worker loads its model)."""

    def probe_sidecar_collect(self, request_ids: Collection[str] | None = None,
                              timeout: float = 60.0,
                              lengths: dict[str, int | None] | None = None) -> SummaryDicts:
        """{engine request id: {probe set: summary dict}} of finished requests (install.collect).
        `lengths` ({caller's or engine's id: tokens, or None}): requests the front end has
        returned finished, which the model runner may not have been told yet."""
        return _side().collect(request_ids, timeout, lengths)

    def probe_sidecar_take(self, response_id: str) -> SummaryDicts:
        """The summaries made so far of the engine requests of an HTTP response (serve.py),
        taken without waiting: {engine request id: {probe set: dict}}."""
        return _side().take(response_id)

    def probe_sidecar_state(self) -> dict[str, Any]:
        """The tap's state ({} on a rank that does not tap)."""
        return _side().state()


NAME = f"{__name__}.{WorkerExtension.__name__}"
_WITH = "+"  # WorkerExtension+<the user's class, its dots as ":">
_lock = threading.Lock()
_made: dict[str, type] = {}  # the classes made of the plugin's and a user's, by name


def extension_for(current: object) -> str:
    """The worker_extension_cls that gives the worker the plugin's methods beside `current`, the
    one the engine was configured with ("" for none); `current` itself when it already does."""
    if current is None or current == "":
        return NAME
    if not isinstance(current, str):
        raise ConfigError(f"probe-sidecar: worker_extension_cls must be a qualified class name "
                          f"(a string), got {current!r}")
    current = current.strip()
    if current == NAME or current.startswith(NAME + _WITH):
        return current
    if "." not in current or ":" in current:
        raise ConfigError(f"probe-sidecar: worker_extension_cls {current!r} is not a qualified "
                          f"class name (module.Class)")
    return NAME + _WITH + current.replace(".", ":")


def user_class_of(name: str) -> str | None:
    """The user's class a worker_extension_cls made by extension_for() composes, or None."""
    prefix = NAME + _WITH
    return name[len(prefix):].replace(":", ".") if name.startswith(prefix) else None


def __getattr__(name: str) -> type:
    """`WorkerExtension+<module:Class>`: the plugin's class and the user's, one class (made once
    per process: vLLM skips a class already among the worker's bases)."""
    if not name.startswith(WorkerExtension.__name__ + _WITH):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    with _lock:
        made = _made.get(name)
        if made is None:
            made = _made[name] = _compose(name)
        return made


def _compose(name: str) -> type:
    qualname = user_class_of(f"{__name__}.{name}")
    assert qualname is not None  # __getattr__ checked the prefix
    module, _, attr = qualname.rpartition(".")
    try:
        user = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as error:
        raise ConfigError(f"probe-sidecar: cannot import the worker extension class "
                          f"{qualname!r} (worker_extension_cls): {error}") from None
    if not isinstance(user, type):
        raise ConfigError(f"probe-sidecar: worker_extension_cls {qualname!r} is not a class")
    clash = sorted(set(METHODS) & set(dir(user)))
    if clash:
        raise ConfigError(f"probe-sidecar: the worker extension class {qualname!r} defines "
                          f"{', '.join(clash)}, which the plugin adds to the worker")
    return types.new_class(name, (WorkerExtension, user), {},
                           lambda body: body.update(__module__=__name__, __qualname__=name))
