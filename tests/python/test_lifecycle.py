"""Process-level behaviour: flags, start-up, health, reflection, shutdown under traffic."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import grpc
import numpy as np
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from conftest import BIN, DEMO_DIR, Sidecar
from probe_sidecar import ProbeSidecarError


def run_binary(*args, timeout=30):
    return subprocess.run([str(BIN), *args], capture_output=True, text=True, timeout=timeout)


def test_help_lists_every_flag():
    result = run_binary("--help")
    assert result.returncode == 0
    for flag in ["--listen", "--metrics-listen", "--probes", "--backend", "--device",
                 "--max-message-bytes", "--max-concurrent-requests", "--max-rows", "--max-probes",
                 "--max-probe-file-bytes", "--cpu-threads", "--cuda-workers",
                 "--graph-cache-entries", "--warmup-rows", "--shutdown-grace-seconds",
                 "--log-level", "--version"]:
        assert flag in result.stdout, flag


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


def test_bad_probes_directory_fails_start(tmp_path):
    (tmp_path / "broken.safetensors").write_bytes(b"\x05\0\0\0\0\0\0\0{oops")
    result = run_binary(f"--probes={tmp_path}", "--listen=127.0.0.1:0", "--metrics-listen=none")
    assert result.returncode == 1
    assert "broken" in result.stderr


def test_port_in_use_fails_start():
    with Sidecar(["--backend=cpu"]) as s:
        result = run_binary(f"--listen={s.tcp_target}", "--metrics-listen=none", "--backend=cpu")
        assert result.returncode == 1
        assert "could not listen" in result.stderr


def test_defaults_load_the_bundled_demo_set():
    assert (DEMO_DIR / "demo.safetensors").is_file()
    with Sidecar(["--backend=cpu"]) as s, s.client() as c:
        demo = {p.name: p for p in c.list_probe_sets()}["demo"]
        assert demo.num_probes == 4 and demo.hidden_size == 4096
        info = c.server_info()
        assert info.backend == "cpu"
        assert s.tcp_target in info.listen and f"unix:{s.socket}" in info.listen
        assert info.metrics_listen == s.metrics_address
        assert info.limits.max_rows == 65536


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
            with s.client("uds" if i % 2 else "tcp", timeout=10) as c:
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
        time.sleep(0.5)
        s.signal(sig)
        code = s.wait(timeout=30)
        stop.set()
        for t in threads:
            t.join()
        assert code == 0, s.log()
        assert not unexpected, unexpected
        assert sum(ok) > 8
        assert "draining in-flight requests" in s.log() and "stopped" in s.log()
        assert not s.socket.exists()  # the Unix socket file is removed
    finally:
        s.close()
