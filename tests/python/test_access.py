"""Access control, each rule against the real server: the Unix socket's mode, the admin token,
TLS and mutual TLS with an admin identity, and CUDA IPC registrations from local peers only."""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import socket
import stat
import subprocess
import tempfile
import time
import types

import grpc
import numpy as np
import pytest

import tls_certs
from conftest import BIN, CLIENT_BIN, Sidecar
from probe_files import ProbeFile
from probe_sidecar import Client, ProbeSidecarError
from probesidecar.v1 import buffers_pb2

TOKEN = "test-admin-token-7f3a9c01d2e4"
PROBES = ProbeFile(2, 16, seed=5)


def _refused(call, code: grpc.StatusCode, fragment: str = "") -> ProbeSidecarError:
    with pytest.raises(ProbeSidecarError) as error:
        call()
    assert error.value.code == code, error.value
    assert fragment in error.value.message
    return error.value


def _scores_demo(client: Client) -> None:
    x = np.random.default_rng(0).standard_normal((2, 4096)).astype(np.float32)
    assert client.score(x, [0, 1], "demo").scores.shape == (2, 4)


# --- the Unix socket ---------------------------------------------------------------------------

@pytest.mark.parametrize("flags,umask,mode", [
    ([], 0o000, 0o660),  # umask 0 would leave it 0777
    ([], 0o077, 0o660),  # and 077 0700: the mode is set, not filtered
    (["--unix-socket-mode=0600"], 0o000, 0o600),
    (["--unix-socket-mode=0666"], 0o022, 0o666),
])
def test_unix_socket_mode(flags, umask, mode):
    with Sidecar(["--backend=cpu", *flags], umask=umask) as s, s.client() as c:
        assert stat.S_IMODE(os.stat(s.socket).st_mode) == mode
        assert stat.S_ISSOCK(os.stat(s.socket).st_mode)
        c.server_info()


# --- admin rights without an admin credential: the Unix socket's peer uid ---------------------

OTHER_UID = 65534  # nobody
# What probe-client prints when it aborts for want of a thread or a poller wake-up (_as_user).
CLIENT_STARVED = ("pthread_create failed", "Check failed: wakeup_fd_->Wakeup().ok()")
ADMIN_FLAGS = ("--admin-token-file", "--admin-tls-identity", "--admin-unix-group")
needs_root = pytest.mark.skipif(os.geteuid() != 0,
                                reason="switching a client process to another uid needs root")


def _as_user(s: Sidecar, uid: int, gid: int, groups: list[int], *command: str) -> tuple[str, str]:
    """Runs probe-client COMMAND over the Unix socket in a process with these credentials (what
    the server reads with SO_PEERCRED and SO_PEERGROUPS); returns "OK" or the status code's name,
    and probe-client's stderr."""

    # user/group/extra_groups, not a preexec_fn: Python code run between fork and exec in a
    # process with gRPC's threads can deadlock, and then Popen waits for the exec forever.
    # The client aborts when the kernel has no task to give its gRPC threads (pthread_create:
    # EAGAIN; seen in clean-clone test runs, release and ASan, with fewer than 200 threads on the
    # machine: the kernel's tasks are shared with other containers), or when its poller cannot
    # wake one of them (gRPC's "Check failed: wakeup_fd_->Wakeup().ok()" in ev_epoll1_linux.cc;
    # seen once, ASan stage). That says nothing of the server's access checks: run it again until
    # it gets its threads, for at most a minute (a safety net far past one run). The abort may
    # come after the call was served (seen once: a load whose rerun found the set loaded), so a
    # rerun of a load or unload that answers "the aborted run already did it" counts as that
    # run's OK.
    already_done = {"load": "ALREADY_EXISTS", "unload": "NOT_FOUND"}.get(command[0])
    deadline = time.monotonic() + 60
    aborted = False
    while True:
        result = subprocess.run([str(CLIENT_BIN), f"--target=unix:{s.socket}", *command],
                                capture_output=True, text=True, timeout=60, user=uid, group=gid,
                                extra_groups=groups, cwd="/")
        if not any(m in result.stderr for m in CLIENT_STARVED) or time.monotonic() > deadline:
            break
        aborted = True
    if result.returncode == 0:
        return "OK", result.stderr
    found = re.search(r"probe-client: ([A-Z_]+):", result.stderr)
    assert found, result.stderr
    if aborted and found.group(1) == already_done:
        return "OK", result.stderr
    return found.group(1), result.stderr


@pytest.fixture
def shared_workdir():
    """Makes directories other users can reach the socket and a probe file in (a test's own
    temporary directories are 0700); removed after the test."""
    made = []

    def make() -> pathlib.Path:
        path = pathlib.Path(tempfile.mkdtemp(prefix="probe-sidecar-shared-"))
        path.chmod(0o755)
        (path / "mine.safetensors").write_bytes(PROBES.data)
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def _load_mine(s: Sidecar) -> list[str]:
    return ["load", "mine", "--file", str(s.workdir / "mine.safetensors")]


def test_without_an_admin_credential_tcp_clients_may_not_load_or_unload():
    with Sidecar(["--backend=cpu"]) as s:
        with s.client("tcp") as tcp:
            for call in (lambda: tcp.load_probe_set("p", data=PROBES.data),
                         lambda: tcp.unload_probe_set("demo")):
                error = _refused(call, grpc.StatusCode.PERMISSION_DENIED, "over the Unix socket")
                assert f"uid {os.geteuid()}" in error.message and "ipv4:127.0.0.1:" in error.message
                for flag in ADMIN_FLAGS:
                    assert flag in error.message, error.message
            _scores_demo(tcp)  # everything else is open
        # Refused, nothing changed; the same user over the Unix socket may.
        with s.client() as local:
            assert [p.name for p in local.list_probe_sets()] == ["demo"]
            assert local.load_probe_set("p", data=PROBES.data).num_probes == 2
            local.unload_probe_set("p")
            local.unload_probe_set("demo")
            assert local.list_probe_sets() == []
        text = s.metrics_text()
        assert 'probesidecar_rpc_requests_total{rpc="LoadProbeSet",code="PERMISSION_DENIED"} 1' in text
        assert 'probesidecar_rpc_requests_total{rpc="UnloadProbeSet",code="PERMISSION_DENIED"} 1' in text


@needs_root
def test_without_an_admin_credential_other_users_on_the_unix_socket_may_not(shared_workdir):
    # 0666: any local user may connect (and score), but only the server's user and root are admin.
    with Sidecar(["--backend=cpu", "--unix-socket-mode=0666"], workdir=shared_workdir()) as s:
        for command in (_load_mine(s), ["unload", "demo"]):
            code, message = _as_user(s, OTHER_UID, OTHER_UID, [], *command)
            assert code == "PERMISSION_DENIED", message
            assert f"from uid {OTHER_UID} (pid " in message and "uid 0" in message
            for flag in ADMIN_FLAGS:
                assert flag in message, message
        assert _as_user(s, OTHER_UID, OTHER_UID, [], "score", "--probe-set", "demo", "--random",
                        "2,4096")[0] == "OK"
        with s.client() as c:
            assert [p.name for p in c.list_probe_sets()] == ["demo"]


@needs_root
def test_admin_unix_group_members_may_load_and_unload(shared_workdir):
    group = 4242  # a numeric gid: no entry in /etc/group is needed
    flags = ["--backend=cpu", "--unix-socket-mode=0666", f"--admin-unix-group={group}"]
    with Sidecar(flags, workdir=shared_workdir()) as s:
        # As the connecting process's primary group, or as one of its supplementary groups.
        assert _as_user(s, OTHER_UID, group, [], *_load_mine(s))[0] == "OK"
        assert _as_user(s, OTHER_UID, OTHER_UID, [group], "unload", "mine")[0] == "OK"
        code, message = _as_user(s, OTHER_UID, OTHER_UID, [4243], *_load_mine(s))
        assert code == "PERMISSION_DENIED" and "members of group 4242" in message, message
        with s.client() as c:  # the server's own user still is admin
            assert [p.name for p in c.list_probe_sets()] == ["demo"]
            c.load_probe_set("p", data=PROBES.data)
    # With a token configured the token decides, except for the group's members on the socket.
    workdir = shared_workdir()
    (workdir / "token").write_text(TOKEN)
    with Sidecar([*flags, f"--admin-token-file={workdir / 'token'}"], workdir=workdir) as s:
        assert _as_user(s, OTHER_UID, group, [], *_load_mine(s))[0] == "OK"
        with s.client() as c:
            error = _refused(lambda: c.unload_probe_set("mine"), grpc.StatusCode.UNAUTHENTICATED)
            assert "--admin-unix-group" in error.message
        with s.client(admin_token=TOKEN) as admin:
            admin.unload_probe_set("mine")


def test_an_unknown_admin_unix_group_fails_the_start(tmp_path):
    result = subprocess.run(
        [str(BIN), "--backend=cpu", f"--listen=unix:{tmp_path}/s.sock", "--metrics-listen=none",
         "--admin-unix-group=no-such-group-here"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "--admin-unix-group=no-such-group-here: no such group" in result.stderr, result.stderr


def test_a_unix_socket_another_server_listens_on_is_not_taken_over(tmp_path):
    with Sidecar(["--backend=cpu"], workdir=tmp_path) as s:
        result = subprocess.run(
            [str(BIN), "--backend=cpu", f"--listen=unix:{s.socket}", "--metrics-listen=none"],
            capture_output=True, text=True, timeout=60)
        assert result.returncode == 1
        assert "another process is listening on" in result.stderr, result.stderr
        with s.client() as c:
            _scores_demo(c)
    # A stale socket file (its server is gone without removing it) is replaced.
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as left:
        left.bind(str(stale))
    with Sidecar(["--backend=cpu", f"--listen=unix:{stale}"]) as s, \
            Client(f"unix://{stale}") as c:
        _scores_demo(c)


# --- the admin token ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def token_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("admin") / "token"
    path.write_text(f"  {TOKEN}  \nsecond line is ignored\n")
    return path


@pytest.fixture(scope="module")
def token_server(token_file):
    with Sidecar(["--backend=cpu", f"--admin-token-file={token_file}"]) as s:
        yield s


@pytest.mark.parametrize("transport", ["uds", "tcp"])
def test_admin_rpcs_need_the_token(token_server, transport):
    with token_server.client(transport) as anonymous:
        _refused(lambda: anonymous.load_probe_set("p", data=PROBES.data),
                 grpc.StatusCode.UNAUTHENTICATED, "needs the admin token")
        _refused(lambda: anonymous.unload_probe_set("demo"), grpc.StatusCode.UNAUTHENTICATED)
        # Everything else is open to anyone who can connect.
        assert [s.name for s in anonymous.list_probe_sets()] == ["demo"]
        _scores_demo(anonymous)
    for wrong in ["wrong-token-000000000000", TOKEN[:-1], TOKEN + "x"]:
        with token_server.client(transport, admin_token=wrong) as c:
            _refused(lambda: c.load_probe_set("p", data=PROBES.data),
                     grpc.StatusCode.PERMISSION_DENIED, "may not load or unload")
            _refused(lambda: c.unload_probe_set("demo"), grpc.StatusCode.PERMISSION_DENIED)
    with token_server.client(transport, admin_token=TOKEN) as admin:
        assert admin.load_probe_set("p", data=PROBES.data).num_probes == 2
        admin.unload_probe_set("p")
        assert [s.name for s in admin.list_probe_sets()] == ["demo"]


def test_refusals_are_counted(token_server):
    with token_server.client() as anonymous:
        _refused(lambda: anonymous.load_probe_set("p", data=PROBES.data),
                 grpc.StatusCode.UNAUTHENTICATED)
    text = token_server.metrics_text()
    assert 'probesidecar_rpc_requests_total{rpc="LoadProbeSet",code="UNAUTHENTICATED"}' in text


def test_probe_client_sends_the_token(token_server, token_file, tmp_path):
    probe_file = tmp_path / "p.safetensors"
    probe_file.write_bytes(PROBES.data)
    base = [str(CLIENT_BIN), f"--target=unix:{token_server.socket}"]
    refused = subprocess.run([*base, "load", "p", "--file", str(probe_file)],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 1 and "UNAUTHENTICATED" in refused.stderr, refused.stderr
    for command in (["load", "p", "--file", str(probe_file)], ["unload", "p"]):
        done = subprocess.run([*base, f"--admin-token-file={token_file}", *command],
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr


@pytest.mark.parametrize("content,fragment", [
    ("short\n", "must be at least 16 characters"),
    ("", "empty"),
    (None, "cannot open"),
])
def test_bad_admin_token_file_fails_the_start(tmp_path, content, fragment):
    path = tmp_path / "token"
    if content is not None:
        path.write_text(content)
    result = subprocess.run(
        [str(BIN), "--backend=cpu", f"--listen=unix:{tmp_path}/s.sock", "--metrics-listen=none",
         f"--admin-token-file={path}"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert "cannot start" in result.stderr and fragment in result.stderr, result.stderr
    assert "short" not in result.stderr  # the token itself is never logged


# --- TLS and mutual TLS ------------------------------------------------------------------------

@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    d = tmp_path_factory.mktemp("pki")
    ca, other_ca = tls_certs.CertificateAuthority("test CA"), tls_certs.CertificateAuthority("other CA")
    files = types.SimpleNamespace(dir=d, ca_pem=ca.pem, other_ca_pem=other_ca.pem,
                                  ca=tls_certs.write(d, "ca.pem", ca.pem))
    files.server_cert, files.server_key = (
        tls_certs.write(d, f"server.{kind}", pem)
        for kind, pem in zip(("pem", "key"), ca.issue("probe-sidecar", server=True)))
    files.clients = {}
    for name, issuer in (("ops", ca), ("intruder", ca), ("stranger", other_ca)):
        cert, key = issuer.issue("ops" if name == "stranger" else name, server=False)
        files.clients[name] = (cert, key, tls_certs.write(d, f"{name}.pem", cert),
                               tls_certs.write(d, f"{name}.key", key))
    return files


def _tls(pki, client: str | None = None, root: bytes | None = None) -> grpc.ChannelCredentials:
    cert, key = (pki.clients[client][0], pki.clients[client][1]) if client else (None, None)
    return grpc.ssl_channel_credentials(root_certificates=root or pki.ca_pem, private_key=key,
                                        certificate_chain=cert)


def test_tls_on_tcp(pki):
    flags = ["--backend=cpu", f"--tls-cert={pki.server_cert}", f"--tls-key={pki.server_key}"]
    with Sidecar(flags) as s:
        with s.client("tcp", credentials=_tls(pki)) as c:
            assert c.server_info().version
            _scores_demo(c)
        # Plaintext to the TLS port, or a client that trusts another CA, does not get through.
        with s.client("tcp", timeout=5) as plain:
            _refused(plain.server_info, grpc.StatusCode.UNAVAILABLE)
        with s.client("tcp", timeout=5, credentials=_tls(pki, root=pki.other_ca_pem)) as c:
            _refused(c.server_info, grpc.StatusCode.UNAVAILABLE)
        # The Unix socket stays plaintext (its file mode guards it).
        with s.client() as c:
            _scores_demo(c)


def test_mutual_tls_with_an_admin_identity(pki):
    flags = ["--backend=cpu", f"--tls-cert={pki.server_cert}", f"--tls-key={pki.server_key}",
             f"--tls-client-ca={pki.ca}", "--admin-tls-identity=ops"]
    with Sidecar(flags) as s:
        # No client certificate, or one from another CA (even named "ops"): no connection.
        for credentials in (_tls(pki), _tls(pki, "stranger")):
            with s.client("tcp", timeout=5, credentials=credentials) as c:
                _refused(c.server_info, grpc.StatusCode.UNAVAILABLE)
        # A client of the CA may score, but only the admin identity may load and unload.
        with s.client("tcp", credentials=_tls(pki, "intruder")) as c:
            _scores_demo(c)
            _refused(lambda: c.load_probe_set("p", data=PROBES.data),
                     grpc.StatusCode.PERMISSION_DENIED)
            _refused(lambda: c.unload_probe_set("demo"), grpc.StatusCode.PERMISSION_DENIED)
        with s.client("tcp", credentials=_tls(pki, "ops")) as admin:
            admin.load_probe_set("p", data=PROBES.data)
            admin.unload_probe_set("p")
        # Over the Unix socket nobody has a certificate: not an admin.
        with s.client() as c:
            _refused(lambda: c.load_probe_set("p", data=PROBES.data),
                     grpc.StatusCode.UNAUTHENTICATED)
        # probe-client speaks mutual TLS too.
        _, _, cert, key = pki.clients["ops"]
        result = subprocess.run(
            [str(CLIENT_BIN), f"--target={s.tcp_target}", f"--tls-ca={pki.ca}",
             f"--tls-cert={cert}", f"--tls-key={key}", "unload", "demo"],
            capture_output=True, text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        with s.client() as c:
            assert c.list_probe_sets() == []


@pytest.mark.parametrize("flags,fragment", [
    (["--tls-cert=/nonexistent/cert.pem", "--tls-key=/nonexistent/key.pem"], "--tls-cert"),
    (["--tls-client-ca=/x.pem"], "--tls-client-ca needs --tls-cert"),
    (["--admin-tls-identity=ops"], "needs mutual TLS"),
])
def test_bad_tls_flags_fail_the_start(tmp_path, flags, fragment):
    result = subprocess.run(
        [str(BIN), "--backend=cpu", f"--listen=unix:{tmp_path}/s.sock", "--metrics-listen=none",
         *flags], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert fragment in result.stderr, result.stderr


# --- CUDA IPC from local peers only ------------------------------------------------------------

def _non_loopback_ipv4() -> str | None:
    """This host's address on its default route (no packet is sent), or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address = s.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


REGISTRATIONS = [
    ("RegisterBuffer", buffers_pb2.RegisterBufferRequest(handle=b"\0" * 64, byte_size=16, session_id=1)),
    ("RegisterEvent", buffers_pb2.RegisterEventRequest(handle=b"\0" * 64, session_id=1)),
]


def _register_code(client: Client, method: str, request) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as error:
        getattr(client.stub, method)(request, timeout=10)
    return error.value.code(), error.value.details()


def test_ipc_registrations_only_from_this_host():
    address = _non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to connect from")
    with Sidecar(["--backend=cpu", f"--listen={address}:0"]) as s:
        assert s.tcp_target.startswith(address)
        with s.client("tcp") as remote, s.client() as local:
            for method, request in REGISTRATIONS:
                code, details = _register_code(remote, method, request)
                assert code == grpc.StatusCode.PERMISSION_DENIED, details
                assert "from this host only" in details and "--allow-remote-ipc" in details
                # From the Unix socket the request gets past the check (to the CPU backend's
                # refusal).
                code, details = _register_code(local, method, request)
                assert code == grpc.StatusCode.FAILED_PRECONDITION, details
            _scores_demo(remote)  # scoring inline data is fine from anywhere
    with Sidecar(["--backend=cpu", f"--listen={address}:0", "--allow-remote-ipc"]) as s:
        with s.client("tcp") as remote:
            for method, request in REGISTRATIONS:
                code, details = _register_code(remote, method, request)
                assert code == grpc.StatusCode.FAILED_PRECONDITION, details


def test_listeners_reachable_from_other_hosts_are_warned_about():
    address = _non_loopback_ipv4()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address to listen on")
    with Sidecar(["--backend=cpu", f"--listen={address}:0"]) as s:
        log = s.log()
        assert f"{address}:0 is reachable from other hosts in plaintext" in log
        # Without an admin credential, TCP clients are not admin: no warning about that.
        assert "may load and unload probe sets" not in log
    with Sidecar(["--backend=cpu"]) as s:  # loopback and the Unix socket only: nothing to say
        assert "reachable from other hosts" not in s.log()
