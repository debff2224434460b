"""probe-client against the real server."""

from __future__ import annotations

import json
import subprocess

import numpy as np

from conftest import CLIENT_BIN
from probe_files import ProbeFile, safetensors_bytes


def cli(sidecar, *args, check=True):
    result = subprocess.run([str(CLIENT_BIN), f"--target=unix:{sidecar.socket}", *args],
                            capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def test_health_info_list(sidecar):
    assert cli(sidecar, "health").stdout.strip() == "SERVING"
    assert 'backend: "cpu"' in cli(sidecar, "info").stdout
    assert "demo: P=4 H=4096" in cli(sidecar, "list").stdout


def test_score_random_table_and_json(sidecar):
    table = cli(sidecar, "score", "--probe-set", "demo", "--random", "3,4096").stdout
    assert "probe_a" in table and len(table.strip().splitlines()) == 5
    out = json.loads(cli(sidecar, "score", "--probe-set=demo", "--random=2,4096", "--json").stdout)
    assert out["probes"] == ["probe_a", "probe_b", "probe_c", "probe_d"]
    assert len(out["rows"]) == 2 and all(0 < v < 1 for r in out["rows"] for v in r["scores"])


def test_load_file_score_file_unload(sidecar, tmp_path):
    probe = ProbeFile(2, 64, seed=4, names=["x", "y"])
    (tmp_path / "p.safetensors").write_bytes(probe.data)
    acts = np.random.default_rng(1).standard_normal((5, 64)).astype(np.float32)
    (tmp_path / "a.safetensors").write_bytes(safetensors_bytes({"acts": (acts, "fp32")}))
    assert "loaded cli_p" in cli(sidecar, "load", "cli_p", "--file", str(tmp_path / "p.safetensors")).stdout
    out = json.loads(cli(sidecar, "score", "--probe-set=cli_p", f"--file={tmp_path / 'a.safetensors'}",
                         "--rows=4,0", "--json").stdout)
    scores = np.array([r["scores"] for r in out["rows"]])
    np.testing.assert_allclose(scores, probe.reference(acts, [4, 0]), rtol=1e-5, atol=1e-6)
    assert "unloaded cli_p" in cli(sidecar, "unload", "cli_p").stdout


def test_load_with_outcomes_off_and_it_is_shown(sidecar, tmp_path):
    (tmp_path / "p.safetensors").write_bytes(ProbeFile(2, 64, seed=6).data)
    path = str(tmp_path / "p.safetensors")
    out = cli(sidecar, "load", "cli_uncounted", "--file", path, "--outcomes=off").stdout
    assert "loaded cli_uncounted: P=2 H=64 exact (outcomes not counted)" in out
    assert "(outcomes not counted)" not in cli(sidecar, "load", "cli_counted", "--file", path,
                                               "--outcomes=on").stdout
    bad = cli(sidecar, "load", "cli_bad", "--file", path, "--outcomes=maybe", check=False)
    assert bad.returncode != 0 and "expected default, on or off" in bad.stderr
    assert "cli_bad" not in cli(sidecar, "list").stdout
    for name in ("cli_uncounted", "cli_counted"):
        cli(sidecar, "unload", name)


def test_load_with_a_precision_and_it_is_shown(sidecar, tmp_path):
    (tmp_path / "p.safetensors").write_bytes(ProbeFile(2, 64, seed=5).data)
    path = str(tmp_path / "p.safetensors")
    assert "loaded cli_fast: P=2 H=64 fast" in cli(sidecar, "load", "cli_fast", "--file", path,
                                                   "--precision=fast").stdout
    assert "loaded cli_default: P=2 H=64 exact" in cli(sidecar, "load", "cli_default",
                                                       "--file", path).stdout
    listed = cli(sidecar, "list").stdout
    assert "cli_fast: P=2 H=64 DTYPE_FLOAT32 ACTIVATION_NONE fast" in listed
    assert any(line.startswith("demo: P=4 H=4096 ") and " fast [" in line
               for line in listed.splitlines())
    table = cli(sidecar, "score", "--probe-set=cli_fast", "--random=2,64", "--dtype=bf16").stdout
    assert "precision fast" in table
    out = json.loads(
        cli(sidecar, "score", "--probe-set=cli_default", "--random=1,64", "--json").stdout)
    assert out["precision"] == "exact"
    result = cli(sidecar, "load", "cli_bad", "--file", path, "--precision=medium", check=False)
    assert result.returncode == 1 and "expected default, exact or fast" in result.stderr
    for name in ["cli_fast", "cli_default"]:
        cli(sidecar, "unload", name)


def test_errors_exit_nonzero_with_the_status(sidecar):
    result = cli(sidecar, "score", "--probe-set=missing", "--random=1,8", check=False)
    assert result.returncode == 1 and "NOT_FOUND" in result.stderr
    result = cli(sidecar, "frobnicate", check=False)
    assert result.returncode == 2 and "unknown command" in result.stderr
