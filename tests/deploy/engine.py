"""The Docker daemon and images that tests/deploy/run.sh prepared, for the container tests."""

import os
import shlex
import socket
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOCKET_DIR = "/run/probe-sidecar"
SOCKET_TARGET = f"unix:{SOCKET_DIR}/probe-sidecar.sock"
SERVICE = "probesidecar.v1.ProbeSidecar"
IMAGE_UID = 10001  # deploy/container/Dockerfile's user


def env(name):
    value = os.environ.get(name)
    if value is None:
        pytest.skip(f"{name} is not set: run through tests/deploy/run.sh (its daemon and images)")
    return value


def _prefix():
    sudo = os.environ.get("DEPLOY_TEST_SUDO", "")
    return shlex.split(sudo) + ["env", f"DOCKER_HOST={env('DOCKER_HOST')}"]


def run(argv, check=True, timeout=120, env_extra=None, **kwargs):
    """Runs a docker or docker-compose command line; output as text, stderr kept apart."""
    extra = [f"{k}={v}" for k, v in (env_extra or {}).items()]
    argv = _prefix() + extra + [str(a) for a in argv]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, **kwargs)
    if check and done.returncode != 0:
        raise AssertionError(
            f"{shlex.join(argv)} exited {done.returncode}\nstdout:\n{done.stdout}\n"
            f"stderr:\n{done.stderr}")
    return done


def docker(*args, **kwargs):
    return run([env("DEPLOY_TEST_DOCKER"), *args], **kwargs)


def wait_for(what, condition, timeout_s, interval_s=0.25):
    """Polls condition() until it returns a true value (returned) or timeout_s passes."""
    deadline = time.monotonic() + timeout_s
    last = None
    while time.monotonic() < deadline:
        last = condition()
        if last:
            return last
        time.sleep(interval_s)
    raise AssertionError(f"{what}: not within {timeout_s} s (last: {last!r})")


def host_pid(container):
    return int(docker("inspect", "-f", "{{.State.Pid}}", container).stdout)


def proc_status(pid):
    """The Uid/Gid lines of /proc/PID/status, as {'Uid': [real, effective, saved, fs], ...}."""
    status = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("Uid", "Gid"):
            status[key] = [int(v) for v in value.split()]
    return status


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
