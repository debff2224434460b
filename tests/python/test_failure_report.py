"""A failed test's report carries the log of every server it had running or stopped
(conftest.pytest_runtest_makereport): run pytest on small tests that start the real server and
fail in ways that are no assertion of its state."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import conftest

TESTS = textwrap.dedent("""\
    import pytest
    from conftest import Sidecar

    def test_fails_to_start_a_server():
        Sidecar(["--backend=cpu", "--no-such-flag"]).start()

    @pytest.fixture(scope="module")
    def shared():
        with Sidecar(["--backend=cpu", "--log-level=info"]) as s:
            yield s

    def test_fails_with_the_server_running(shared):
        raise ConnectionError("a client error, not an assertion")

    def test_fails_after_closing_the_server(shared):
        with Sidecar(["--backend=cpu"]):
            pass
        raise TimeoutError("after the server stopped")

    def test_passes_with_a_server():
        with Sidecar(["--backend=cpu"]):
            pass
    """)


def run_pytest(tmp_path: pathlib.Path) -> str:
    (tmp_path / "test_cases.py").write_text(TESTS)
    here = pathlib.Path(conftest.__file__).resolve().parent
    env = dict(os.environ, PROBE_SIDECAR_BIN=str(conftest.BIN),
               PYTHONPATH=os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-q",
         "--rootdir", str(tmp_path), str(tmp_path / "test_cases.py")],
        capture_output=True, text=True, env=env, cwd=tmp_path, timeout=conftest.START_SAFETY_S)
    assert done.returncode == 1, done.stdout + done.stderr
    return done.stdout


def test_a_failed_test_shows_each_servers_log(tmp_path):
    out = run_pytest(tmp_path)
    assert "3 failed, 1 passed" in out, out
    # A section per server of each failed test (none for the test that passed), the server's
    # state and flags in its title, its log below: the server that did not start in the first
    # (and in no later one), the module's running server in the next two, the server the third
    # test closed in the third.
    lines = out.splitlines()
    at = [i for i, line in enumerate(lines) if "probe-sidecar log (" in line]
    sections = [lines[i] for i in at]
    assert len(sections) == 4, out
    assert "(exit " in sections[0] and "(exit 0; " not in sections[0]
    assert "--no-such-flag" in sections[0]
    assert "(running; " in sections[1] and "--log-level=info" in sections[1]
    assert "(exit 0; " in sections[2] and "--log-level=info" not in sections[2]
    assert "(running; " in sections[3] and "--log-level=info" in sections[3]
    assert sum("--no-such-flag" in line for line in sections) == 1, sections
    # What the servers wrote: each start line; the closed one's drain on SIGTERM.
    assert out.count("serving on unix:") == 3, out
    closed = "\n".join(lines[at[2]:at[3]])
    assert "draining in-flight requests" in closed, closed
