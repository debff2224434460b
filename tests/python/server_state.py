"""What the reliability tests read of a running server from outside: its /metrics samples, its CPU
time and resident memory; and where they leave their figures."""

from __future__ import annotations

import json
import os
import pathlib
import time
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BIN, project_env


def samples(sidecar) -> dict[tuple[str, tuple], float]:
    """{(sample name, sorted label items): value} of one /metrics scrape."""
    text = urllib.request.urlopen(f"http://{sidecar.metrics_address}/metrics", timeout=10).read()
    out = {}
    for family in text_string_to_metric_families(text.decode()):
        for sample in family.samples:
            out[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return out


def metric(sidecar, name: str, **labels) -> float:
    """The value of the sample `name` with exactly these labels; 0 when it is absent."""
    return samples(sidecar).get((name, tuple(sorted(labels.items()))), 0.0)


def device_total(sidecar, name: str) -> float:
    """The sum of a GPU family's `device` series (the CUDA backend labels them per device:
    docs/tensor-parallel.md). Fails where the server exports none: read without its label, such
    a family would always read 0."""
    values = [value for (sample, labels), value in samples(sidecar).items()
              if sample == name and "device" in dict(labels)]
    assert values, f"the server exports no {name}{{device=...}} series"
    return sum(values)


def answered_by_code(sidecar, rpc: str) -> dict[str, int]:
    """The server's count of answered calls of `rpc`, by status code (zeros left out)."""
    counts = {}
    for (name, labels), value in samples(sidecar).items():
        labels = dict(labels)
        if name == "probesidecar_rpc_requests_total" and labels["rpc"] == rpc and value:
            counts[labels["code"]] = int(value)
    return counts


def difference(after: dict[str, int], before: dict[str, int]) -> dict[str, int]:
    delta = {code: n - before.get(code, 0) for code, n in after.items()}
    return {code: n for code, n in delta.items() if n}


# A deadline on work a test only waits for: a safety net far past the work on a loaded 2-core
# machine under ASan (the work itself takes seconds there), never a measurement.
SAFETY_S = 600.0


def wait_for(condition, timeout: float, interval: float = 0.01) -> bool:
    """Polls `condition` until it is true (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)
    return condition()


def cpu_seconds(pid: int) -> float:
    """CPU time (user + system) process `pid` has used, from /proc (clock-tick resolution)."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int:
    """VmRSS of process `pid`."""
    for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no VmRSS for pid {pid}")


def figures_fixture(name: str, also=None):
    """A module-scoped fixture `figures`: a dict the module's tests put what they measure in,
    recorded (record_figures) after the last of them ran, whichever ran and in whatever order;
    `also()` adds figures of the machine at that point."""

    @pytest.fixture(scope="module")
    def figures():
        measured: dict = {}
        yield measured
        if measured:
            record_figures(name, {**measured, **(also() if also else {})})

    return figures


def record_figures(name: str, figures: dict) -> pathlib.Path:
    """Prints `figures` and writes them to <build>/reliability/<name>.json, for the numbers
    docs/reliability.md quotes."""
    out = BIN.parent.parent / "reliability" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    # The commit that made them (tests/gpu/run.sh sets PROBE_SIDECAR_GIT from the bundle).
    figures = {"git": project_env("GIT", "unknown"), **figures}
    text = json.dumps(figures, indent=2, sort_keys=True)
    out.write_text(text + "\n")
    print(f"\n{name}: {text}\nwritten to {out}")
    return out
