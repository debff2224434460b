"""deploy/kubernetes: every object loads into the kubernetes client's typed models with no field
the API does not know (the client itself ignores unknown fields, so each key is checked against
the model's own field list), and the deployment's invariants hold: the sidecar in the inference
server's PID namespace with host IPC, one GPU claim for both containers and no MPS unless asked
for, gRPC probes on the port the image listens on, non-root, pinned tags, the socket volume, the
scrape and the repository's alert rules. No cluster is needed (none is reachable here)."""

import re
import shutil
import subprocess
from pathlib import Path

import kubernetes.client as k8s
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "kubernetes"
DOCKERFILE = ROOT / "deploy" / "container" / "Dockerfile"
ALERTS = ROOT / "dashboards" / "prometheus" / "alerts.yml"
SOCKET_DIR = "/run/probe-sidecar"

# Prometheus Operator's custom resources have no typed model in the client: the fields these
# manifests may use, from the operator's CRDs (monitoring.coreos.com/v1).
RELABEL = {"sourceLabels": [str], "separator": str, "targetLabel": str, "regex": str,
           "modulus": int, "replacement": str, "action": str}
CRD_SPECS = {
    "PodMonitor": {
        "selector": "V1LabelSelector", "namespaceSelector": {"any": bool, "matchNames": [str]},
        "jobLabel": str, "podTargetLabels": [str],
        "podMetricsEndpoints": [{"port": str, "path": str, "interval": str, "scrapeTimeout": str,
                                 "scheme": str, "honorLabels": bool, "relabelings": [RELABEL],
                                 "metricRelabelings": [RELABEL]}],
    },
    "PrometheusRule": {
        "groups": [{"name": str, "interval": str, "limit": int,
                    "rules": [{"alert": str, "record": str, "expr": str, "for": str,
                               "keep_firing_for": str, "labels": {str: str},
                               "annotations": {str: str}}]}],
    },
}

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "object": object}


def check_model(data, type_name, path):
    """Raises AssertionError on any key the model does not have or any value of the wrong type."""
    if type_name.startswith("List["):
        assert isinstance(data, list), f"{path}: a list expected"
        for i, item in enumerate(data):
            check_model(item, type_name[5:-1], f"{path}[{i}]")
        return
    if type_name.startswith("Dict["):
        assert isinstance(data, dict), f"{path}: a mapping expected"
        value_type = type_name[5:-1].split(", ", 1)[1]
        for key, value in data.items():
            check_model(value, value_type, f"{path}.{key}")
        return
    if type_name in PRIMITIVES:
        wanted = PRIMITIVES[type_name]
        assert isinstance(data, wanted) and not (wanted is int and isinstance(data, bool)), \
            f"{path}: {type_name} expected, got {data!r}"
        return
    model = getattr(k8s, type_name)
    assert isinstance(data, dict), f"{path}: a mapping ({type_name}) expected"
    fields = {json_name: attr for attr, json_name in model.attribute_map.items()}
    for key, value in data.items():
        assert key in fields, f"{path}.{key}: not a field of {type_name}"
        check_model(value, model.openapi_types[fields[key]], f"{path}.{key}")


def check_schema(data, schema, path):
    if isinstance(schema, str):
        return check_model(data, schema, path)
    if isinstance(schema, list):
        assert isinstance(data, list), f"{path}: a list expected"
        for i, item in enumerate(data):
            check_schema(item, schema[0], f"{path}[{i}]")
        return
    if isinstance(schema, dict) and set(schema) == {str}:
        assert isinstance(data, dict), f"{path}: a mapping expected"
        for key, value in data.items():
            assert isinstance(key, str) and isinstance(value, str), f"{path}.{key}: strings"
        return
    if isinstance(schema, dict):
        assert isinstance(data, dict), f"{path}: a mapping expected"
        for key, value in data.items():
            assert key in schema, f"{path}.{key}: not a field"
            check_schema(value, schema[key], f"{path}.{key}")
        return
    assert isinstance(data, schema), f"{path}: {schema.__name__} expected, got {data!r}"


def model_name(api_version, kind):
    version = api_version.split("/")[-1]
    return version[0].upper() + version[1:] + kind  # apps/v1 Deployment -> V1Deployment


def load_documents():
    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        for i, doc in enumerate(yaml.safe_load_all(path.read_text())):
            if doc is not None:
                docs.append((f"{path.name}#{i}", doc))
    return docs


DOCUMENTS = load_documents()


def typed(doc):
    """The document as the client's typed model (its constructors check required fields)."""
    return k8s.ApiClient()._ApiClient__deserialize(doc, model_name(doc["apiVersion"], doc["kind"]))


def objects(kind):
    return [doc for _, doc in DOCUMENTS if doc["kind"] == kind]


def only(kind):
    found = objects(kind)
    assert len(found) == 1, f"{len(found)} {kind} objects"
    return found[0]


@pytest.mark.parametrize("name,doc", DOCUMENTS, ids=[n for n, _ in DOCUMENTS])
def test_every_object_is_known_to_the_api(name, doc):
    assert {"apiVersion", "kind", "metadata"} <= set(doc), name
    if doc["apiVersion"] == "monitoring.coreos.com/v1":
        assert set(doc) <= {"apiVersion", "kind", "metadata", "spec"}, name
        check_model(doc["metadata"], "V1ObjectMeta", f"{name}.metadata")
        check_schema(doc["spec"], CRD_SPECS[doc["kind"]], f"{name}.spec")
    else:
        check_model(doc, model_name(doc["apiVersion"], doc["kind"]), name)
        assert typed(doc) is not None


def test_check_model_refuses_an_unknown_field():
    bad = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "x"},
           "spec": {"containers": [{"name": "c", "image": "i:1", "readinessProbes": {}}]}}
    with pytest.raises(AssertionError, match=r"readinessProbes: not a field of V1Container"):
        check_model(bad, "V1Pod", "pod")


# --- the deployment --------------------------------------------------------------------------

def image_facts():
    """The Dockerfile's user and the ports and gRPC service its entrypoint and health check use."""
    text = DOCKERFILE.read_text()
    uid = int(re.search(r"^ARG UID=(\d+)$", text, re.M).group(1))
    grpc_port = int(re.search(r'"--listen=0\.0\.0\.0:(\d+)"', text).group(1))
    metrics_port = int(re.search(r'"--metrics-listen=0\.0\.0\.0:(\d+)"', text).group(1))
    grace = float(re.search(r'"--shutdown-grace-seconds=([\d.]+)"', text).group(1))
    service = re.search(r'constexpr char kServiceName\[\] = "([^"]+)"',
                        (ROOT / "server" / "rpc" / "server.cc").read_text()).group(1)
    return {"uid": uid, "grpc_port": grpc_port, "metrics_port": metrics_port, "grace": grace,
            "service": service}


@pytest.fixture(scope="module")
def pod():
    deployment = typed(only("Deployment"))
    return deployment.spec.template


def containers(pod):
    sidecars = [c for c in pod.spec.init_containers or [] if c.name == "probe-sidecar"]
    servers = [c for c in pod.spec.containers if c.name == "inference-server"]
    assert len(sidecars) == 1 and len(servers) == 1
    return sidecars[0], servers[0]


def flag(container, name):
    values = [a.split("=", 1)[1] for a in container.args or [] if a.startswith(f"--{name}=")]
    return values[-1] if values else None


def test_sidecar_shares_the_inference_servers_pid_namespace_and_ipc(pod):
    assert pod.spec.share_process_namespace is True
    assert pod.spec.host_ipc is True


def test_sidecar_is_a_native_sidecar_that_keeps_the_images_entrypoint(pod):
    sidecar, _ = containers(pod)
    assert sidecar.restart_policy == "Always"  # starts first, stops last
    assert sidecar.command is None  # the image's entrypoint: its listeners and grace
    assert flag(sidecar, "backend") == "cuda"


def test_probes_use_grpc_health_on_the_images_port(pod):
    facts = image_facts()
    sidecar, _ = containers(pod)
    ports = {p.name: p.container_port for p in sidecar.ports}
    assert ports == {"grpc": facts["grpc_port"], "metrics": facts["metrics_port"]}
    for probe in (sidecar.startup_probe, sidecar.readiness_probe, sidecar.liveness_probe):
        assert probe is not None and probe.grpc is not None
        assert probe.grpc.port == facts["grpc_port"]
        assert probe.http_get is None and probe._exec is None and probe.tcp_socket is None
    # Ready means the service is SERVING: the server sets it once its probe sets are loaded and
    # warm (it does not listen before), and clears it when it drains.
    assert sidecar.startup_probe.grpc.service == facts["service"]
    assert sidecar.readiness_probe.grpc.service == facts["service"]
    startup = sidecar.startup_probe
    assert startup.period_seconds * startup.failure_threshold >= 120  # loading and capture


def test_the_pod_outlives_the_sidecars_drain(pod):
    sidecar, _ = containers(pod)
    grace = float(flag(sidecar, "shutdown-grace-seconds") or image_facts()["grace"])
    assert pod.spec.termination_grace_period_seconds > grace


def test_both_containers_use_one_gpu_claim_without_mps(pod):
    sidecar, server = containers(pod)
    claims = {c.name: c.resource_claim_template_name for c in pod.spec.resource_claims}
    for c in (sidecar, server):
        assert [r.name for r in c.resources.claims] == ["gpu"], c.name
        for limits in (c.resources.limits or {}, c.resources.requests or {}):
            assert not any(k.startswith("nvidia.com/") for k in limits), (c.name, limits)
    template = typed(only("ResourceClaimTemplate"))
    assert template.metadata.name == claims["gpu"]
    devices = template.spec.spec.devices
    assert len(devices.requests) == 1
    request = devices.requests[0].exactly
    assert request.device_class_name == "gpu.nvidia.com"
    assert request.count in (None, 1) and request.allocation_mode in (None, "ExactCount")
    assert not devices.config  # time-sliced: no MPS by default


def test_the_commented_mps_variant_is_a_valid_claim_configuration():
    text = (K8S / "probe-sidecar.yaml").read_text()
    block = re.search(r"^( +)# MPS, for Verify.*\n((?:\1# .*\n)+)", text, re.M)
    assert block, "the commented MPS configuration of the claim template"
    indent = block.group(1)
    uncommented = "".join(line[len(indent) + 2:] + "\n"
                          for line in block.group(2).splitlines())
    config = yaml.safe_load(uncommented)["config"]
    check_model(config, "List[V1DeviceClaimConfiguration]", "mps config")
    assert config[0]["requests"] == ["gpu"]
    assert config[0]["opaque"]["parameters"]["sharing"]["strategy"] == "MPS"


def test_non_root_with_the_images_user(pod):
    facts = image_facts()
    sidecar, _ = containers(pod)
    sc = sidecar.security_context
    assert sc.run_as_non_root is True
    assert sc.run_as_user == facts["uid"] and sc.run_as_group == facts["uid"]
    assert sc.allow_privilege_escalation is False
    assert sc.read_only_root_filesystem is True
    assert sc.capabilities.drop == ["ALL"]
    assert sc.privileged in (None, False)
    # The socket's group, for an inference server of any uid.
    assert pod.spec.security_context.fs_group == facts["uid"]


def test_images_are_pinned(pod):
    for c in (pod.spec.init_containers or []) + pod.spec.containers:
        name, _, tag = c.image.rpartition(":")
        assert "/" not in tag and re.fullmatch(r"v?\d+(\.\d+)+[\w.-]*", tag), c.image
        assert c.image_pull_policy in (None, "IfNotPresent")


def test_both_containers_mount_the_socket_volume(pod):
    sidecar, server = containers(pod)
    volumes = {v.name: v for v in pod.spec.volumes}
    for c in (sidecar, server):
        socket_mounts = [m for m in c.volume_mounts if m.mount_path == SOCKET_DIR]
        assert len(socket_mounts) == 1, c.name
        assert volumes[socket_mounts[0].name].empty_dir is not None
    target = {e.name: e.value for e in server.env}["PROBE_SIDECAR_TARGET"]
    assert target == f"unix://{SOCKET_DIR}/probe-sidecar.sock"


def test_resources_are_requested(pod):
    for c in containers(pod):
        assert {"cpu", "memory"} <= set(c.resources.requests), c.name
    sidecar, _ = containers(pod)
    assert "memory" in sidecar.resources.limits


def test_probe_sets_and_admin_token_are_mounted_read_only(pod):
    sidecar, _ = containers(pod)
    mounts = {m.mount_path: m for m in sidecar.volume_mounts}
    volumes = {v.name: v for v in pod.spec.volumes}
    probes = mounts[flag(sidecar, "probes")]
    assert probes.read_only is True
    token = Path(flag(sidecar, "admin-token-file"))
    token_mount = mounts[str(token.parent)]
    assert token_mount.read_only is True
    secret = volumes[token_mount.name].secret
    assert secret is not None and secret.optional in (None, False)


# --- monitoring ------------------------------------------------------------------------------

def test_the_pod_monitor_scrapes_the_sidecars_metrics_port_as_the_alerts_job(pod):
    monitor = only("PodMonitor")
    selector = monitor["spec"]["selector"]["matchLabels"]
    assert selector.items() <= pod.metadata.labels.items()
    sidecar, _ = containers(pod)
    metrics_port = next(p.name for p in sidecar.ports if p.container_port ==
                        image_facts()["metrics_port"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] == metrics_port and endpoint.get("path", "/metrics") == "/metrics"
    job = [r for r in endpoint["relabelings"] if r.get("targetLabel") == "job"]
    assert job == [{"targetLabel": "job", "replacement": "probe-sidecar"}]
    down = next(r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]
                if r.get("alert") == "ProbeSidecarDown")
    assert 'job="probe-sidecar"' in down["expr"]


def test_the_prometheus_rule_holds_the_repositorys_alert_rules():
    rule = only("PrometheusRule")
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())
    generated = subprocess.run([str(K8S / "make-prometheus-rule.sh")], check=True,
                               capture_output=True, text=True).stdout
    assert generated == (K8S / "prometheus-rule.yaml").read_text(), \
        "regenerate: deploy/kubernetes/make-prometheus-rule.sh > deploy/kubernetes/prometheus-rule.yaml"


def test_promtool_accepts_the_prometheus_rules(tmp_path):
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    rules = tmp_path / "rules.yml"
    rules.write_text(yaml.safe_dump(only("PrometheusRule")["spec"]))
    done = subprocess.run([promtool, "check", "rules", str(rules)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
