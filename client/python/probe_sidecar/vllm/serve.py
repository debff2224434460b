"""The plugin's route on `vllm serve`'s HTTP server: an HTTP client fetches a finished request's
probe summaries by the id its response carried.

    VLLM_PLUGINS=probe_sidecar vllm serve MODEL --additional-config '{"probe_sidecar": {...}}'
    GET /v1/probe_sidecar/summaries/{id}[?wait_s=5]

`id` is the response's `id` (`cmpl-...` of a completion, `chatcmpl-...` of a chat completion, or
the `X-Request-Id` header's value it was made from). The answer lists every engine request of that
response — one per prompt of a completion, one per completion with `n > 1` — with its summaries
({probe set: ProbeSummary as a dict}); 404 when none is known within `wait_s` seconds (a request's
summary is made once the window holding its last rows has been scored: up to the plugin's
`max_window_s` after its response ended). A summary is handed out once and then forgotten; those
never fetched are kept at most `max_finished` requests and `max_finished_s` seconds.

A `vllm.endpoint_plugins` entry point, paired with the `vllm.general_plugins` one that gives the
worker its side (`probe_sidecar_take`, through vLLM's worker_extension_cls: extension.py): vLLM
loads endpoint plugins only when named in `VLLM_PLUGINS`. The route is under `/v1`, so `vllm serve
--api-key` guards it like the completions.
"""

# No `from __future__ import annotations`: FastAPI reads the route's parameter types (Request
# among them, imported where the route is made) from the function itself.
import asyncio
import time
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # Any to mypy, which follows neither (pyproject.toml): vLLM brings FastAPI.
    from argparse import Namespace

    from fastapi import FastAPI
    from fastapi.datastructures import State
    from vllm.engine.protocol import EngineClient

POLL_S = 0.05  # between two looks for a summary not made yet
MAX_WAIT_S = 60.0


class SummariesEndpoint:
    """The endpoint plugin (vLLM's EndpointPlugin protocol)."""

    name = "probe_sidecar"
    required_tasks = ("generate",)

    def attach_router(self, app: "FastAPI") -> None:
        from fastapi import APIRouter, HTTPException, Request

        from .extension import TAKE

        router = APIRouter()

        @router.get("/v1/probe_sidecar/summaries/{response_id}")
        async def summaries(response_id: str, request: Request, wait_s: float = 5.0) -> dict:
            engine = getattr(request.app.state, "probe_sidecar_engine", None)
            if engine is None:
                raise HTTPException(503, "probe-sidecar: this server has no engine")
            if not 0 <= wait_s <= MAX_WAIT_S:
                raise HTTPException(400, f"wait_s must be within [0, {MAX_WAIT_S:g}]")
            deadline = time.monotonic() + wait_s
            while True:
                found: dict[str, Any] = {}
                for part in await engine.collective_rpc(TAKE, args=(response_id,)):
                    found.update(part)
                if found or time.monotonic() >= deadline:
                    break
                await asyncio.sleep(POLL_S)
            if not found:
                raise HTTPException(404, f"probe-sidecar: no finished request of {response_id!r} "
                                         f"has a summary (not finished, not scored by the plugin, "
                                         f"already fetched, or evicted)")
            requests = [dict(request_id=rid, **response_part(response_id, rid), summaries=by_set)
                        for rid, by_set in sorted(found.items())]
            return {"id": response_id, "requests": requests,
                    "complete": all(s["complete"] for r in requests
                                    for s in r["summaries"].values())}

        app.include_router(router)

    async def init_state(self, engine_client: "EngineClient", state: "State",
                         args: "Namespace") -> None:
        state.probe_sidecar_engine = engine_client


def response_part(response_id: str, engine_id: str) -> dict[str, int]:
    """Which prompt (of a completion's prompts) and which completion (of n) an engine request of
    response `response_id` is: vLLM names them "<index>_<id>-<prompt>-<8 characters>"."""
    from .engine_tap import _caller_id

    name = _caller_id(engine_id)
    completion = 0
    head, sep, rest = name.partition("_")
    if sep and head.isdigit() and rest.startswith(response_id):
        completion, name = int(head), rest
    tail = name[len(response_id):].lstrip("-")
    return {"prompt_index": int(tail) if tail.isdigit() else 0, "completion_index": completion}


def belongs(response_id: str, engine_id: str) -> bool:
    """Whether engine request `engine_id` is one of response `response_id`'s."""
    from .engine_tap import _caller_id

    name = _caller_id(engine_id)
    head, sep, rest = name.partition("_")
    if sep and head.isdigit() and rest.startswith(response_id):
        name = rest
    return name == response_id or (name.startswith(response_id + "-")
                                   and name[len(response_id) + 1:].isdigit())
