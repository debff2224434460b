"""The sidecar image alone (deploy/container/Dockerfile, built by tests/deploy/run.sh on a local
Debian base from a bundle of the build): started with no network and as it ships (non-root, its
entrypoint, auto backend: the CPU here; read-only, without capabilities), it answers health and a Score from probe-client in
another container through the shared socket volume, and stops with exit 0 within its grace."""

import json
import time
import uuid

import pytest

from engine import (IMAGE_UID, SERVICE, SOCKET_DIR, SOCKET_TARGET, docker, env, host_pid,
                    proc_status, wait_for)

STOP_TIMEOUT_S = 10  # docker stop's default; the image's --shutdown-grace-seconds is 8


@pytest.fixture(scope="module")
def sidecar():
    image = env("DEPLOY_TEST_SIDECAR_IMAGE")
    name = f"probe-sidecar-test-{uuid.uuid4().hex[:8]}"
    volume = f"{name}-socket"
    docker("volume", "create", volume)
    # As the Kubernetes manifest runs it too: read-only root, no capabilities, no privilege gain.
    docker("run", "-d", "--name", name, "--network", "none", "--read-only", "--cap-drop", "ALL",
           "--security-opt", "no-new-privileges", "-v", f"{volume}:{SOCKET_DIR}", image)
    try:
        yield {"name": name, "volume": volume, "image": image}
    finally:
        logs = docker("logs", name, check=False)
        print(f"--- {name} log:\n{logs.stdout}{logs.stderr}")
        docker("rm", "-f", name, check=False)
        docker("volume", "rm", volume, check=False)


def client(sidecar, *args, user=None, check=True):
    """probe-client from the same image, in a container of its own: only the socket is shared."""
    argv = ["run", "--rm", "--network", "none", "-v", f"{sidecar['volume']}:{SOCKET_DIR}",
            "--entrypoint", "probe-client"]
    if user is not None:
        argv += ["--user", user]
    return docker(*argv, sidecar["image"], f"--target={SOCKET_TARGET}", "--timeout=10", *args,
                  check=check)


def state(container, field):
    return docker("inspect", "-f", "{{" + field + "}}", container).stdout.strip()


def test_healthcheck_reports_healthy(sidecar):
    # The image's HEALTHCHECK (the gRPC health protocol over the socket) runs every 10 s.
    wait_for("the image's HEALTHCHECK says healthy",
             lambda: state(sidecar["name"], ".State.Health.Status") == "healthy", timeout_s=90)


def test_runs_as_non_root_without_network(sidecar):
    pid = host_pid(sidecar["name"])
    ids = proc_status(pid)
    assert ids["Uid"] == [IMAGE_UID] * 4, ids
    assert ids["Gid"] == [IMAGE_UID] * 4, ids
    assert state(sidecar["name"], ".HostConfig.NetworkMode") == "none"
    interfaces = docker("exec", sidecar["name"], "cat", "/proc/net/dev").stdout
    names = [line.split(":")[0].strip() for line in interfaces.splitlines()[2:]]
    assert names == ["lo"], names
    # The socket the inference server connects to: owned by the image's user, mode 0660.
    stat = docker("exec", sidecar["name"], "stat", "-c", "%u %g %a",
                  f"{SOCKET_DIR}/probe-sidecar.sock").stdout.split()
    assert stat == [str(IMAGE_UID), str(IMAGE_UID), "660"], stat


def test_needs_no_cuda_library(sidecar):
    # The bare Debian base has no CUDA: every library the binaries need is in the bundle or the
    # base, cuBLAS included (opened only by the CUDA backend).
    ldd = docker("run", "--rm", "--network", "none", "--entrypoint", "sh", sidecar["image"], "-c",
                 "ldd /opt/probe-sidecar/bin/probe-sidecar /opt/probe-sidecar/bin/probe-client")
    assert "not found" not in ldd.stdout, ldd.stdout
    assert "libcublas" not in ldd.stdout, ldd.stdout


def test_health_and_score_from_another_container(sidecar):
    wait_for("the sidecar answers health", lambda: client(sidecar, "health", SERVICE,
                                                          check=False).returncode == 0, 60)
    assert client(sidecar, "health", SERVICE).stdout.strip() == "SERVING"
    info = client(sidecar, "info").stdout
    assert 'backend: "cpu"' in info, info
    scored = json.loads(client(sidecar, "score", "--probe-set", "demo", "--random", "4,4096",
                               "--json").stdout)
    assert scored["probe_set"] == "demo"
    assert [r["row"] for r in scored["rows"]] == [0, 1, 2, 3]
    assert all(len(r["scores"]) == 4 and all(0.0 <= s <= 1.0 for s in r["scores"])
               for r in scored["rows"]), scored  # the demo set's sigmoid
    assert scored["non_finite"] == 0


def test_a_client_of_another_user_is_refused(sidecar):
    # What a deployment whose inference server runs as another uid (not root, not in the
    # socket's group) sees: the socket's mode keeps it out.
    refused = client(sidecar, "health", SERVICE, user="20000:20000", check=False)
    assert refused.returncode != 0
    assert "Permission denied" in refused.stdout + refused.stderr, refused


def test_docker_stop_exits_zero_within_grace(sidecar):
    client(sidecar, "health", SERVICE)
    start = time.monotonic()
    docker("stop", "-t", str(STOP_TIMEOUT_S), sidecar["name"], timeout=STOP_TIMEOUT_S + 30)
    elapsed = time.monotonic() - start
    assert state(sidecar["name"], ".State.ExitCode") == "0"  # 137 if it had been killed
    assert elapsed < STOP_TIMEOUT_S, elapsed
    logs = docker("logs", sidecar["name"])
    assert "draining in-flight requests (up to 8.0 s)" in logs.stderr + logs.stdout
    assert (logs.stderr + logs.stdout).rstrip().endswith("stopped")
