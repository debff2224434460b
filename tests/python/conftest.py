"""Fixtures that start the real probe-sidecar binary on a temporary Unix socket and a free
loopback port, and clients that talk to it."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import tempfile
import threading
import time
import urllib.request

import pytest

from probe_sidecar import Client, ProbeSidecarError

BIN = pathlib.Path(os.environ.get("PROBE_SIDECAR_BIN", "build/bin/probe-sidecar")).resolve()
# The same server with the test-only fault injector (tests/faults/test_faults_main.cc).
FAULTS_BIN = pathlib.Path(
    os.environ.get("PROBE_SIDECAR_TEST_FAULTS_BIN", BIN.parent / "probe-sidecar-test-faults")).resolve()
CLIENT_BIN = pathlib.Path(os.environ.get("PROBE_CLIENT_BIN", "build/bin/probe-client")).resolve()
DEMO_DIR = BIN.parent.parent / "share" / "probe-sidecar" / "probes"

# The name the server gives its service in grpc.health.v1 (server/rpc/server.cc): SERVING once
# every listener is up.
SERVICE_NAME = "probesidecar.v1.ProbeSidecar"
# How long a start may take before a test gives up: a safety net for a server that never comes
# up, far past any start (a sanitized build on a busy machine included), never a measurement.
START_SAFETY_S = 600.0


# How much of a server's log a failed test's report shows (its last lines).
REPORT_LOG_LINES = 200


class Sidecar:
    """One probe-sidecar process. ``args`` are extra flags; listeners are chosen here (a
    ``--listen`` in ``args`` adds one, and the last TCP one becomes ``tcp_target``). ``umask``
    is the server process's umask; ``binary`` another server binary than ``BIN``; ``env``
    variables set in the server's environment over this process's.

    A test that fails shows the log of every server that was running or stopped during it
    (pytest_runtest_makereport below): a failure that is no assertion of the server's state (a
    client error, a timeout) says in its report what the server logged."""

    running: set["Sidecar"] = set()  # started and not yet stopped
    stopped_in_test: list["Sidecar"] = []  # stopped during the current test (cleared before each)

    def __init__(self, args: list[str] | None = None, *, workdir: pathlib.Path | None = None,
                 probes_dir: pathlib.Path | None = None, metrics: bool = True,
                 umask: int | None = None, binary: pathlib.Path | None = None,
                 env: dict[str, str] | None = None):
        self._tmp = tempfile.TemporaryDirectory(prefix="probe-sidecar-test-")
        self.workdir = pathlib.Path(workdir or self._tmp.name)
        self.socket = self.workdir / "sidecar.sock"
        self.log_path = self.workdir / "sidecar.log"
        self.probes_dir = probes_dir
        flags = [f"--listen=unix:{self.socket}", "--listen=127.0.0.1:0"]
        flags.append("--metrics-listen=127.0.0.1:0" if metrics else "--metrics-listen=none")
        if probes_dir is not None:
            flags.append(f"--probes={probes_dir}")
        # PROBE_SIDECAR_ARGS: flags added to every server a test starts, e.g. --devices=all to
        # run the GPU tests against a server of every device (tests/gpu/, docs/tensor-parallel.md).
        extra = os.environ.get("PROBE_SIDECAR_ARGS", "").split()
        self.argv = [str(binary or BIN), *flags, *(args or []), *extra]
        self.umask = umask
        self.env = None if env is None else {**os.environ, **env}
        self.process: subprocess.Popen | None = None
        self.final_log: str | None = None  # the log as it was when the server was stopped
        self.tcp_target = ""
        self.metrics_address = ""

    @property
    def uds_target(self) -> str:
        return f"unix://{self.socket}"

    def start(self, timeout: float = START_SAFETY_S) -> "Sidecar":
        """Starts the server and returns once its gRPC health status is SERVING; its TCP and
        metrics addresses are then the ones ServerInfo reports."""
        self._log = open(self.log_path, "wb")
        # Popen's umask (set between fork and exec in C), never a preexec_fn: Python code run
        # there, in a process with gRPC's threads, can deadlock before the exec.
        self.process = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT,
                                        env=self.env,
                                        umask=-1 if self.umask is None else self.umask)
        Sidecar.running.add(self)
        self.final_log = None
        deadline = time.monotonic() + timeout
        with Client(self.uds_target, timeout=10.0) as probe:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"probe-sidecar exited with {self.process.returncode}:\n"
                                       f"{self.log()}")
                try:
                    serving = probe.health(SERVICE_NAME) == "SERVING"
                except ProbeSidecarError:  # not listening yet, or the service not yet named
                    serving = False
                if serving:
                    info = probe.server_info()
                    for address in info.listen:
                        if not address.startswith("unix:"):
                            self.tcp_target = address
                    self.metrics_address = info.metrics_listen
                    return self
                time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"probe-sidecar did not start in {timeout} s:\n{self.log()}")

    def log(self) -> str:
        if self.final_log is not None:
            return self.final_log  # the log file goes with the server's directory on close()
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def metrics_text(self) -> str:
        """The /metrics exposition (the server must run with a metrics listener)."""
        with urllib.request.urlopen(f"http://{self.metrics_address}/metrics", timeout=10) as r:
            return r.read().decode()

    def client(self, transport: str = "uds", **kwargs) -> Client:
        return Client(self.uds_target if transport == "uds" else self.tcp_target, **kwargs)

    def signal(self, sig: int = signal.SIGTERM) -> None:
        assert self.process is not None
        self.process.send_signal(sig)

    def pause(self, timeout: float = 30.0) -> None:
        """SIGSTOP, returning once every thread of the server has stopped. kill() only starts a
        stop: the kernel wakes one thread to take it, and the others run on until that thread
        has been scheduled and stopped them, which on a loaded machine can be long enough for
        the server to answer what the test sends next."""
        assert self.process is not None
        self.process.send_signal(signal.SIGSTOP)
        pid, reported = self.process.pid, []

        def wait_for_the_stop() -> None:
            # Blocks until the whole thread group has stopped (WSTOPPED reports a group stop, not
            # a thread's) or the server has exited; WNOWAIT looks at the state without taking it,
            # so Popen still reaps the exit itself.
            try:
                reported.append(os.waitid(os.P_PID, pid, os.WSTOPPED | os.WEXITED | os.WNOWAIT))
            except ChildProcessError as error:  # reaped already
                reported.append(error)

        waiter = threading.Thread(target=wait_for_the_stop, daemon=True)
        waiter.start()
        waiter.join(timeout)
        if not reported:
            raise RuntimeError(f"probe-sidecar did not stop within {timeout} s of SIGSTOP")
        if getattr(reported[0], "si_code", None) != os.CLD_STOPPED:
            raise RuntimeError(f"probe-sidecar exited while being paused:\n{self.log()}")

    def resume(self) -> None:
        self.signal(signal.SIGCONT)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.process is not None
        return self.process.wait(timeout=timeout)

    def stop(self) -> int | None:
        if self.process is None:
            return None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        if self in Sidecar.running:  # once, also for a server whose start() failed
            self.final_log = self.log()
            Sidecar.running.discard(self)
            Sidecar.stopped_in_test.append(self)
        return self.process.returncode

    def close(self) -> None:
        self.stop()
        self._tmp.cleanup()

    def __enter__(self) -> "Sidecar":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


def sidecar_fixture(*flags: str):
    """A module-scoped `sidecar` fixture: one server started with `flags` for a test module,
    which must still be running when the module is done (`sidecar = sidecar_fixture(...)`)."""

    @pytest.fixture(scope="module")
    def sidecar():
        with Sidecar(list(flags)) as s:
            yield s
            assert s.process.poll() is None, "the server died during the tests:\n" + s.log()

    return sidecar


# A CPU-backend sidecar with the bundled demo probe set, shared by a test module.
sidecar = sidecar_fixture("--backend=cpu")


@pytest.fixture
def client(sidecar):
    with sidecar.client() as c:
        yield c


def pytest_report_header(config):
    return f"probe-sidecar binary: {BIN}"


def pytest_runtest_setup(item):
    Sidecar.stopped_in_test.clear()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A failed test's report gets the last REPORT_LOG_LINES lines of each server's log."""
    outcome = yield
    report = outcome.get_result()
    if not report.failed:
        return
    for s in [*Sidecar.stopped_in_test, *Sidecar.running]:
        lines = s.log().splitlines()[-REPORT_LOG_LINES:]
        state = "running" if s.process.poll() is None else f"exit {s.process.returncode}"
        report.sections.append((f"probe-sidecar log ({state}; {' '.join(s.argv[1:])})",
                                "\n".join(lines)))


@pytest.fixture(params=["triton", "torch"])
def kernel(request, monkeypatch):
    """Both ways a CUDA tap's ring is written (probe_sidecar.tap_op): the Triton kernels, and the
    torch operations used where Triton is missing."""
    if request.param == "torch":
        monkeypatch.setenv("PROBE_SIDECAR_TAP_KERNEL", "torch")
    else:
        pytest.importorskip("triton")
        monkeypatch.delenv("PROBE_SIDECAR_TAP_KERNEL", raising=False)
    return request.param


def project_env(name: str, default: str | None = None) -> str | None:
    """$PROBE_SIDECAR_<name>, else the deprecated spelling $PROBESIDECAR_<name> (read until the
    next release), else `default`."""
    value = os.environ.get(f"PROBE_SIDECAR_{name}")
    return value if value is not None else os.environ.get(f"PROBESIDECAR_{name}", default)


def require_cuda():
    """torch with a CUDA device, for GPU test modules (call at module level).

    Without one the module is skipped — except where PROBE_SIDECAR_REQUIRE_GPU=1 (the GPU machine,
    tests/gpu/run.sh): there a GPU test that would skip fails instead, so a GPU run in which
    every GPU test skipped cannot pass.
    """
    try:
        import torch
    except ImportError:
        _no_gpu("torch is not installed")
    if not torch.cuda.is_available():
        _no_gpu("torch.cuda.is_available() is False")
    return torch


def _no_gpu(why: str):
    if project_env("REQUIRE_GPU") == "1":
        pytest.fail(f"no CUDA device ({why}), but PROBE_SIDECAR_REQUIRE_GPU=1", pytrace=False)
    pytest.skip(f"no CUDA device: {why}", allow_module_level=True)


def pytest_sessionfinish(session, exitstatus):
    """Exit with $PROBE_SIDECAR_SKIPPED_EXIT_CODE (CTest sets 77, its SKIP_RETURN_CODE) when
    nothing ran and something was skipped: CTest then reports the test as skipped by its exit
    status, never by matching text in its output."""
    code = os.environ.get("PROBE_SIDECAR_SKIPPED_EXIT_CODE")
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not code or reporter is None:
        return
    stats = reporter.stats
    ran = any(stats.get(k) for k in ("passed", "failed", "error", "xfailed", "xpassed"))
    if not ran and stats.get("skipped"):
        session.exitstatus = int(code)
