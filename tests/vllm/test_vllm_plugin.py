"""probe_sidecar.vllm with a real vLLM engine (PyPI's CPU build) and the real sidecar (CPU backend).

A tiny random-weight Llama is saved with transformers; vLLM loads it (torch.compile on: the tap
operator is traced into the compiled model) and generates several requests at once with
continuous batching and chunked prefill. The plugin scores every row through the sidecar; the
test checks that every generated token of every request was scored exactly once, at its
position, against float64 of the same hidden states computed by transformers on the same
weights; that the summaries on the outputs, the JSONL sink and the records agree; that an
aborted request leaves nothing behind; and that a second start of the engine with another tap
(decoder layer 0 beside the final norm) gets a compile cache key of its own, never the first
start's graph.

Needs the vLLM environment (tests/vllm/setup.sh); skipped without vllm.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

# The CI stage sets PROBE_SIDECAR_REQUIRE_VLLM=1: a broken install then fails the stage instead
# of turning it into "skipped".
if os.environ.get("PROBE_SIDECAR_REQUIRE_VLLM") == "1":
    import vllm  # noqa: F401
else:
    vllm = pytest.importorskip("vllm", reason="vLLM is not installed (tests/vllm/setup.sh makes "
                                              "its environment)")
torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))
from conftest import Sidecar  # noqa: E402  (tests/python: the real server binary)
from safetensors.numpy import save  # noqa: E402

H = 128
THRESHOLDS = [0.0, 0.5, -0.5, 1e9]
# An engine start here takes ~1-2 minutes on an idle 2-core machine (it compiles the model); the
# deadline is a safety net for a loaded one.
ENGINE_DEADLINE_S = 1800


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("vllm")
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=512, hidden_size=H, intermediate_size=256,
                                      num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, max_position_embeddings=512,
                                      tie_word_embeddings=False)
    model = transformers.LlamaForCausalLM(config).eval()
    model.save_pretrained(root / "model", safe_serialization=True)
    save_tokenizer(root / "model")
    rng = np.random.default_rng(1)
    weight = (rng.standard_normal((4, H)) / np.sqrt(H)).astype(np.float32)
    bias = (rng.standard_normal(4) * 0.1).astype(np.float32)
    with Sidecar(["--backend=cpu"]) as sidecar:
        with sidecar.client() as c:
            c.load_probe_set("tiny", data=save(
                {"weight": weight, "bias": bias},
                metadata={"activation": "none", "thresholds": json.dumps(THRESHOLDS),
                          "probe_names": '["a", "b", "c", "never"]'}))
            c.load_probe_set("tiny_sigmoid", data=save(
                {"weight": weight[:2], "bias": bias[:2]},
                metadata={"activation": "sigmoid", "thresholds": "[0.5, 0.9]"}))
        yield {"root": root, "model_dir": root / "model", "model": model.double(),
               "sidecar": sidecar, "weight": weight.astype(np.float64),
               "bias": bias.astype(np.float64), "cache": root / "vllm-cache"}


def save_tokenizer(folder) -> None:
    """A word-level tokenizer of the model's 512 ids ("t0" ... "t511") with a chat template, for
    `vllm serve` and LLM.chat (the other runs pass token ids)."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(512)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="t0",
                                                bos_token="t2", eos_token="t1")
    fast.chat_template = "{% for m in messages %}t3 {{ m['content'] }} {% endfor %}t4"
    fast.save_pretrained(folder)


# Every row is scored whatever the machine's speed: with the plugin's default ("lose") a window the
# sidecar is not ready for is given up, which a loaded 2-core CI machine (the sanitizer builds
# compile beside these tests) makes happen now and then; a summary then says complete: false.
# That behaviour has tests of its own, without vLLM (tests/python/test_engine_tap.py).
EVERY_ROW = {"when_behind": "wait"}


def run_engine(setup, name: str, scenario: str, **plugin) -> dict:
    """One engine start (a process of its own); its outputs, records, JSONL events and log."""
    run = setup["root"] / name
    run.mkdir()
    config = {"target": setup["sidecar"].uds_target, "probe_sets": ["tiny", "tiny_sigmoid"],
              "window": 4, "max_window_s": 0.5, "callback": "record_sink:record",
              "jsonl": str(run / "events.jsonl"), "session_labels": {"model": name},
              **EVERY_ROW, **plugin}
    env = {**os.environ, "PROBE_SIDECAR_VLLM": json.dumps(config),
           "RECORDS_PATH": str(run / "records.jsonl"), "VLLM_CACHE_ROOT": str(setup["cache"]),
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]),
           "VLLM_CPU_KVCACHE_SPACE": "1", "TOKENIZERS_PARALLELISM": "false"}
    with open(run / "engine.log", "wb") as log:
        process = subprocess.run(
            [sys.executable, str(HERE / "engine_run.py"), str(setup["model_dir"]),
             str(run / "out.json"), scenario], stdout=log, stderr=subprocess.STDOUT, env=env,
            timeout=ENGINE_DEADLINE_S)
    text = (run / "engine.log").read_text(errors="replace")
    assert process.returncode == 0, text[-8000:]

    def lines(path):
        return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []

    return {"out": json.loads((run / "out.json").read_text()), "log": text,
            "records": lines(run / "records.jsonl"), "events": lines(run / "events.jsonl")}


@pytest.fixture(scope="module")
def batch(setup):
    return run_engine(setup, "batch", "batch")


def reference_hidden(setup, tokens: list[int], layer) -> np.ndarray:
    """float64 hidden states [len(tokens), H]: the final norm's output (layer "final") or decoder
    layer `layer`'s output, by transformers on the weights vLLM loaded."""
    with torch.no_grad():
        out = setup["model"](torch.tensor([tokens]), output_hidden_states=True)
    # hidden_states[i + 1]: decoder layer i's output; the last one is after the final norm.
    index = -1 if layer == "final" else layer + 1
    return out.hidden_states[index][0].numpy()


def expected_scores(setup, hidden: np.ndarray, probe_set: str) -> np.ndarray:
    w, b = setup["weight"], setup["bias"]
    if probe_set.split("@")[0] == "tiny":
        return hidden @ w.T + b
    return 1 / (1 + np.exp(-(hidden @ w[:2].T + b[:2])))


def by_request(records) -> dict:
    rows = {}
    for r in records:
        rows.setdefault((r["request_id"], r["probe_set"]), []).append(r)
    return rows


def check_records_against_float64(setup, records, requests) -> int:
    """Every record of `requests` ({engine id: (prompt, generated)}) against float64 of its layer
    (a tap named "<probe set>@<layer>" scores that layer, else the final norm): returns the rows
    checked."""
    checked = 0
    for (request_id, probe_set), rows in by_request(records).items():
        prompt, generated = requests[request_id]
        tokens = prompt + generated
        layer = probe_set.split("@")[1] if "@" in probe_set else "final"
        hidden = reference_hidden(setup, tokens, "final" if layer == "final" else int(layer))
        for r in rows:
            if r["position"] >= len(tokens):
                continue  # an aborted request's last row: its token never reached the caller
            want = expected_scores(setup, hidden[r["position"]], probe_set)
            got = np.array(r["scores"])
            np.testing.assert_allclose(got, want, rtol=2e-4, atol=2e-4,
                                       err_msg=f"{request_id} position {r['position']}")
            thresholds = THRESHOLDS if probe_set.split("@")[0] == "tiny" else [0.5, 0.9]
            assert r["fired"] == [bool(s >= t) for s, t in zip(r["scores"], thresholds)]
            checked += 1
    return checked


def test_every_generated_token_is_scored_once_at_its_position(batch):
    """Each request's rows: positions prompt - 1 ... prompt + generated - 2, one each (the row a
    token was sampled from), in both probe sets; no partial-prefill chunk, nothing else."""
    requests = batch["out"]["requests"]
    assert len(requests) == 6
    rows = by_request(batch["records"])
    for request in requests:
        engine_ids = {rid for rid, _ in rows if rid.rsplit("-", 1)[0] == request["request_id"]}
        assert len(engine_ids) == 1, (request["request_id"], engine_ids)
        engine_id = engine_ids.pop()
        first = len(request["prompt"]) - 1
        want = list(range(first, first + len(request["generated"])))
        for probe_set in ("tiny", "tiny_sigmoid"):
            got = [r["position"] for r in rows[(engine_id, probe_set)]]
            assert sorted(got) == want, (request["request_id"], probe_set)


def generated_requests(run) -> tuple[dict, list]:
    """({engine id: (prompt, generated)}, their records) for the requests LLM.generate returned."""
    callers = {q["request_id"]: q for q in run["out"]["requests"]}
    requests, records = {}, []
    for r in run["records"]:
        caller = callers.get(r["request_id"].rsplit("-", 1)[0])
        if caller is not None:
            requests[r["request_id"]] = (caller["prompt"], caller["generated"])
            records.append(r)
    return requests, records


def test_scores_match_float64_of_the_same_hidden_states(setup, batch):
    requests, records = generated_requests(batch)
    assert check_records_against_float64(setup, records, requests) == 2 * sum(
        len(q["generated"]) for q in batch["out"]["requests"])


def summaries_from(records) -> dict:
    """What a request's summary must say, recounted from its records."""
    out = {}
    for (request_id, probe_set), rows in by_request(records).items():
        scores = np.array([r["scores"] for r in rows])
        fired = np.array([r["fired"] for r in rows])
        positions = np.array([r["position"] for r in rows])
        first = [int(positions[fired[:, p]].min()) if fired[:, p].any() else None
                 for p in range(scores.shape[1])]
        out[(request_id, probe_set)] = (len(rows), scores.max(axis=0).tolist(), first)
    return out


def test_summaries_on_the_outputs_and_the_jsonl_events_match_the_records(batch):
    recount = summaries_from(generated_requests(batch)[1])
    for request in batch["out"]["requests"]:
        summary = request["summary"]
        assert summary is not None and set(summary) == {"tiny", "tiny_sigmoid"}
        for probe_set, s in summary.items():
            key = next(k for k in recount if k[1] == probe_set
                       and k[0].rsplit("-", 1)[0] == request["request_id"])
            rows, max_score, first = recount[key]
            assert (s["rows"], s["first_fired"], s["complete"]) == (rows, first, True)
            np.testing.assert_allclose(s["max_score"], max_score, rtol=0, atol=0)
        assert summary["tiny"]["probes"] == ["a", "b", "c", "never"]
        assert summary["tiny"]["first_fired"][3] is None  # a threshold never reached
    fired = [e for e in batch["events"] if e["event"] == "fired"]
    assert len(fired) == sum(sum(r["fired"]) for r in batch["records"])
    want = {(r["request_id"], r["position"], r["probe_set"], p)
            for r in batch["records"] for p, f in enumerate(r["fired"]) if f}
    assert {(e["request_id"], e["position"], e["probe_set"], e["probe_index"])
            for e in fired} == want
    finished = [e["request_id"] for e in batch["events"] if e["event"] == "request"]
    assert sorted(finished) == sorted({r["request_id"] for r in batch["records"]})  # each, once


def test_an_aborted_request_leaves_nothing_stale(setup, batch):
    aborted = batch["out"]["aborted"]
    summaries = aborted["summaries"]
    ids = {rid.rsplit("-", 1)[0]: rid for rid in summaries}
    assert set(ids) == {"keep", "drop"}
    keep, drop = summaries[ids["keep"]], summaries[ids["drop"]]
    assert keep["tiny"]["rows"] == len(aborted["generated"]["keep"]) == 8
    # Aborted after five steps: its rows stop there (at most one row whose token it never saw).
    assert 0 < drop["tiny"]["rows"] <= len(aborted["generated"]["drop"]) + 1 < 50
    records = [r for r in batch["records"] if r["request_id"] in ids.values()]
    drop_positions = sorted(r["position"] for r in records
                            if r["request_id"] == ids["drop"] and r["probe_set"] == "tiny")
    assert drop_positions == list(range(2, 2 + drop["tiny"]["rows"]))
    requests = {ids[k]: (aborted["prompts"][k], aborted["generated"][k]) for k in ids}
    assert check_records_against_float64(setup, records, requests) >= 2 * (8 + 4)
    # Nothing held once the summaries were taken: no live request, pending step or summary.
    for state in (aborted["state_after"], batch["out"]["state"]):
        (tap_state,) = state
        for key in ("steps_pending", "requests_live", "requests_finishing",
                    "requests_summarised", "requests_accumulating", "records_queued"):
            assert tap_state[key] == 0, (key, tap_state)
        assert tap_state.get("windows_failed", 0) == 0
        assert tap_state.get("rows_mismatched", 0) == 0
        # The rows come from the runner's query_start_loc: no arming per step.
        assert tap_state["rows_from"] == "starts", tap_state


def test_the_sidecar_counts_the_engines_rows_under_its_labels(setup, batch):
    """The engine's session labels (session_labels) label its probe-outcome series on the
    sidecar's /metrics: every delivered row is counted there, and the only rows counted beyond
    them are the last positions of partial prefill chunks (written, scored, not delivered)."""
    from prometheus_client.parser import text_string_to_metric_families

    counted = {}
    for family in text_string_to_metric_families(setup["sidecar"].metrics_text()):
        for sample in family.samples:
            if (sample.name == "probesidecar_probe_set_rows_scored_total"
                    and sample.labels.get("model") == "batch"):
                counted[sample.labels["probe_set"]] = sample.value
    delivered = {name: sum(r["probe_set"] == name for r in batch["records"])
                 for name in ("tiny", "tiny_sigmoid")}
    prompts = [q["prompt"] for q in batch["out"]["requests"]] + [
        q["prompt"] for q in batch["out"]["second"]["generate"][:3]]  # the fourth opted out
    chunks = sum(-(-len(p) // 32) for p in prompts)
    for name, rows in delivered.items():
        assert rows <= counted[name] <= rows + chunks, (name, counted, delivered)


def test_the_tap_joins_the_compile_cache_key(setup):
    """vLLM reuses a compiled graph whose key (VllmConfig.compute_hash) matches: the plugin's
    configuration, and the rings' layouts, must change that key, and the same ones must give the
    same key again (a restart finds its own graph)."""
    from vllm.engine.arg_utils import EngineArgs

    from probe_sidecar.vllm import install

    def key(value):
        config = EngineArgs(model=str(setup["model_dir"]), skip_tokenizer_init=True,
                            dtype="float32").create_engine_config()
        if value is not None:
            install._add_to_cache_key(config, value)
        return config.compute_hash()

    tapped = {"probe_sidecar": "a", "layouts": [[0, 1]]}
    assert key(tapped) == key(dict(tapped))
    assert len({key(None), key(tapped), key({"probe_sidecar": "a", "layouts": [[0, 2]]}),
                key({"probe_sidecar": "b", "layouts": [[0, 1]]})}) == 4


def compile_cache_entry(log: str) -> tuple[str, str]:
    """(what vLLM did with its compiled-graph cache, the cache key's folder) from an engine log."""
    for event, pattern in (("loaded", r"Directly load AOT compilation from path (\S+)"),
                           ("saved", r"saved AOT compiled function to (\S+)")):
        match = re.search(pattern, log)
        if match:
            return event, match.group(1).split("/torch_aot_compile/")[1].split("/")[0]
    raise AssertionError("no compile cache line in the engine's log")


@pytest.fixture(scope="module")
def layers(setup):
    """The engine started again, tapping decoder layer 0 beside the final norm, with a worker
    extension class of the user's own (engine_run.py's "short")."""
    return run_engine(setup, "layers", "short", layer=[0, "final"])


def test_a_second_start_tapping_other_layers_compiles_its_own_graph(setup, batch, layers):
    """The engine started again, tapping decoder layer 0 beside the final norm (one tap per probe
    set and layer): its cache key is not the first start's, so it compiles its own graph (a graph
    of the first tap would score the wrong layer), and each layer's rows are scored."""
    first_event, first_key = compile_cache_entry(batch["log"])
    layers_event, layers_key = compile_cache_entry(layers["log"])
    assert (first_event, layers_event) == ("saved", "saved") and layers_key != first_key
    requests, records = generated_requests(layers)
    assert len({r["probe_set"] for r in records}) == 4
    checked = check_records_against_float64(setup, records, requests)
    assert checked == 4 * sum(len(q["generated"]) for q in layers["out"]["requests"])
    summary = layers["out"]["requests"][0]["summary"]
    assert set(summary) == {"tiny@0", "tiny@final", "tiny_sigmoid@0", "tiny_sigmoid@final"}
    # LLM.chat's output carries its summary too, and its rows are right.
    (chat,) = layers["out"]["chat"]
    assert all(s["rows"] == len(chat["generated"]) == 5 and s["complete"]
               for s in chat["summary"].values())
    rows = [r for r in layers["records"] if caller_id(r["request_id"]) == chat["request_id"]]
    engine_ids = {r["request_id"] for r in rows}
    assert check_records_against_float64(
        setup, rows, {rid: (chat["prompt"], chat["generated"]) for rid in engine_ids}) == 4 * 5


PLUGIN_METHODS = ["probe_sidecar_collect", "probe_sidecar_state", "probe_sidecar_take"]


def injected(log: str) -> tuple[str, list[str]]:
    """(the extension class vLLM added to the worker, the methods it says it added) from vLLM's
    own log line (WorkerWrapperBase.init_worker)."""
    match = re.search(r"Injected <class '([^']+)'> into <class '[^']+'> for extended "
                      r"collective_rpc calls \[([^\]]*)\]", log)
    assert match, "vLLM did not log a worker extension class"
    return match.group(1), sorted(re.findall(r"'([^']+)'", match.group(2)))


def test_the_plugins_worker_methods_come_from_vllms_worker_extension_cls(batch):
    """The plugin's collective_rpc methods are vLLM's doing: its worker_extension_cls, which the
    plugin set where the engine's configuration was made (no user class given), and which vLLM
    added to the worker; collect() and state() reached them by name."""
    assert injected(batch["log"]) == ("probe_sidecar.vllm.extension.WorkerExtension",
                                      PLUGIN_METHODS)
    (tap_state,) = batch["out"]["state"]  # plugin.state(llm): collective_rpc by name
    assert tap_state["steps_counted"] > 0


def test_a_users_own_worker_extension_class_works_beside_the_plugins(layers):
    """vLLM takes one worker_extension_cls: given the user's (user_extension.UserExtension), the
    plugin makes one class of both. The user's method and the plugin's three are all reachable
    by name through collective_rpc on the same worker."""
    rpc = layers["out"]["rpc"]
    composed = "probe_sidecar.vllm.extension.WorkerExtension+user_extension:UserExtension"
    assert rpc["worker_extension_cls"] == composed
    assert injected(layers["log"]) == (composed, PLUGIN_METHODS + ["user_extension_echo"])
    (user,) = rpc["user"]
    assert user["value"] == "hello" and user["plugin_methods"] == PLUGIN_METHODS
    (tap_state,) = rpc["state"]
    assert tap_state["steps_counted"] > 0 and tap_state["requests_live"] == 0
    assert rpc["collect"] == [{}] and rpc["take"] == [{}]  # nothing left of those ids


def test_the_worker_extension_joins_the_configuration_not_the_cache_key(setup):
    """add_worker_extension (what the plugin does to the configuration create_engine_config made)
    on a configuration without and with a user's class: the plugin's class, or one of both that
    vLLM's own resolver finds and whose attributes pass vLLM's own conflict check against the
    worker class; the same again is a no-op, and the compile cache key does not move. A user
    class that defines one of the plugin's methods is refused, naming it."""
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.cpu_worker import CPUWorker

    from probe_sidecar.vllm import ConfigError, extension, install

    def config(**kwargs):
        return EngineArgs(model=str(setup["model_dir"]), skip_tokenizer_init=True,
                          dtype="float32", **kwargs).create_engine_config()

    plain = config()
    key = plain.compute_hash()
    assert install.add_worker_extension(plain) == extension.NAME
    assert plain.parallel_config.worker_extension_cls == extension.NAME
    assert install.add_worker_extension(plain) == extension.NAME  # already there
    assert plain.compute_hash() == key
    assert resolve_obj_by_qualname(extension.NAME) is extension.WorkerExtension

    mine = config(worker_extension_cls="user_extension.UserExtension")
    name = install.add_worker_extension(mine)
    assert name == extension.NAME + "+user_extension:UserExtension"
    assert install.add_worker_extension(mine) == name and mine.compute_hash() == key
    both = resolve_obj_by_qualname(name)
    assert both is resolve_obj_by_qualname(name)  # one class: vLLM adds a base once
    import user_extension

    assert issubclass(both, extension.WorkerExtension)
    assert issubclass(both, user_extension.UserExtension)
    added = [a for a in dir(both) if not a.startswith("__")]
    assert sorted(added) == PLUGIN_METHODS + ["user_extension_echo"]
    assert not [a for a in added if hasattr(CPUWorker, a)]  # vLLM's check at the worker's start

    clash = config(worker_extension_cls="user_extension.ClashingExtension")
    with pytest.raises(ConfigError, match="probe_sidecar_state"):
        resolve_obj_by_qualname(install.add_worker_extension(clash))
    with pytest.raises(ConfigError, match="not a qualified class name"):
        extension.extension_for("NoModule")


def test_a_worker_or_model_runner_unlike_the_supported_ones_is_refused_at_start():
    """The startup checks: a worker without the plugin's methods (a configuration not made by
    create_engine_config) is refused with the worker_extension_cls to set; a model runner whose
    private methods or batch state the plugin relies on changed is refused with what changed
    (what PROBE_SIDECAR_VLLM_ANY_VERSION=1 lets through on another release); and the running
    vLLM is a supported release, whose error names both supported releases."""
    import types

    from probe_sidecar.vllm import ConfigError, install

    config = types.SimpleNamespace(parallel_config=types.SimpleNamespace(worker_extension_cls=""))
    with pytest.raises(ConfigError, match=r"no probe_sidecar_collect.*worker_extension_cls="
                                          r"'probe_sidecar\.vllm\.extension\.WorkerExtension'"):
        install._require_extension(object(), config)

    class Runner:
        input_batch = types.SimpleNamespace(req_ids=[], num_reqs=0, num_computed_tokens_cpu=None,
                                            num_tokens_no_spec=None)
        query_start_loc = types.SimpleNamespace(np=None)

        def _prepare_inputs(self, scheduler_output, num_scheduled_tokens):
            pass

        def execute_model(self, scheduler_output, intermediate_tensors=None):
            pass

        def get_model(self):
            pass

    assert install.runner_mismatches(Runner()) == []

    class Changed(Runner):
        input_batch = types.SimpleNamespace(req_ids=[])

        def _prepare_inputs(self, scheduler_output):
            pass

        execute_model = None

    assert install.runner_mismatches(Changed()) == [
        "_prepare_inputs(scheduler_output), not (scheduler_output, num_scheduled_tokens, ...)",
        "no execute_model",
        "no input_batch.num_reqs, input_batch.num_computed_tokens_cpu, "
        "input_batch.num_tokens_no_spec"]
    assert install.check_version(environ={}) == ".".join(vllm.__version__.split(".")[:2])
    with pytest.raises(ConfigError, match=r"vLLM 0\.31\.0 is not a supported release: the plugin "
                                          r"supports vLLM 0\.26\.x \(.*\) and 0\.32\.x \(.*\) "
                                          r"only\..*PROBE_SIDECAR_VLLM_ANY_VERSION=1"):
        install.check_version("0.31.0", environ={})


@pytest.fixture(scope="module")
def served(setup):
    """`vllm serve` (the CPU build) with the plugin configured through --additional-config and its
    route allowed (VLLM_PLUGINS), and what serve_run.py's HTTP client got from it."""
    run = setup["root"] / "serve"
    run.mkdir()
    config = {"target": setup["sidecar"].uds_target, "probe_sets": ["tiny"], "window": 4,
              "max_window_s": 0.5, "callback": "record_sink:record", **EVERY_ROW}
    env = {**os.environ, "RECORDS_PATH": str(run / "records.jsonl"), "VLLM_PLUGINS": "probe_sidecar",
           "VLLM_CACHE_ROOT": str(setup["cache"]), "VLLM_CPU_KVCACHE_SPACE": "1",
           "TOKENIZERS_PARALLELISM": "false",
           "PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")])}
    env.pop("PROBE_SIDECAR_VLLM", None)  # configured by --additional-config alone
    with open(run / "client.log", "wb") as log:
        process = subprocess.run(
            [sys.executable, str(HERE / "serve_run.py"), str(setup["model_dir"]),
             json.dumps({"probe_sidecar": config}), str(run / "out.json"), str(run / "serve.log")],
            stdout=log, stderr=subprocess.STDOUT, env=env, timeout=ENGINE_DEADLINE_S)
    text = (run / "client.log").read_text(errors="replace")
    serve_log = (run / "serve.log").read_text(errors="replace") if (run / "serve.log").exists() else ""
    assert process.returncode == 0, text[-4000:] + "\n--- vllm serve ---\n" + serve_log[-6000:]
    records = [json.loads(x) for x in (run / "records.jsonl").read_text().splitlines()]
    return {"out": json.loads((run / "out.json").read_text()), "records": records,
            "log": serve_log}


def test_vllm_serve_scores_every_request_and_hands_out_summaries_by_response_id(setup, served):
    """Completions (two prompts in one request; streamed) and chat completions (n=2; streamed)
    over HTTP: each response's summaries come back by its id, one per prompt and completion, with
    a row per generated token; every record against float64; a request that opted out
    (vllm_xargs) is not scored at all."""
    from probe_sidecar.vllm.serve import belongs, response_part

    out = served["out"]
    scored = {k: v for k, v in out["responses"].items() if k != "opted_out"}
    requests = {}
    for name, response in scored.items():
        fetched = response["summaries"]
        assert fetched["id"] == response["id"] and fetched["complete"], (
            name, fetched, [x for x in served["log"].splitlines() if "probe-sidecar" in x][-20:])
        parts = {(p["prompt_index"], p["completion_index"]): p for p in fetched["requests"]}
        generated = {(p, c): tokens for p, c, tokens in response["generated"]}
        assert set(parts) == set(generated), (name, sorted(parts), sorted(generated))
        for (prompt_index, completion_index), tokens in generated.items():
            part = parts[(prompt_index, completion_index)]
            assert part["summaries"]["tiny"]["rows"] == len(tokens), (name, part)
            prompt = response["prompts"][prompt_index]
            if prompt is not None and tokens and tokens[0] is not None:
                requests[part["request_id"]] = (prompt, tokens)
    records = [r for r in served["records"] if r["request_id"] in requests]
    assert check_records_against_float64(setup, records, requests) == sum(
        len(t) for _, t in requests.values())
    opted_out = out["responses"]["opted_out"]
    assert opted_out["summaries_status"] == 404 and opted_out["generated"]
    assert not [r for r in served["records"] if belongs(opted_out["id"], r["request_id"])]
    assert out["fetched_twice_status"] == 404  # handed out once
    assert response_part("cmpl-x", "1_cmpl-x-0-0123abcd") == {"prompt_index": 0,
                                                               "completion_index": 1}


def test_a_second_generate_call_sampling_n2_and_an_opted_out_request(setup, batch):
    """A second generate() on the same engine (prefix-cache hits, sampling, n=2): every
    completion carries its own summary, with a row per generated token, its records against
    float64; the request that opted out (extra_args) has no summary and no row."""
    second = batch["out"]["second"]["generate"]
    assert second[0]["num_cached_tokens"] > 0  # the first call's longest prompt, cached
    requests = {}
    for i, request in enumerate(second):
        for completion in request["completions"]:
            if i == 3:  # opted out
                assert completion["summary"] is None
                continue
            summary = completion["summary"]
            assert summary is not None, (request["request_id"], completion["index"])
            assert summary["tiny"]["rows"] == len(completion["generated"]) == 6
            rows_id = request["request_id"] if len(request["completions"]) == 1 else (
                f"{completion['index']}_{request['request_id']}")
            requests[rows_id] = (request["prompt"], completion["generated"])
    assert len(second[2]["completions"]) == 2
    records = [r for r in batch["records"]
               if caller_id(r["request_id"]) in requests]
    engine_requests = {r["request_id"]: requests[caller_id(r["request_id"])] for r in records}
    assert check_records_against_float64(setup, records, engine_requests) == 2 * 6 * 4
    opted_out = second[3]["request_id"]
    assert not [r for r in batch["records"] if caller_id(r["request_id"]) == opted_out]


def caller_id(engine_id: str) -> str:
    from probe_sidecar.vllm.engine_tap import _caller_id

    return _caller_id(engine_id)
