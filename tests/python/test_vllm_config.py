"""The vLLM plugin's configuration (probe_sidecar.vllm.config), without vLLM: what it accepts,
what it refuses with a message naming the problem, the taps it makes, and the part of it that
must join vLLM's compile cache key."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("torch")

from probe_sidecar.vllm.config import ENV, ConfigError, load, parse  # noqa: E402


def test_unset_or_empty_is_off():
    assert load({}) is None
    assert load({ENV: "  "}) is None


def test_a_json_object_or_a_file_holding_one(tmp_path):
    text = json.dumps({"probe_sets": ["a", "b"], "layer": [3, "final"], "window": 8})
    config = load({ENV: text})
    path = tmp_path / "plugin.json"
    path.write_text(text)
    assert load({ENV: str(path)}) == config
    assert config.layers == (3, "final") and config.window == 8
    assert config.taps() == {"a@3": ("a", 3), "b@3": ("b", 3), "a@final": ("a", "final"),
                             "b@final": ("b", "final")}
    single = parse({"probe_sets": "a"})
    assert single.taps() == {"a": ("a", "final")} and single.target.startswith("unix://")
    assert single.when_behind == "lose"  # the engine never waits unless told to
    assert parse({"probe_sets": "a", "when_behind": "wait"}).when_behind == "wait"


@pytest.mark.parametrize("data, message", [
    ({}, "probe_sets must be a non-empty list"),
    ({"probe_sets": ["a", "a"]}, "names a set twice"),
    ({"probe_sets": ["a"], "layers": 3}, "unknown key"),
    ({"probe_sets": ["a"], "layer": "middle"}, "layer must be"),
    ({"probe_sets": ["a"], "layer": [1, 1]}, "names a layer twice"),
    ({"probe_sets": ["a"], "layer": True}, "layer must be"),
    ({"probe_sets": ["a"], "window": 0}, "window must be a number >= 1"),
    ({"probe_sets": ["a"], "max_window_s": -1}, "max_window_s"),
    ({"probe_sets": ["a"], "callback": "no_colon"}, "module:function"),
    ({"probe_sets": ["a"], "jsonl": 3}, "jsonl must be a string"),
    ({"probe_sets": ["a"], "when_behind": "block"}, 'when_behind must be "lose" or "wait"'),
    ([1, 2], "expected a JSON object"),
])
def test_refused_with_a_message(data, message):
    with pytest.raises(ConfigError, match=message):
        parse(data)


def test_bad_json_and_a_missing_file():
    with pytest.raises(ConfigError, match="not valid JSON"):
        load({ENV: "{nope"})
    with pytest.raises(ConfigError, match="cannot read"):
        load({ENV: "/nonexistent/plugin.json"})


def test_what_changes_the_graph_changes_the_digest():
    base = parse({"probe_sets": ["a"]})
    assert parse({"probe_sets": ["a"], "window": 64, "jsonl": "x"}).digest() == base.digest()
    for other in ({"probe_sets": ["b"]}, {"probe_sets": ["a"], "layer": 2},
                  {"probe_sets": ["a"], "tap_rank": 1}):
        assert parse(other).digest() != base.digest()


def test_the_supported_vllm_releases_and_the_override(monkeypatch):
    """0.26 and 0.32 (any patch release, local builds included) start; another release stops the
    engine's start with a message naming the supported ones and the override, which lets it run
    (with a warning in vLLM's log)."""
    from probe_sidecar.vllm import install

    monkeypatch.setattr(install, "logger", lambda: __import__("logging").getLogger("test"))
    for version in ("0.26.0", "0.26.3+cu130", "0.32.0", "0.32.1"):
        assert install.check_version(version, environ={}) == version[:4]
    with pytest.raises(ConfigError, match=r"vLLM 0\.29\.0 is not a supported release.*0\.26\.x.*"
                                          r"0\.32\.x.*PROBE_SIDECAR_VLLM_ANY_VERSION=1"):
        install.check_version("0.29.0", environ={})
    assert install.check_version("0.33.0", environ={install.ANY_VERSION_ENV: "1"}) == "0.33"
    with pytest.raises(ConfigError):
        install.check_version("0.33.0", environ={install.ANY_VERSION_ENV: "yes"})


def test_the_rings_size_is_logged_and_a_ring_that_cannot_fit_refused(caplog):
    """A ring holds (2K + 1) slots of max_num_seqs rows of H values: 1024 sequences, K=16,
    H=4096 in bf16 is 33 x 1024 x 4096 x 2 bytes = 264 MiB (plus the rows' scores); the size is
    logged, and a device ring larger than half of vLLM's share is refused with the numbers."""
    import logging

    import torch

    from probe_sidecar.vllm.install import check_ring_memory

    config = parse({"probe_sets": ["a"], "window": 16})
    with caplog.at_level(logging.INFO):
        total = check_ring_memory(config, {"a": 4}, device=torch.device("cpu"),
                                  dtype=torch.bfloat16, max_batch=1024, hidden_size=4096,
                                  vllm_share=None)
    assert 33 * 1024 * 4096 * 2 <= total < 33 * 1024 * 4096 * 2 + (1 << 20)
    assert "264.0 MiB" in caplog.text and "max_num_seqs 1024" in caplog.text
    for free, share in ((200 << 20, None), (64 << 30, 400 << 20)):  # a device's free bytes
        with pytest.raises(ConfigError, match=r"would hold 264 MiB .* MiB are free"):
            check_ring_memory(config, {"a": 4}, device=torch.device("cpu"),
                              dtype=torch.bfloat16, max_batch=1024, hidden_size=4096,
                              vllm_share=share, free=free)
    assert check_ring_memory(config, {"a": 4}, device=torch.device("cpu"), dtype=torch.bfloat16,
                             max_batch=1024, hidden_size=4096, vllm_share=1 << 30,
                             free=64 << 30) == total
