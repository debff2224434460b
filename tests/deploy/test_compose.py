"""deploy/compose: the files' invariants (docker-compose config), then the stack brought up for
real (sidecar, the inference server's stand-in that scores, Prometheus; Grafana cannot be pulled
here and is left out by naming the services), Prometheus's scrape of the sidecar queried with
PromQL, and `docker-compose down -v` leaving nothing behind."""

import re
import shutil
import uuid

import pytest
import requests
import yaml

from engine import (ROOT, SERVICE, SOCKET_DIR, docker, env, free_port, host_pid, run, wait_for)

COMPOSE_DIR = ROOT / "deploy" / "compose"
COMPOSE = COMPOSE_DIR / "compose.yaml"
MPS = COMPOSE_DIR / "compose.mps.yaml"
CI = ROOT / "tests" / "deploy" / "compose.ci.yaml"
ALERTS = ROOT / "dashboards" / "prometheus" / "alerts.yml"
SCORES = 7  # Score calls the stand-in makes
STACK = ["inference-server", "probe-sidecar", "prometheus"]  # everything but Grafana


def compose(project, files, *args, env_extra=None, **kwargs):
    argv = ["docker-compose", "-p", project]
    for f in files:
        argv += ["-f", f]
    return run(argv + list(args), env_extra=env_extra, **kwargs)


def config(files, env_extra=None):
    """The merged, interpolated configuration, as docker-compose resolves it."""
    return yaml.safe_load(compose("config-check", files, "config", env_extra=env_extra).stdout)


def mounts(service):
    """{target: source} of a service's volumes in `docker-compose config` form."""
    out = {}
    for v in service.get("volumes", []):
        if isinstance(v, str):
            parts = v.split(":")
            out[parts[1]] = parts[0]
        else:
            out[v["target"]] = v.get("source")
    return out


@pytest.fixture(scope="module")
def production():
    return config([COMPOSE])


def test_sidecar_shares_the_inference_servers_pid_namespace_ipc_socket_and_gpu(production):
    services = production["services"]
    sidecar, server = services["probe-sidecar"], services["inference-server"]
    assert sidecar["pid"] == "service:inference-server"
    assert sidecar["ipc"] == "host" and server["ipc"] == "host"
    assert mounts(sidecar)[SOCKET_DIR] == mounts(server)[SOCKET_DIR] == "sidecar-socket"
    assert sidecar["runtime"] == server["runtime"] == "nvidia"
    gpu = sidecar["environment"]["NVIDIA_VISIBLE_DEVICES"]
    assert gpu == server["environment"]["NVIDIA_VISIBLE_DEVICES"] == "0"
    assert "--backend=cuda" in sidecar["command"]
    assert server["environment"]["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:False"


def test_no_mps_by_default_and_the_mps_variant_makes_both_clients_of_one_daemon(production):
    services = production["services"]
    assert "nvidia-mps" not in services
    for s in services.values():
        assert not any(k.startswith("CUDA_MPS") for k in s.get("environment", {})), s
    merged = config([COMPOSE, MPS])["services"]
    daemon, sidecar, server = (merged[n] for n in ("nvidia-mps", "probe-sidecar",
                                                    "inference-server"))
    pipe = daemon["environment"]["CUDA_MPS_PIPE_DIRECTORY"]
    for client in (sidecar, server):
        assert client["environment"]["CUDA_MPS_PIPE_DIRECTORY"] == pipe
        assert mounts(client)[pipe] == mounts(daemon)[pipe] == "nvidia-mps"
        assert "nvidia-mps" in client["depends_on"]
        assert client["environment"]["NVIDIA_VISIBLE_DEVICES"] == \
            daemon["environment"]["NVIDIA_VISIBLE_DEVICES"]
    assert sidecar["user"] == server["user"]  # MPS serves one uid at a time
    # Everything else is compose.yaml's.
    assert sidecar["pid"] == "service:inference-server" and sidecar["ipc"] == "host"


def test_images_are_pinned_and_grafana_is_wired(production):
    for files in ([COMPOSE], [COMPOSE, MPS]):
        for name, s in config(files)["services"].items():
            image = s["image"]
            assert re.fullmatch(r"[\w./-]+:v?\d+(\.\d+)+[\w.-]*", image), (name, image)
    grafana = production["services"]["grafana"]
    sources = mounts(grafana).values()
    for source in sources:
        assert (COMPOSE_DIR / source).resolve().exists(), source
    assert str(ROOT / "dashboards") in [str((COMPOSE_DIR / s).resolve()) for s in sources]
    prometheus = mounts(production["services"]["prometheus"])
    assert (COMPOSE_DIR / prometheus["/etc/prometheus/alerts.yml"]).resolve() == ALERTS
    scrape = yaml.safe_load((COMPOSE_DIR / "prometheus.yml").read_text())
    jobs = {j["job_name"]: j for j in scrape["scrape_configs"]}
    # ProbeSidecarDown selects up{job="probe-sidecar"}.
    assert jobs["probe-sidecar"]["static_configs"][0]["targets"] == ["probe-sidecar:9464"]


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    probes = tmp_path_factory.mktemp("probes")
    shutil.copy(f"{env('DEPLOY_TEST_BUNDLE')}/share/probe-sidecar/probes/demo.safetensors",
                probes / "demo.safetensors")
    probes.chmod(0o755)
    project = f"psdeploy{uuid.uuid4().hex[:8]}"
    port = free_port()
    variables = {
        "PROBE_SIDECAR_BACKEND": "cpu",
        "PROBES_DIR": probes,
        "PROMETHEUS_PORT": port,
        "DEPLOY_TEST_SCORES": SCORES,
        "DEPLOY_TEST_SIDECAR_IMAGE": env("DEPLOY_TEST_SIDECAR_IMAGE"),
        "DEPLOY_TEST_PROMETHEUS_IMAGE": env("DEPLOY_TEST_PROMETHEUS_IMAGE"),
    }
    files = [COMPOSE, CI]

    def do(*args, **kwargs):
        return compose(project, files, *args, env_extra=variables, **kwargs)

    do("config", "-q")
    try:
        do("up", "-d", "--no-build", *STACK, timeout=300)
        yield {"do": do, "project": project, "port": port}
    finally:
        logs = do("logs", "--no-color", check=False)
        print(f"--- compose logs:\n{logs.stdout}{logs.stderr}")
        do("down", "-v", "--remove-orphans", check=False, timeout=300)


def container(stack, service):
    return stack["do"]("ps", "-q", service).stdout.strip()


def test_the_sidecar_runs_in_the_inference_servers_pid_namespace(stack):
    namespaces = [run(["readlink", f"/proc/{host_pid(container(stack, s))}/ns/pid"]).stdout
                  for s in ("probe-sidecar", "inference-server")]
    assert namespaces[0] == namespaces[1], namespaces


def test_the_inference_server_scores_through_the_socket(stack):
    wait_for("the stand-in's scores",
             lambda: f"client: scored {SCORES}" in stack["do"]("logs", "inference-server").stdout,
             timeout_s=180, interval_s=1)
    info = stack["do"]("exec", "-T", "probe-sidecar", "probe-client",
                       f"--target=unix:{SOCKET_DIR}/probe-sidecar.sock", "health", SERVICE)
    assert info.stdout.strip() == "SERVING"


def query(stack, promql):
    reply = requests.get(f"http://127.0.0.1:{stack['port']}/api/v1/query",
                         params={"query": promql}, timeout=10)
    reply.raise_for_status()
    return reply.json()["data"]["result"]


def test_prometheus_scrapes_the_sidecar_and_counts_the_scores(stack):
    test_the_inference_server_scores_through_the_socket(stack)

    def scraped():
        try:
            result = query(stack, 'sum(probesidecar_rpc_requests_total'
                                  '{job="probe-sidecar",rpc="Score",code="OK"})')
        except requests.RequestException:
            return None
        return result and float(result[0]["value"][1]) == SCORES and result

    wait_for(f"Prometheus sees {SCORES} Score requests", scraped, timeout_s=90, interval_s=1)
    up = query(stack, 'up{job="probe-sidecar"}')
    assert [float(u["value"][1]) for u in up] == [1.0], up
    # The repository's alert rules are loaded, and none fires on a healthy stack.
    rules = requests.get(f"http://127.0.0.1:{stack['port']}/api/v1/rules", timeout=10).json()
    loaded = {r["name"] for g in rules["data"]["groups"] for r in g["rules"]}
    expected = {r["alert"] for g in yaml.safe_load(ALERTS.read_text())["groups"]
                for r in g["rules"] if "alert" in r}
    assert loaded == expected
    firing = requests.get(f"http://127.0.0.1:{stack['port']}/api/v1/alerts", timeout=10).json()
    assert [a for a in firing["data"]["alerts"] if a["state"] == "firing"] == []


def test_stop_is_clean_and_down_leaves_nothing(stack):
    ids = {s: container(stack, s) for s in STACK}
    # The sidecar drains and exits 0, the stand-in exits 0 on SIGTERM: neither waits out its stop
    # timeout to be killed (exit 137).
    stack["do"]("stop", timeout=120)
    for service, cid in ids.items():
        assert docker("inspect", "-f", "{{.State.ExitCode}}", cid).stdout.strip() == "0", service
    stack["do"]("down", "-v", "--remove-orphans", timeout=300)
    label = f"label=com.docker.compose.project={stack['project']}"
    assert docker("ps", "-aq", "--filter", label).stdout.strip() == ""
    assert docker("volume", "ls", "-q", "--filter", label).stdout.strip() == ""
    assert docker("network", "ls", "-q", "--filter", label).stdout.strip() == ""
