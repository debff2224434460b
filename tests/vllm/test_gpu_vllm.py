"""probe_sidecar.vllm inside a real vLLM engine on a GPU (CUDA build), with the real sidecar on
its CUDA backend (the taps' rings shared by CUDA IPC), bf16, torch.compile and CUDA graphs as
vLLM sets them.

Two random-weight models saved as safetensors (gpu_models.py: Llama 3.2 1B's shape, and a small
Qwen2 with tied embeddings); one engine per (model, mode), all started at once, each through the
scenario of gpu_engine_run.py; the plugin taps the final norm and a decoder layer. Per mode:
  * every generated token of every request (continuous batching, chunked prefill, prefix-cache
    hits, greedy and sampled, n=2, one request ended on a stop token, one aborted) scored once,
    at its position, for both taps; the scores against float64 of the same bf16 weights
    (transformers, an independent implementation); each completion's summary matches its rows;
  * the tap's write runs inside the CUDA graphs vLLM captured and replays (the profile: the
    write kernel launched by cudaGraphLaunch), no graph captured and nothing compiled after the
    start (vLLM's compilation counters), and the plugin adds to a decode step only its own
    kernels: no synchronising call, no memcpy of the ring, no other kernel than the tap's
    (against the same engine without the plugin);
  * nothing is left in the worker afterwards.
Each mode's figures go to $PROBE_SIDECAR_RESULTS_DIR/vllm_engine_correctness.json (rows expected
and scored, max relative error), for bench/vllm_engine/run.py to join to its records.

Needs a GPU and vLLM's CUDA build (tests/gpu/run.sh, step `vllm`); skipped otherwise, failed
instead with PROBE_SIDECAR_REQUIRE_GPU=1.
"""

from __future__ import annotations

import concurrent.futures
import gzip
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

REQUIRED = os.environ.get("PROBE_SIDECAR_REQUIRE_GPU") == "1"


def _need(condition: bool, why: str) -> None:
    if not condition:
        if REQUIRED:
            pytest.fail(f"PROBE_SIDECAR_REQUIRE_GPU=1 but {why}")
        pytest.skip(why, allow_module_level=True)


try:
    import torch
    import vllm  # noqa: F401
except ImportError as error:
    _need(False, f"vLLM's CUDA build is not importable ({error})")
_need(torch.cuda.is_available(), "no CUDA device")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
sys.path.insert(0, str(HERE))
import gpu_models  # noqa: E402
from conftest import Sidecar  # noqa: E402
from safetensors.numpy import save  # noqa: E402

P = 16
# A row's error: the norm of its scores' error over the norm of float64's scores. Every row must
# be within ROW_TOLERANCE (a row of another position or request is off by ~100%): on these
# random-weight models vLLM's own bf16 activations (eager, the control) are off by up to ~6% on
# the worst row, ~1.5% on the median one; MAX_REL_ERR_TARGET is the goal the results report.
ROW_TOLERANCE = 0.1
MAX_REL_ERR_TARGET = 2e-2
# (model, mode, plugin): the engines the test starts, all at once.
# "final-only": the plugin's default tap (the final norm) alone, against the same engine without
# the plugin in the profile comparison; "no-plugin-v1": without the plugin on the V1 model runner,
# which the plugin taps (vLLM 0.26 runs these models on its Model Runner V2 by default).
RUNS = [("llama-1b", "default", True), ("llama-1b", "FULL_AND_PIECEWISE", True),
        ("llama-1b", "PIECEWISE", True), ("llama-1b", "FULL_DECODE_ONLY", True),
        ("llama-1b", "eager", True), ("llama-1b", "default", False),
        ("llama-1b", "default", "final-only"), ("llama-1b", "default", "no-plugin-v1"),
        ("qwen2-small", "default", True), ("qwen2-small", "eager", True)]
# PROBE_SIDECAR_VLLM_RUNS=quick: vLLM's default mode and the eager control on the Llama, and the
# profile's two baselines (a check of a change in less time: fewer engines to compile).
if os.environ.get("PROBE_SIDECAR_VLLM_RUNS") == "quick":
    RUNS = [r for r in RUNS if r[0] == "llama-1b" and r[1] in ("default", "eager")]
LAYER = {"llama-1b": 4, "qwen2-small": 6}  # the decoder layer tapped beside the final norm
ENGINE_DEADLINE_S = 900  # a safety net far past an engine's start and scenario (~1-2 min)


def run_name(model, mode, plugin):
    return f"{model}-{mode}" + {True: "", False: "-no-plugin"}.get(plugin, f"-{plugin}")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm-gpu")
    models_root = pathlib.Path(os.environ.get("PROBE_SIDECAR_VLLM_MODELS", root / "models"))
    models = {name: gpu_models.make(models_root, name) for name in {r[0] for r in RUNS}}
    torch.cuda.empty_cache()
    rng = np.random.default_rng(3)
    probes = {}
    with Sidecar(["--backend=cuda"]) as sidecar:
        with sidecar.client() as c:
            for name in models:
                h = gpu_models.hidden_size(name)
                weight = (rng.standard_normal((P, h)) / np.sqrt(h)).astype(np.float32)
                bias = (rng.standard_normal(P) * 0.1).astype(np.float32)
                thresholds = np.linspace(-1.0, 1.0, P).tolist()
                c.load_probe_set(f"probes-{name}", data=save(
                    {"weight": weight, "bias": bias},
                    metadata={"activation": "none", "thresholds": json.dumps(thresholds)}))
                probes[name] = (weight.astype(np.float64), bias.astype(np.float64), thresholds)
        runs = start_engines(root, sidecar, models)
        yield {"root": root, "models": models, "probes": probes, "runs": runs,
               "sidecar": sidecar}


def start_engines(root, sidecar, models) -> dict:
    """Every engine of RUNS at once, each in a process of its own; {name: its results}."""

    def one(model, mode, plugin):
        name = run_name(model, mode, plugin)
        run = root / name
        run.mkdir()
        env = {**os.environ, "RECORDS_PATH": str(run / "records.jsonl"),
               "VLLM_CACHE_ROOT": str(root / "vllm-cache" / name),
               "VLLM_ENABLE_V1_MULTIPROCESSING": "0", "TOKENIZERS_PARALLELISM": "false",
               "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
        env.pop("PROBE_SIDECAR_VLLM", None)
        if plugin == "no-plugin-v1":
            env["VLLM_USE_V2_MODEL_RUNNER"] = "0"
        elif plugin:
            env["PROBE_SIDECAR_VLLM"] = json.dumps({
                "target": sidecar.uds_target, "probe_sets": [f"probes-{model}"],
                "layer": "final" if plugin == "final-only" else [LAYER[model], "final"],
                "window": 4, "max_window_s": 0.5, "callback": "record_sink:record"})
        argv = [sys.executable, str(HERE / "gpu_engine_run.py"), str(models[model]),
                str(run / "out.json.gz"), mode] + ([] if plugin is True else ["--profile-only"])
        with open(run / "engine.log", "wb") as log:
            code = subprocess.run(argv, stdout=log, stderr=subprocess.STDOUT, env=env,
                                  timeout=ENGINE_DEADLINE_S).returncode
        log_text = (run / "engine.log").read_text(errors="replace")
        if os.environ.get("PROBE_SIDECAR_RESULTS_DIR"):  # kept beside the results
            logs = pathlib.Path(os.environ["PROBE_SIDECAR_RESULTS_DIR"]) / "vllm_engine_logs"
            logs.mkdir(exist_ok=True)
            (logs / f"{name}.log").write_text(log_text)
            for part in ("out.json.gz", "records.jsonl"):
                if (run / part).exists():
                    data = (run / part).read_bytes()
                    if not part.endswith(".gz"):
                        data, part = gzip.compress(data), part + ".gz"
                    (logs / f"{name}.{part}").write_bytes(data)
        result = {"code": code, "log": log_text, "model": model, "mode": mode,
                  "plugin": plugin, "records": []}
        if code == 0:
            with gzip.open(run / "out.json.gz", "rt") as file:
                result["out"] = json.load(file)
            path = run / "records.jsonl"
            if path.exists():
                result["records"] = [json.loads(x) for x in path.read_text().splitlines()]
        return name, result

    with concurrent.futures.ThreadPoolExecutor(len(RUNS)) as pool:
        return dict(pool.map(lambda r: one(*r), RUNS))


def run_of(setup, model, mode, plugin=True) -> dict:
    result = setup["runs"][run_name(model, mode, plugin)]
    assert result["code"] == 0, result["log"][-6000:]
    return result


@pytest.fixture(scope="module")
def reference(setup):
    """{model: hidden(tokens, layer) -> float64 [len(tokens), H]} by transformers on the weights
    vLLM loaded (cached per sequence)."""
    import transformers

    out = {}
    for name, folder in setup["models"].items():
        model = transformers.AutoModelForCausalLM.from_pretrained(
            folder, torch_dtype=torch.float64).cuda().eval()
        cache = {}

        def hidden(tokens, layer, model=model, cache=cache, tapped=LAYER[name]):
            key = tuple(tokens)
            if key not in cache:
                with torch.no_grad():
                    states = model(torch.tensor([tokens], device="cuda"),
                                   output_hidden_states=True).hidden_states
                # hidden_states[i + 1]: decoder layer i's output; the last, after the final norm.
                cache[key] = {"final": states[-1][0].cpu().numpy(),
                              tapped: states[tapped + 1][0].cpu().numpy()}
            return cache[key][layer]

        out[name] = hidden
    yield out
    torch.cuda.empty_cache()


def sequences(out: dict) -> dict:
    """{rows id (the caller's id, or "<index>_<id>" for n > 1): (prompt, generated, finish)}."""
    seqs = {}
    for request in out["first"] + out["batch"] + out["prefix"]:
        for c in request["completions"]:
            rows_id = request["request_id"] if request["n"] == 1 else (
                f"{c['index']}_{request['request_id']}")
            seqs[rows_id] = (request["prompt"], c["tokens"], c["finish_reason"])
    for key, prompt in out["abort"]["prompts"].items():
        seqs[key] = (prompt, out["abort"]["generated"][key], None)
    return seqs


def caller_id(engine_id: str) -> str:
    head, sep, tail = engine_id.rpartition("-")
    return head if sep and len(tail) == 8 else engine_id


def check_run(setup, reference, model, mode) -> dict:
    """Every assertion on one engine's rows; returns the figures of its correctness record."""
    result = run_of(setup, model, mode)
    out = result["out"]
    weight, bias, thresholds = setup["probes"][model]
    seqs = sequences(out)
    taps = {f"probes-{model}@{LAYER[model]}": LAYER[model], f"probes-{model}@final": "final"}
    rows = {}
    for r in result["records"]:
        if r["request_id"].startswith("profile"):
            continue
        rows.setdefault((caller_id(r["request_id"]), r["probe_set"]), []).append(r)
    expected = scored = 0
    worst = worst_element = 0.0
    errors = []
    for rows_id, (prompt, generated, _) in seqs.items():
        first = len(prompt) - 1
        want = list(range(first, first + len(generated)))
        tokens = prompt + generated
        for tap, layer in taps.items():
            got = rows.pop((rows_id, tap), [])
            positions = sorted(r["position"] for r in got)
            assert positions == want, (mode, rows_id, tap, positions, want)
            expected += len(want)
            scored += len(got)
            hidden = reference[model](tokens, layer)
            for r in got:
                ref = hidden[r["position"]] @ weight.T + bias
                diff = np.array(r["scores"]) - ref
                errors.append(float(np.linalg.norm(diff) / np.linalg.norm(ref)))
                worst_element = max(worst_element, float(np.abs(diff).max() / np.abs(ref).max()))
    assert not rows, f"rows of no known request: {sorted(rows)[:5]}"
    worst = max(errors)
    assert worst <= ROW_TOLERANCE, (mode, worst)
    return {"rows_expected": expected, "rows_scored": scored, "max_rel_err": worst,
            "median_rel_err": float(np.median(errors)),
            "max_elementwise_rel_err": worst_element}


CHECKED = {}
TAPPED = [(m, mo) for m, mo, p in RUNS if p is True]  # the runs of the whole scenario


@pytest.mark.parametrize("model,mode", TAPPED)
def test_every_token_scored_once_at_its_position_against_float64(setup, reference, model, mode):
    CHECKED[(model, mode)] = check_run(setup, reference, model, mode)


@pytest.mark.parametrize("model,mode", TAPPED)
def test_the_scenario_exercised_what_it_claims(setup, model, mode):
    """Chunked prefill, prefix-cache hits, n=2, the stop token and the abort really happened."""
    out = run_of(setup, model, mode)["out"]
    assert any(len(q["prompt"]) > 256 for q in out["batch"])  # > one step's token budget
    assert all(q["num_cached_tokens"] >= 256 for q in out["prefix"]), [
        q["num_cached_tokens"] for q in out["prefix"]]
    assert any(q["n"] == 2 and len(q["completions"]) == 2 for q in out["batch"])
    stop = out["batch"][-1]["completions"][0]
    assert stop["finish_reason"] == "stop", stop
    abort = out["abort"]
    assert len(abort["generated"]["keep"]) == 8 and 0 < len(abort["generated"]["drop"]) < 200


@pytest.mark.parametrize("model,mode", TAPPED)
def test_summaries_match_the_rows_and_nothing_is_left(setup, model, mode):
    result = run_of(setup, model, mode)
    out = result["out"]
    for request in out["first"] + out["batch"] + out["prefix"]:
        for c in request["completions"]:
            summary = c["summary"]
            assert summary is not None, (request["request_id"], c["index"])
            for name, s in summary.items():
                assert s["rows"] == len(c["tokens"]) and s["complete"], (name, s)
        if request["n"] == 1:
            assert request["summary"] == request["completions"][0]["summary"]
    for key in ("keep", "drop"):
        (engine_id,) = [r for r in out["abort"]["summaries"] if caller_id(r) == key]
        for s in out["abort"]["summaries"][engine_id].values():
            assert s["rows"] == len(out["abort"]["generated"][key])
    (state,) = out["state"]
    for key in ("steps_pending", "requests_live", "requests_finishing", "requests_summarised",
                "requests_accumulating", "records_queued", "rows_held"):
        assert state[key] == 0, (key, state)
    assert state.get("windows_failed", 0) == 0 and state.get("rows_mismatched", 0) == 0
    assert state["rows_from"] == "starts", state  # no arming kernel per step


GRAPH_MODES = [(m, mo) for m, mo in TAPPED if mo != "eager"]


@pytest.mark.parametrize("model,mode", GRAPH_MODES)
def test_the_write_runs_inside_the_replayed_graphs(setup, model, mode):
    out = run_of(setup, model, mode)["out"]
    profile = out["profile"]
    write = profile["kernels"].get("probe_sidecar_tap_write", {"graph": 0, "direct": 0})
    # Two taps (a layer and the final norm), one write each per step, every one from a graph.
    assert write == {"graph": 2 * profile["steps"], "direct": 0}, (out["config"], write)
    assert out["config"]["cudagraph_mode"] != "CUDAGraphMode.NONE"
    # Nothing captured or compiled once the engine had started.
    assert out["counters_after_profile"] == out["counters_after_start"]


def test_eager_writes_without_graphs(setup):
    profile = run_of(setup, "llama-1b", "eager")["out"]["profile"]
    assert profile["kernels"]["probe_sidecar_tap_write"] == {"graph": 0,
                                                             "direct": 2 * profile["steps"]}


TAP_KERNELS = ("probe_sidecar_tap_write", "probe_sidecar_tap_arm", "probe_sidecar_tap_close")


def step_difference(tapped: dict, plain: dict) -> dict:
    """{kernel: (count with the plugin, without)} for every kernel but the taps' own whose
    launches differ, per profile of the same number of steps."""
    extra = {}
    for name in set(tapped["kernels"]) | set(plain["kernels"]):
        a = tapped["kernels"].get(name, {"graph": 0, "direct": 0})
        b = plain["kernels"].get(name, {"graph": 0, "direct": 0})
        if name not in TAP_KERNELS and a != b:
            extra[name[:120]] = (a, b)
    return extra


def test_a_step_gains_only_the_taps_kernels(setup):
    """The same engine with and without the plugin (its default tap: the final norm), a decode
    step each: the plugin adds its own kernels (the write, the window's close) and nothing else
    — no arming kernel (the write follows vLLM's query_start_loc), no copy of the ring, no other
    kernel (a lost fusion would show), no synchronising call."""
    tapped = run_of(setup, "llama-1b", "default", plugin="final-only")["out"]["profile"]
    plain = run_of(setup, "llama-1b", "default", plugin="no-plugin-v1")["out"]["profile"]
    extra = step_difference(tapped, plain)
    assert not extra, "\n".join(f"{k}: {v}" for k, v in sorted(extra.items()))
    assert tapped["kernels"]["probe_sidecar_tap_write"]["graph"] == tapped["steps"]
    assert "probe_sidecar_tap_arm" not in tapped["kernels"], tapped["kernels"]
    slot_bytes = 8 * 2048 * 2
    for kind in set(tapped["copies"]) | set(plain["copies"]):
        a = tapped["copies"].get(kind, {"count": 0, "bytes": 0})
        b = plain["copies"].get(kind, {"count": 0, "bytes": 0})
        # The taps' score copies (a window's [K, max_batch, P] float32) are all the plugin adds.
        assert a["bytes"] - b["bytes"] < slot_bytes, (kind, a, b)
    # The stepping thread (the one whose waits stall the engine) waits exactly as often; the
    # taps' own threads wait for their windows' copies, off the step.
    for profile in (tapped, plain):
        assert sum(profile["step_thread_calls"].values()) > 0, "no call on the stepping thread"
    assert (tapped["step_thread_synchronising_calls"]
            == plain["step_thread_synchronising_calls"]), (
        tapped["step_thread_synchronising_calls"], plain["step_thread_synchronising_calls"])


def test_what_a_decoder_layer_tap_adds_to_a_step(setup):
    """Recorded, not asserted: what tapping decoder layer 4 beside the final norm changes in a
    step's kernels (the layer's output feeds the next layer's fused add + RMS norm)."""
    tapped = run_of(setup, "llama-1b", "default")["out"]["profile"]
    final = run_of(setup, "llama-1b", "default", plugin="final-only")["out"]["profile"]
    plain = run_of(setup, "llama-1b", "default", plugin="no-plugin-v1")["out"]["profile"]
    v2 = run_of(setup, "llama-1b", "default", plugin=False)["out"]["profile"]
    directory = os.environ.get("PROBE_SIDECAR_RESULTS_DIR")
    if directory:
        (pathlib.Path(directory) / "vllm_engine_step_kernels.json").write_text(json.dumps({
            "steps": tapped["steps"],
            "layer_and_final_taps_vs_v1_runner": step_difference(tapped, plain),
            "final_tap_vs_v1_runner": step_difference(final, plain),
            "v1_runner_vs_v2_runner": step_difference(plain, v2),
            "step_thread_synchronising_calls": {
                "layer_and_final_taps": tapped["step_thread_synchronising_calls"],
                "final_tap": final["step_thread_synchronising_calls"],
                "v1_runner": plain["step_thread_synchronising_calls"],
                "v2_runner": v2["step_thread_synchronising_calls"]}}, indent=1))
    assert (tapped["step_thread_synchronising_calls"]
            == plain["step_thread_synchronising_calls"])


def test_write_the_correctness_records(setup):
    """The figures of every mode checked above, for the results file."""
    directory = os.environ.get("PROBE_SIDECAR_RESULTS_DIR")
    if not directory:
        pytest.skip("PROBE_SIDECAR_RESULTS_DIR is not set: no results file")
    records = []
    for (model, mode), figures in CHECKED.items():
        config = run_of(setup, model, mode)["out"]["config"]
        records.append({"bench": "vllm_engine", "impl": "plugin", "dtype": "bf16",
                        "shape": {"model": model, "batch": 8, "window": 4,
                                  "cudagraph_mode": mode if mode != "default"
                                  else f"default ({config['cudagraph_mode'].split('.')[-1]})",
                                  "async_scheduling": config["async_scheduling"]},
                        "tolerance_per_row": ROW_TOLERANCE,
                        "max_rel_err_target": MAX_REL_ERR_TARGET, **figures})
    path = pathlib.Path(directory) / "vllm_engine_correctness.json"
    path.write_text(json.dumps(records, indent=1))
    assert records
