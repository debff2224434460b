"""Process-level behaviour: flags, start-up, health, reflection, shutdown under traffic."""

from __future__ import annotations

import os
import pathlib
import re
import signal
import subprocess
import threading

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from conftest import BIN, DEMO_DIR, Sidecar
from probe_files import ProbeFile
from probe_sidecar import ProbeSidecarError
from server_state import SAFETY_S, wait_for


def run_binary(*args, timeout=30):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_flag():
    result = run_binary("--help")
    assert result.returncode == 0
    for flag in ["--listen", "--metrics-listen", "--probes", "--backend", "--device",
                 "--max-message-bytes", "--max-concurrent-requests", "--max-queued-requests",
                 "--max-rows", "--max-probes",
                 "--max-probe-file-bytes", "--cpu-threads", "--cuda-workers",
                 "--graph-cache-entries", "--warmup-rows", "--shutdown-grace-seconds",
                 "--log-level", "--version", "--unix-socket-mode", "--tls-cert", "--tls-key",
                 "--tls-client-ca", "--admin-token-file", "--admin-tls-identity",
                 "--allow-remote-ipc", "--allow-sessionless-buffers",
                 "--max-session-buffer-bytes", "--max-probe-sets", "--max-probe-set-bytes",
                 "--strict-probes", "--probe-precision"]:
        assert flag in result.stdout, flag


def test_readme_lists_every_flag_of_help():
    """README's "Server flags" names every flag --help lists, and no flag --help does not."""
    help_flags = set(re.findall(r"^  (--[a-z-]+)", run_binary("--help").stdout, re.M))
    assert len(help_flags) > 30
    readme = (pathlib.Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = readme.split("## Server flags", 1)[1].split("\n## ", 1)[0]
    readme_flags = set(re.findall(r"`(--[a-z-]+)", section))
    assert help_flags - {"--help", "--version"} <= readme_flags, help_flags - readme_flags
    assert readme_flags <= help_flags, readme_flags - help_flags


def test_version():
    result = run_binary("--version")
    assert result.returncode == 0 and result.stdout.startswith("probe-sidecar ")


@pytest.mark.parametrize(
    "args,fragment",
    [
        (["--bogus"], "unknown flag --bogus"),
        (["--backend=gpu"], "expected auto, cpu or cuda"),
        (["--listen=nowhere"], "expected host:port"),
        (["--listen=unix:relative"], "unix:/absolute/path"),
        (["--max-rows=0"], "--max-rows=0"),
        (["--max-message-bytes=12Zi"], "--max-message-bytes"),
        (["positional"], "unexpected argument"),
        (["--listen"], "needs a value"),
    ],
)
def test_bad_flags_exit_2_with_a_message(args, fragment):
    result = run_binary(*args)
    assert result.returncode == 2
    assert fragment in result.stderr


def _probes_dir_with_bad_files(tmp_path):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "good.safetensors").write_bytes(ProbeFile(2, 8, seed=1).data)
    (probes / "broken.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{oops")
    (tmp_path / "secret.safetensors").write_bytes(ProbeFile(2, 8, seed=2).data)
    (probes / "evil.safetensors").symlink_to(tmp_path / "secret.safetensors")
    (probes / "unreadable.safetensors").write_bytes(ProbeFile(2, 8, seed=3).data)
    (probes / "unreadable.safetensors").chmod(0)
    return probes


def test_bad_files_in_probes_are_skipped_logged_and_counted(tmp_path):
    probes = _probes_dir_with_bad_files(tmp_path)
    with Sidecar(["--backend=cpu"], probes_dir=probes) as s, s.client() as c:
        assert [p.name for p in c.list_probe_sets()] == (
            ["good"] if os.geteuid() != 0 else ["good", "unreadable"])  # root reads mode 0
        log = s.log()
        assert 'skipped: loading "broken.safetensors"' in log
        assert 'skipped: loading "evil.safetensors"' in log and "outside the probes directory" in log
        errors = 2 if os.geteuid() == 0 else 3
        assert f"probesidecar_probe_set_load_errors_total {errors}" in s.metrics_text()


def test_strict_probes_fails_the_start_on_a_bad_file(tmp_path):
    probes = _probes_dir_with_bad_files(tmp_path)
    result = run_binary(f"--probes={probes}", "--strict-probes", "--listen=127.0.0.1:0",
                        "--metrics-listen=none", "--backend=cpu")
    assert result.returncode == 1
    assert 'cannot start (--strict-probes): loading "broken.safetensors"' in result.stderr
    (probes / "broken.safetensors").unlink()
    (probes / "evil.safetensors").unlink()
    (probes / "unreadable.safetensors").unlink()
    with Sidecar(["--backend=cpu", "--strict-probes"], probes_dir=probes) as s, s.client() as c:
        assert [p.name for p in c.list_probe_sets()] == ["good"]


def test_unreadable_probes_directory_fails_start(tmp_path):
    result = run_binary(f"--probes={tmp_path / 'missing'}", "--listen=127.0.0.1:0",
                        "--metrics-listen=none", "--backend=cpu")
    assert result.returncode == 1
    assert "cannot start: --probes" in result.stderr and "missing" in result.stderr


def test_port_in_use_fails_start():
    with Sidecar(["--backend=cpu"]) as s:
        result = run_binary(f"--listen={s.tcp_target}", "--metrics-listen=none", "--backend=cpu")
        assert result.returncode == 1
        assert "could not listen" in result.stderr


@pytest.mark.parametrize("flags, named", [
    (["--admin-token-file=/nonexistent/token"], "--admin-token-file"),
    (["--tls-cert=/nonexistent/cert.pem", "--tls-key=/nonexistent/key.pem"], "--tls-cert"),
    (["--admin-unix-group=no-such-group-of-probe-sidecar"], "--admin-unix-group"),
])
def test_a_bad_file_or_name_fails_the_start_before_anything_starts(flags, named):
    """What a start reads from files and the system is read first: a bad one fails the start
    before the backend has started or a probe set was loaded."""
    result = run_binary("--backend=cpu", "--listen=127.0.0.1:0", "--metrics-listen=none", *flags)
    assert result.returncode == 1, result.stderr
    assert "cannot start" in result.stderr and named in result.stderr, result.stderr
    assert "probe sets from" not in result.stderr, result.stderr


def test_defaults_load_the_bundled_demo_set():
    assert (DEMO_DIR / "demo.safetensors").is_file()
    with Sidecar(["--backend=cpu"]) as s, s.client() as c:
        demo = {p.name: p for p in c.list_probe_sets()}["demo"]
        assert demo.num_probes == 4 and demo.hidden_size == 4096
        info = c.server_info()
        assert info.backend == "cpu"
        assert info.compute_capability == "" and list(info.kernel_paths) == ["cpu"]
        # The log's start line and ServerInfo name the same bound addresses, and they answer.
        started = re.search(r"serving on (.*?); metrics on (\S+);", s.log())
        assert started is not None, s.log()
        assert started.group(1).split(", ") == list(info.listen)
        assert started.group(2) == info.metrics_listen and ":0" not in info.metrics_listen
        assert s.tcp_target in info.listen and f"unix:{s.socket}" in info.listen
        assert "probesidecar_start_time_seconds" in s.metrics_text()
        with s.client("tcp") as tcp:
            assert tcp.server_info().backend == "cpu"
        assert info.limits.max_rows == 65536
        assert info.limits.max_queued_requests == 128
        assert info.limits.max_probe_sets == 256 and info.limits.max_probe_set_bytes == 16 << 30
        assert info.limits.max_session_buffer_bytes == 1 << 40


def test_health_check_and_watch():
    # gRPC's health service keeps Watch streams open until the grace period ends.
    s = Sidecar(["--backend=cpu", "--shutdown-grace-seconds=1"]).start()
    try:
        channel = grpc.insecure_channel(s.uds_target)
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ["", "probesidecar.v1.ProbeSidecar"]:
            response = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
            assert response.status == health_pb2.HealthCheckResponse.SERVING
        with pytest.raises(grpc.RpcError) as error:
            stub.Check(health_pb2.HealthCheckRequest(service="no.such.Service"), timeout=10)
        assert error.value.code() == grpc.StatusCode.NOT_FOUND
        watch = stub.Watch(health_pb2.HealthCheckRequest(service="probesidecar.v1.ProbeSidecar"))
        assert next(watch).status == health_pb2.HealthCheckResponse.SERVING
        s.signal(signal.SIGTERM)
        statuses = []
        try:
            for response in watch:
                statuses.append(response.status)
        except grpc.RpcError:
            pass  # the stream ends when the server goes away
        assert s.wait() == 0
        # Draining reports NOT_SERVING (possibly more than once) before the stream ends.
        assert set(statuses) <= {health_pb2.HealthCheckResponse.NOT_SERVING}, statuses
        channel.close()
    finally:
        s.close()


def test_reflection_lists_the_services(sidecar):
    channel = grpc.insecure_channel(sidecar.uds_target)
    stub = reflection_pb2_grpc.ServerReflectionStub(channel)
    responses = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
    names = {s.name for s in next(responses).list_services_response.service}
    assert {"probesidecar.v1.ProbeSidecar", "grpc.health.v1.Health"} <= names
    responses = stub.ServerReflectionInfo(
        iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="probesidecar.v1.ScoreRequest")]))
    assert next(responses).file_descriptor_response.file_descriptor_proto
    channel.close()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_during_traffic_ends_cleanly(sig):
    s = Sidecar(["--backend=cpu"]).start()
    try:
        x = np.random.default_rng(0).standard_normal((16, 4096)).astype(np.float32)
        ok = [0] * 8
        unexpected = []
        stop = threading.Event()

        def traffic(i):
            with s.client("uds" if i % 2 else "tcp", timeout=SAFETY_S) as c:
                while not stop.is_set():
                    try:
                        result = c.score(x, np.arange(16), "demo")
                        assert result.scores.shape == (16, 4)
                        ok[i] += 1
                    except ProbeSidecarError as error:
                        # After shutdown starts, new calls are refused; nothing else may happen.
                        if error.code != grpc.StatusCode.UNAVAILABLE:
                            unexpected.append(error)
                        return

        threads = [threading.Thread(target=traffic, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        # The signal comes once every client has been answered: traffic is flowing on both
        # transports (a fact, not a guess at how long that takes on this machine).
        flowing = wait_for(lambda: all(ok) or bool(unexpected), SAFETY_S)
        s.signal(sig)
        code = s.wait(timeout=SAFETY_S)
        stop.set()
        for t in threads:
            t.join()
        assert flowing and all(ok), ok
        assert code == 0, s.log()
        assert not unexpected, unexpected
        assert "draining in-flight requests" in s.log() and "stopped" in s.log()
        # The log says who sent the signal: this process (pytest's), by pid and uid.
        assert f"(from pid {os.getpid()} " in s.log() and f", uid {os.getuid()}):" in s.log()
        assert not s.socket.exists()  # the Unix socket file is removed
    finally:
        s.close()
