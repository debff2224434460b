"""A real Prometheus (Debian's `prometheus` package) scrapes a real probe-sidecar while a client
drives traffic, failures included; then every query of dashboards/probe-sidecar.json and every
rule of dashboards/prometheus/alerts.yml is evaluated through Prometheus' HTTP API.

Also: promtool checks the scrape configs and the rules, runs the rules' unit tests, and the
dashboard and the Grafana provisioning files have the structure Grafana needs."""

from __future__ import annotations

import json
import math
import pathlib
import re
import shutil
import socket
import subprocess
import tempfile
import time

import numpy as np
import pytest
import requests
import yaml

from conftest import Sidecar
from outcome_recount import Recount, assert_matches_proto
from probe_files import ProbeFile
from probe_sidecar import ProbeSidecarError, score_request
from probesidecar.v1 import verify_pb2

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARDS = ROOT / "dashboards"
DASHBOARD = DASHBOARDS / "probe-sidecar.json"
ALERTS = DASHBOARDS / "prometheus" / "alerts.yml"
ALERTS_TEST = DASHBOARDS / "prometheus" / "alerts_test.yml"
SCRAPE_CONFIG = DASHBOARDS / "prometheus" / "prometheus.yml"
JOB = "probe-sidecar"  # the job name alerts.yml's ProbeSidecarDown selects
RATE_INTERVAL = "30s"  # what $__rate_interval becomes (Grafana: >= 4 scrape intervals)
TRAFFIC_SECONDS = 6.0
H = 64
LARGEST_FINITE_BUCKET = 1.0  # seconds: histogram_quantile never returns more
# The stack's bounds on outcome series: prom_p3 (3 probes) is labelled per probe, demo (4) has one
# probe="_all" series; the first labelled session gets series of its own, the second "_other".
MAX_PROBE_LABELS = 3
FIRST_LABELS = {"model": "m1", "replica": "0"}
SECOND_LABELS = {"model": "m2", "replica": "1"}
OTHER = {"model": "_other", "replica": "_other"}

# Queries that legitimately have no data on the CPU backend: (panel title, refId) -> why. They
# must still be valid PromQL (status success) and must return an empty vector here.
NO_DATA_ON_CPU = {
    ("Staging on the GPU", "A"): "the staging stage exists only on the CUDA backend",
    ("Staging on the GPU", "B"): "the staging stage exists only on the CUDA backend",
}
# Queries whose series exist but whose value is undefined (NaN) on the CPU backend.
NAN_ON_CPU = {
    ("Graph cache activity", "E"): "hit ratio = hits / (hits + misses) = 0/0: no CUDA graphs",
    ("Shadow mode: relative L2 error", "A"): "no shadow-mode Verify on the CPU backend: 0/0",
    ("Shadow mode: relative L2 error", "B"): "no shadow-mode Verify on the CPU backend: 0/0",
}


def binary(name: str) -> str:
    path = shutil.which(name) or f"/usr/bin/{name}"
    if not pathlib.Path(path).exists():
        pytest.fail(f"{name} is not installed: this test needs a real Prometheus. Install Debian's "
                    f"'prometheus' package (apt-get install prometheus; deploy/setup-debian.sh "
                    f"test does it)", pytrace=False)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def promtool(*args: str) -> str:
    result = subprocess.run([binary("promtool"), *args], capture_output=True, text=True,
                            timeout=60)
    assert result.returncode == 0, f"promtool {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout + result.stderr


# --- the dashboard -------------------------------------------------------------------------


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def all_panels(panels: list) -> list:
    out = []
    for panel in panels:
        out.append(panel)
        out.extend(all_panels(panel.get("panels", [])))  # collapsed rows hold their panels
    return out


def dashboard_queries() -> list[tuple[str, str, str, str]]:
    """(panel title, refId, expr, unit) of every query of every panel."""
    queries = []
    for panel in all_panels(dashboard()["panels"]):
        unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        for target in panel.get("targets", []):
            queries.append((panel["title"], target["refId"], target["expr"], unit))
    return queries


# The selectors whose All value is ".*" (it also matches series without the label: the CPU
# backend's unlabelled device series, sessions that declared no labels).
ALL_VALUE_VARIABLES = ("device", "probe_set", "model", "replica")


def render(expr: str, instance: str) -> str:
    """What Grafana sends: $__rate_interval and the (regex-escaped) instance substituted, and the
    other selectors at their All value."""
    instance_regex = re.escape(instance).replace("\\", "\\\\")  # inside a PromQL "string"
    expr = (expr.replace("$__rate_interval", RATE_INTERVAL)
            .replace("${instance}", instance_regex).replace("$instance", instance_regex))
    for name in ALL_VALUE_VARIABLES:
        expr = expr.replace(f"${name}", ".*")
    return expr


# The families with a series per served CUDA device (label device), which the device selector
# filters.
DEVICE_FAMILIES = re.compile(r"probesidecar_(device_memory_bytes|registered_buffers|"
                             r"registered_buffer_bytes|ipc_handles_open|graph_cache_\w+|"
                             r"stream_slots_parked)\{")
# The probe-outcome families, which the probe set and session label selectors filter.
OUTCOME_FAMILIES = re.compile(r"probesidecar_probe_(set_rows_scored_total|scored_total|"
                              r"fired_total|non_finite_scores_total|score_bucket)\{")
OUTCOME_SELECTOR = ('instance=~"$instance", probe_set=~"$probe_set", model=~"$model", '
                    'replica=~"$replica"}')


def test_dashboard_structure():
    d = dashboard()
    assert d["schemaVersion"] >= 36
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    instance = variables["instance"]
    assert instance["type"] == "query" and instance["multi"] is True
    assert instance["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
    query = instance["query"]["query"] if isinstance(instance["query"], dict) else instance["query"]
    assert query == "label_values(probesidecar_build_info, instance)"
    device = variables["device"]
    assert device["type"] == "query" and device["multi"] is True and device["includeAll"] is True
    assert device["allValue"] == ".*"
    assert device["query"]["query"] == \
        'label_values(probesidecar_device_up{instance=~"$instance"}, device)'

    panels = all_panels(d["panels"])
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24, panel["title"]
        if panel["type"] == "row":
            continue
        assert panel["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, panel["title"]
        assert panel["targets"], panel["title"]
        for target in panel["targets"]:
            assert target["datasource"]["uid"] == "${datasource}"
    exprs = [q[2] for q in dashboard_queries()]
    assert len(exprs) >= 30
    for expr in exprs:
        # Every selector honours the instance selector; every window is $__rate_interval.
        for selector in re.findall(r"\{([^}]*)\}", expr):
            assert 'instance=~"$instance"' in selector, expr
        # Every per-device family honours the device selector, and sums keep the device apart.
        for family in DEVICE_FAMILIES.finditer(expr):
            assert expr[family.end():].startswith('instance=~"$instance", device=~"$device"}'), expr
        if DEVICE_FAMILIES.search(expr) and "sum by" in expr:
            assert "sum by (instance)" not in expr, expr
        # Every outcome family honours the probe set and session label selectors.
        for family in OUTCOME_FAMILIES.finditer(expr):
            assert expr[family.end():].startswith(OUTCOME_SELECTOR), expr
        assert re.findall(r"\[([^\]]*)\]", expr) in ([], ["$__rate_interval"] * expr.count("[")), expr
        if "histogram_quantile" in expr:
            assert re.search(r"histogram_quantile\(0\.\d+, sum by \(le[,)]", expr), expr
    titles = {q[0] for q in dashboard_queries()}
    for needed in ("RPC rate by RPC", "Error ratio", "RPC latency p50", "RPC latency p90",
                   "RPC latency p99", "Stage latency p99", "Kernel GPU time by kernel path",
                   "In flight", "Registered buffers", "Graph cache activity",
                   "Fire rate per probe", "Score quantiles per probe", "Top probes by fire rate",
                   "Fire rate by session labels"):
        assert needed in titles, needed
    rows = [p["title"] for p in d["panels"] if p["type"] == "row"]
    assert rows[:2] == ["Overview", "Probe outcomes"], rows
    for name in ("probe_set", "model", "replica"):
        v = variables[name]
        assert v["type"] == "query" and v["multi"] and v["includeAll"] and v["allValue"] == ".*"
        assert v["query"]["query"] == (f'label_values(probesidecar_probe_scored_total'
                                       f'{{instance=~"$instance"}}, {name})')
    assert set(NO_DATA_ON_CPU) | set(NAN_ON_CPU) <= {(q[0], q[1]) for q in dashboard_queries()}


def test_grafana_provisioning_files():
    ds = yaml.safe_load((DASHBOARDS / "provisioning/datasources/prometheus.yaml").read_text())
    assert ds["apiVersion"] == 1
    assert [d["type"] for d in ds["datasources"]] == ["prometheus"]
    assert ds["datasources"][0]["url"].startswith("http")
    prov = yaml.safe_load((DASHBOARDS / "provisioning/dashboards/probe-sidecar.yaml").read_text())
    assert prov["apiVersion"] == 1
    (provider,) = prov["providers"]
    assert provider["type"] == "file" and provider["options"]["path"]


def test_promtool_checks_the_shipped_config_and_rules():
    assert "SUCCESS" in promtool("check", "config", str(SCRAPE_CONFIG))
    assert "SUCCESS: 9 rules found" in promtool("check", "rules", str(ALERTS))
    assert "SUCCESS" in promtool("test", "rules", str(ALERTS_TEST))
    scrape = yaml.safe_load(SCRAPE_CONFIG.read_text())
    (job,) = scrape["scrape_configs"]
    assert job["job_name"] == JOB
    assert job["static_configs"][0]["targets"] == ["127.0.0.1:9464"]


# --- the live stack ------------------------------------------------------------------------


class Prometheus:
    def __init__(self, target: str, workdir: pathlib.Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.config = workdir / "prometheus.yml"
        self.config.write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "scrape_timeout": "1s",
                       "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [{"job_name": JOB, "static_configs": [{"targets": [target]}]}],
        }))
        self.log_path = workdir / "prometheus.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            [binary("prometheus"), f"--config.file={self.config}",
             f"--storage.tsdb.path={workdir / 'data'}",
             f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
            stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while True:
            try:
                if requests.get(f"{self.url}/-/ready", timeout=1).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if self.process.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"prometheus did not start:\n{self.log_path.read_text()}")
            time.sleep(0.1)

    def api(self, path: str, **params):
        response = requests.get(f"{self.url}/api/v1/{path}", params=params, timeout=10)
        body = response.json()
        assert response.status_code == 200 and body["status"] == "success", (path, params, body)
        return body["data"]

    def query(self, expr: str, at: float | None = None) -> list[dict]:
        params = {"query": expr}
        if at is not None:
            params["time"] = f"{at:.3f}"
        data = self.api("query", **params)
        assert data["resultType"] == "vector", (expr, data)
        return data["result"]

    def wait_for(self, what: str, condition, timeout: float = 20.0):
        deadline = time.monotonic() + timeout
        while True:
            result = condition()
            if result:
                return result
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}\n{self.log_path.read_text()}")
            time.sleep(0.2)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()


def labels_key(labels: dict) -> tuple:
    return tuple(sorted(labels.items()))


def drive_traffic(sidecar: Sidecar, seconds: float) -> dict:
    """Good Scores on two probe sets (under two labelled sessions, the second past the label cap,
    and without a session; some activations NaN), failing ones (NOT_FOUND, INVALID_ARGUMENT), a few
    other RPCs and ScoreStream messages. Returns how many of each the client saw, and every score
    it got back by (probe set, the labels its series carry)."""
    seen = {"ok": 0, "not_found": 0, "invalid": 0, "scores": {}}

    def got(probe_set: str, labels: dict, scores: np.ndarray) -> None:
        seen["scores"].setdefault((probe_set, labels_key(labels)), []).append(scores)

    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, H)).astype(np.float32) * 3
    x[5, 7] = np.nan  # row 5's scores are NaN
    demo_x = np.random.default_rng(1).standard_normal((2, 4096)).astype(np.float32)
    with sidecar.client() as c:
        first = c.open_session(FIRST_LABELS)
        second = c.open_session(SECOND_LABELS)
        assert not first.labels_folded and second.labels_folded
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            rows = [0, 3, 7] if i % 4 else [0, 5, 7]
            got("prom_p3", FIRST_LABELS, c.score(x, rows, "prom_p3", session=first).scores)
            got("demo", OTHER, c.score(demo_x, [1], "demo", session=second).scores)
            seen["ok"] += 2
            try:
                c.score(x, [0], "no_such_probe_set")
            except ProbeSidecarError as e:
                assert e.code.name == "NOT_FOUND"
                seen["not_found"] += 1
            try:
                c.score(x, [0, 8], "prom_p3")  # row 8 of 8 rows
            except ProbeSidecarError as e:
                assert e.code.name == "INVALID_ARGUMENT"
                seen["invalid"] += 1
            if i % 20 == 0:
                c.server_info()
                c.list_probe_sets()
                try:  # Verify needs the CUDA backend: FAILED_PRECONDITION here
                    c.call(c.stub.Verify, verify_pb2.VerifyRequest())
                except ProbeSidecarError as e:
                    assert e.code.name == "FAILED_PRECONDITION"
                stream = [score_request(x, [1, 2], "prom_p3") for _ in range(5)]
                for r in c.score_stream(stream):
                    assert not isinstance(r, ProbeSidecarError)
                    got("prom_p3", {}, r.scores)
            i += 1
        first.close()
        second.close()
    return seen


@pytest.fixture(scope="module")
def stack():
    """A sidecar, a Prometheus scraping it every second, and TRAFFIC_SECONDS of traffic."""
    binary("prometheus")
    workdir = pathlib.Path(tempfile.mkdtemp(prefix="probe-sidecar-prometheus-"))
    sidecar = Sidecar(["--backend=cpu", f"--max-probe-labels={MAX_PROBE_LABELS}",
                       "--max-session-label-sets=1"]).start()
    prometheus = None
    try:
        with sidecar.client() as c:
            c.load_probe_set("prom_p3", data=ProbeFile(3, H, seed=5, activation="sigmoid",
                                                       thresholds=[0.5, 0.2, None]).data)
        prometheus = Prometheus(sidecar.metrics_address, workdir)
        instance = sidecar.metrics_address

        def target_up():
            targets = prometheus.api("targets")["activeTargets"]
            return [t for t in targets if t["labels"]["instance"] == instance
                    and t["health"] == "up"]

        prometheus.wait_for("the sidecar's first scrape", target_up)
        seen = drive_traffic(sidecar, TRAFFIC_SECONDS)
        traffic_end = time.time()

        def two_scrapes_after_the_traffic():
            # Prometheus stamps a scrape's samples with its start: samples newer than the end of
            # the traffic hold the final counts.
            now = time.time()
            window_ms = max(1, int((now - traffic_end) * 1000))
            scrapes = prometheus.query(
                f'count_over_time(up{{instance="{instance}"}}[{window_ms}ms])', now)
            return now if scrapes and float(scrapes[0]["value"][1]) >= 2 else None

        at = prometheus.wait_for("two scrapes after the last request",
                                 two_scrapes_after_the_traffic)
        stack = {"sidecar": sidecar, "prometheus": prometheus, "instance": instance, "at": at,
                 "seen": seen}
        # At least two scrapes saw the counters change while the traffic ran.
        changes = prometheus.query(
            f'changes(probesidecar_rpc_requests_total{{rpc="Score", code="OK"}}[{RATE_INTERVAL}])',
            at)
        assert changes and float(changes[0]["value"][1]) >= 2, changes
        yield stack
    finally:
        if prometheus is not None:
            prometheus.stop()
        sidecar.close()
        shutil.rmtree(workdir, ignore_errors=True)


def values(result: list[dict]) -> list[float]:
    return [float(r["value"][1]) for r in result]


def finite(result: list[dict]) -> list[float]:
    return [v for v in values(result) if not math.isnan(v)]


def series(result: list[dict], **labels) -> list[float]:
    return [float(r["value"][1]) for r in result
            if all(r["metric"].get(k) == v for k, v in labels.items())]


# Expectations beyond "non-empty, sane" for some panels: title -> check(result by refId, stack).
def _check_up(r, s):
    assert values(r["A"]) == [1.0]


def _check_rates(r, s):
    assert series(r["A"], rpc="Score")[0] > 0
    assert series(r["A"], rpc="ScoreStream")[0] > 0
    assert series(r["A"], rpc="ServerInfo")[0] > 0


def _check_errors(r, s):
    assert series(r["A"], rpc="Score", code="NOT_FOUND")[0] > 0
    assert series(r["A"], rpc="Score", code="INVALID_ARGUMENT")[0] > 0
    assert not series(r["A"], code="OK")


def _check_error_ratio(r, s):
    seen = s["seen"]
    expected = (seen["not_found"] + seen["invalid"]) / (
        seen["ok"] + seen["not_found"] + seen["invalid"])
    (score_ratio,) = series(r["A"], rpc="Score")
    assert abs(score_ratio - expected) < 0.1, (score_ratio, expected)
    (overall,) = values(r["B"])
    assert 0 < overall < score_ratio


def _check_score_by_set(r, s):
    assert series(r["A"], probe_set="prom_p3", kernel_path="cpu")[0] > 0
    assert series(r["A"], probe_set="demo", kernel_path="cpu")[0] > 0
    assert not series(r["A"], probe_set="no_such_probe_set")


def _check_stages(r, s):
    assert {x["metric"]["stage"] for x in r["A"]} == {"queue", "kernel", "total"}
    assert all(not math.isnan(v) for v in values(r["A"]))


def _check_kernel_paths(r, s):
    for ref in "ABC":
        assert [x["metric"]["kernel_path"] for x in r[ref]] == ["cpu"]


def _check_build(r, s):
    (build,) = r["A"]
    assert build["metric"]["backend"] == "cpu" and build["metric"]["version"]


def _check_probe_sets(r, s):
    assert values(r["A"]) == [2.0]  # demo + prom_p3


def _check_fire_rate_per_probe(r, s):
    # prom_p3 per probe; demo (more probes than --max-probe-labels) as one series.
    names = {(x["metric"]["probe_set"], x["metric"]["probe"]) for x in r["A"]}
    assert names == {("prom_p3", "probe_0"), ("prom_p3", "probe_1"), ("prom_p3", "probe_2"),
                     ("demo", "_all")}, names
    assert series(r["A"], probe_set="prom_p3", probe="probe_2") == [0.0]  # no threshold


def _check_fire_rate_by_labels(r, s):
    labels = {(x["metric"]["probe_set"], x["metric"].get("model", "")) for x in r["A"]}
    assert labels == {("prom_p3", "m1"), ("prom_p3", ""), ("demo", "_other")}, labels


def _check_top_probes(r, s):
    assert 1 <= len(r["A"]) <= 10


PANEL_CHECKS = {
    "Up": _check_up,
    "RPC rate by RPC": _check_rates,
    "Errors by RPC and code": _check_errors,
    "Error ratio": _check_error_ratio,
    "Score rate by probe set and kernel path": _check_score_by_set,
    "Stage latency p50": _check_stages,
    "Stage latency p99": _check_stages,
    "Kernel GPU time by kernel path": _check_kernel_paths,
    "Build": _check_build,
    "Probe sets loaded": _check_probe_sets,
    "Fire rate per probe": _check_fire_rate_per_probe,
    "Fire rate by session labels": _check_fire_rate_by_labels,
    "Top probes by fire rate": _check_top_probes,
}


def test_every_dashboard_query_returns_data(stack):
    prometheus, instance, at = stack["prometheus"], stack["instance"], stack["at"]
    queries = dashboard_queries()
    by_panel: dict[str, dict[str, list]] = {}
    for title, ref, expr, unit in queries:
        promql = render(expr, instance)
        assert "$" not in promql, promql
        result = prometheus.query(promql, at)
        by_panel.setdefault(title, {})[ref] = result
        where = f"{title} [{ref}]: {promql} -> {result}"
        if (title, ref) in NO_DATA_ON_CPU:
            assert result == [], where
            continue
        assert result, f"no data: {where}"
        for r in result:
            assert r["metric"].get("instance", instance) == instance, where
        if (title, ref) in NAN_ON_CPU:
            assert all(math.isnan(v) for v in values(result)), where
            continue
        good = finite(result)
        # NaN only where a quantile/ratio has no traffic in the window for some series.
        if "histogram_quantile" in expr or " / " in expr:
            assert good, f"only NaN: {where}"
        else:
            assert len(good) == len(result), where
        assert all(v >= 0 and not math.isinf(v) for v in good), where
        if "histogram_quantile" in expr:
            assert all(v <= LARGEST_FINITE_BUCKET for v in good), where
        if unit == "percentunit":
            assert all(v <= 1 for v in good), where
    assert sum(len(refs) for refs in by_panel.values()) == len(queries)
    for title, check in PANEL_CHECKS.items():
        check(by_panel[title], stack)


def test_instance_variable_lists_the_sidecar(stack):
    prometheus = stack["prometheus"]
    # label_values(probesidecar_build_info, instance), as Grafana asks for it.
    names = prometheus.api("label/instance/values", **{"match[]": "probesidecar_build_info"})
    assert names == [stack["instance"]]


def test_outcome_selectors_list_the_sets_and_session_labels(stack):
    prometheus = stack["prometheus"]
    match = {"match[]": f'probesidecar_probe_scored_total{{instance="{stack["instance"]}"}}'}
    assert prometheus.api("label/probe_set/values", **match) == ["demo", "prom_p3"]
    assert prometheus.api("label/model/values", **match) == ["_other", "m1"]
    assert prometheus.api("label/replica/values", **match) == ["0", "_other"]


def _recounts(stack) -> dict:
    """(probe set, labels) -> Recount of every score the traffic got back."""
    with stack["sidecar"].client() as c:
        infos = {info.name: info for info in c.list_probe_sets()}
    recounts = {}
    for (name, labels), responses in stack["seen"]["scores"].items():
        recount = recounts.setdefault((name, labels), Recount.for_set(infos[name]))
        for scores in responses:
            recount.add(scores)
    return recounts


def test_outcome_counters_and_buckets_equal_a_recount_of_the_returned_scores(stack):
    """What Prometheus scraped after the traffic: per probe (prom_p3) or per set (demo, past
    --max-probe-labels: probe="_all"), per session labels (the second session's folded into
    "_other"), rows, scored, fired, non-finite, and every cumulative bucket of the histogram."""
    prometheus, at, instance = stack["prometheus"], stack["at"], stack["instance"]
    recounts = _recounts(stack)
    assert set(recounts) == {("prom_p3", labels_key(FIRST_LABELS)), ("prom_p3", ()),
                             ("demo", labels_key(OTHER))}
    assert recounts[("prom_p3", labels_key(FIRST_LABELS))].non_finite.sum() > 0

    def sample(metric: str, **labels) -> float:
        selector = ", ".join([f'instance="{instance}"'] +
                             [f'{k}="{v}"' for k, v in labels.items()])
        result = prometheus.query(f"{metric}{{{selector}}}", at)
        assert len(result) == 1, (metric, labels, result)
        return float(result[0]["value"][1])

    checked = 0
    for (name, key), recount in recounts.items():
        labels = dict(key) or {"model": "", "replica": ""}
        assert sample("probesidecar_probe_set_rows_scored_total", probe_set=name,
                      **labels) == recount.rows
        by_probe = recount if name == "prom_p3" else recount.merged()
        probes = [f"probe_{p}" for p in range(3)] if name == "prom_p3" else ["_all"]
        for p, probe in enumerate(probes):
            where = dict(probe_set=name, probe=probe, **labels)
            assert sample("probesidecar_probe_scored_total", **where) == by_probe.rows
            assert sample("probesidecar_probe_fired_total", **where) == by_probe.fired[p], where
            assert sample("probesidecar_probe_non_finite_scores_total", **where) == \
                by_probe.non_finite[p], where
            result = prometheus.query(
                f'probesidecar_probe_score_bucket{{instance="{instance}", probe_set="{name}", '
                f'probe="{probe}", model="{labels["model"]}", replica="{labels["replica"]}"}}', at)
            # le is each float32 bound as its shortest decimal (0.05), then +Inf.
            scraped = sorted((float(r["metric"]["le"]), float(r["value"][1])) for r in result)
            assert [np.float32(le) for le, _ in scraped[:-1]] == list(by_probe.bounds), scraped
            assert math.isinf(scraped[-1][0])
            assert [v for _, v in scraped] == np.cumsum(by_probe.buckets[p]).tolist(), where
            checked += len(scraped)
            assert sample("probesidecar_probe_score_count", **where) == by_probe.buckets[p].sum()
    assert checked > 0
    # No series for a probe beyond the cap, none for the second session's own labels.
    assert prometheus.query(f'probesidecar_probe_scored_total{{instance="{instance}", '
                            f'probe_set="demo", probe!="_all"}}', at) == []
    assert prometheus.query(f'probesidecar_probe_scored_total{{instance="{instance}", '
                            f'model="m2"}}', at) == []


def test_list_probe_sets_shows_the_same_counts(stack):
    recounts = _recounts(stack)
    with stack["sidecar"].client() as c:
        infos = {info.name: info for info in c.list_probe_sets()}
    for name in ("prom_p3", "demo"):
        for labelled in infos[name].proto.outcomes_by_labels:
            key = labels_key(dict(labelled.labels))
            assert_matches_proto(recounts[(name, key)], labelled.outcomes, (name, key))
        assert sum(r.rows for (n, _), r in recounts.items() if n == name) == \
            infos[name].outcomes.rows_scored


def alert_rules(prometheus: Prometheus) -> list[dict]:
    return [rule for group in prometheus.api("rules")["groups"] for rule in group["rules"]]


def test_alert_rules_load_and_evaluate(stack):
    prometheus, at = stack["prometheus"], stack["at"]
    shipped = yaml.safe_load(ALERTS.read_text())
    names = [r["alert"] for g in shipped["groups"] for r in g["rules"]]
    for rule in (r for g in shipped["groups"] for r in g["rules"]):
        assert rule.get("for") is not None, rule["alert"]
        assert rule["labels"]["severity"] in ("warning", "critical"), rule["alert"]
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]

    def evaluated():
        rules = alert_rules(prometheus)
        done = all(r.get("lastEvaluation", "0001").startswith("20") for r in rules)
        return rules if done and len(rules) == len(names) else None

    rules = prometheus.wait_for("every rule to be evaluated", evaluated)
    assert sorted(r["name"] for r in rules) == sorted(names)
    by_name = {}
    for rule in rules:
        assert rule["type"] == "alerting"
        assert rule["health"] in ("ok", "unknown") and not rule.get("lastError"), rule
        by_name[rule["name"]] = prometheus.query(rule["query"], at)
    # The sidecar is up and had no CUDA errors; half of its Scores failed on purpose.
    assert by_name["ProbeSidecarDown"] == []
    assert by_name["ProbeSidecarCudaErrors"] == []
    assert by_name["ProbeSidecarShadowMismatch"] == []
    assert by_name["ProbeSidecarFrequentContextSwitches"] == []  # a CPU-backend sidecar
    assert by_name["ProbeSidecarProbeSetsSkipped"] == []
    # NaN activations in the traffic: NaN scores, on purpose.
    assert [r["metric"]["instance"] for r in by_name["ProbeSidecarNonFiniteScores"]] == \
        [stack["instance"]]
    # A steady fire rate: the 5-minute and the whole-run rates are the same.
    assert by_name["ProbeSidecarProbeFireRateSpike"] == []
    (ratio,) = by_name["ProbeSidecarHighErrorRatio"]
    assert ratio["metric"]["instance"] == stack["instance"] and 0.05 < float(ratio["value"][1]) < 1
    assert all(v <= LARGEST_FINITE_BUCKET for v in values(by_name["ProbeSidecarScoreLatencyHigh"]))
    # And the error-ratio alert is pending (its `for` has not elapsed).
    states = {r["name"]: r["state"] for r in alert_rules(prometheus)}
    assert states["ProbeSidecarHighErrorRatio"] in ("pending", "firing"), states
    assert states["ProbeSidecarDown"] == "inactive", states


def test_promtool_checks_the_generated_config(stack):
    assert "SUCCESS" in promtool("check", "config", str(stack["prometheus"].config))


def test_down_alert_when_the_sidecar_stops(stack):
    """Last: stops the sidecar; `up` drops to 0 and ProbeSidecarDown goes pending."""
    prometheus, sidecar = stack["prometheus"], stack["sidecar"]
    sidecar.stop()
    down = prometheus.wait_for(
        "up == 0", lambda: prometheus.query(f'up{{job="{JOB}"}} == 0'), timeout=15)
    assert down[0]["metric"]["instance"] == stack["instance"]

    def pending():
        states = {r["name"]: r["state"] for r in alert_rules(prometheus)}
        return states["ProbeSidecarDown"] in ("pending", "firing")

    prometheus.wait_for("ProbeSidecarDown to be pending", pending, timeout=15)
