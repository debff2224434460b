"""Score and ScoreStream on the CPU backend: every dtype and layout against a float64 reference."""

from __future__ import annotations

import numpy as np
import pytest

from probe_files import ProbeFile, as_dtype, rel_error
from probe_sidecar import ProbeSidecarError, score_request


@pytest.fixture(scope="module")
def probe(sidecar):
    probe = ProbeFile(5, 384, dtype="fp32", seed=1, activation="none",
                      thresholds=[0.0, None, 0.5, -0.25, None])
    with sidecar.client() as c:
        c.load_probe_set("t5", data=probe.data, precision="exact")
    return probe


def _send(x: np.ndarray, dtype: str):
    """The array to send and the keyword for the client (bf16 travels as uint16 bits)."""
    sent, exact = as_dtype(x, dtype)
    return sent, exact, ("bf16" if dtype == "bf16" else None)


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("transport", ["uds", "tcp"])
def test_score_matches_float64_reference(sidecar, probe, dtype, transport):
    rng = np.random.default_rng(hash((dtype, transport)) % 2**32)
    x = rng.standard_normal((37, 384)).astype(np.float32)
    sent, exact, kw = _send(x, dtype)
    rows = rng.integers(0, 37, size=23)
    with sidecar.client(transport) as c:
        result = c.score(sent, rows, "t5", dtype=kw)
    ref = probe.reference(exact, rows)
    assert result.scores.shape == (23, 5) and result.scores.dtype == np.float32
    assert result.kernel_path == "cpu"
    # fp32 accumulation over H=384 terms: far inside 1e-5 of the float64 reference.
    assert rel_error(result.scores, ref) <= 1e-5
    np.testing.assert_array_equal(result.fired, probe.fired(result.scores))


def test_fired_follows_thresholds_exactly(client, probe):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 384)).astype(np.float32)
    result = client.score(x, np.arange(64), "t5")
    fired = result.fired
    assert fired[:, 1].sum() == 0 and fired[:, 4].sum() == 0  # no threshold: never fires
    np.testing.assert_array_equal(fired[:, 0], result.scores[:, 0] >= 0.0)
    np.testing.assert_array_equal(fired[:, 2], result.scores[:, 2] >= 0.5)
    assert 0 < fired[:, 0].sum() < 64  # random data: some fire, some do not


def test_strided_rows_duplicates_and_boundaries(client, probe):
    rng = np.random.default_rng(3)
    wide = rng.standard_normal((50, 1000)).astype(np.float32)
    x = wide[:, 100:484]  # row stride 1000 elements, H = 384
    assert x.strides[0] == 4000
    rows = [0, 49, 49, 0, 17, 17, 17]
    result = client.score(x, rows, "t5")
    assert rel_error(result.scores, probe.reference(x, rows)) <= 1e-5
    np.testing.assert_array_equal(result.scores[1], result.scores[2])


def test_strided_bf16_rows(client, probe):
    rng = np.random.default_rng(4)
    wide_bits, wide_exact = as_dtype(rng.standard_normal((9, 401)), "bf16")
    result = client.score(wide_bits[:, 3:387], [8, 0, 4], "t5", dtype="bf16")
    assert rel_error(result.scores, probe.reference(wide_exact[:, 3:387], [8, 0, 4])) <= 1e-5


def test_sigmoid_probe_set(client):
    probe = ProbeFile(3, 256, dtype="bf16", seed=9, activation="sigmoid", thresholds=[0.5, 0.9, None])
    client.load_probe_set("sig", data=probe.data, precision="exact")
    try:
        x = np.random.default_rng(1).standard_normal((8, 256)).astype(np.float32)
        result = client.score(x, range(8), "sig")
        assert np.all((result.scores > 0) & (result.scores < 1))
        assert rel_error(result.scores, probe.reference(x, range(8))) <= 1e-5
        np.testing.assert_array_equal(result.fired, probe.fired(result.scores))
    finally:
        client.unload_probe_set("sig")


def test_large_request_is_split_across_threads(client):
    probe = ProbeFile(64, 1024, dtype="fp16", seed=5)
    client.load_probe_set("big", data=probe.data, precision="exact")
    try:
        x = np.random.default_rng(2).standard_normal((3000, 1024)).astype(np.float32)
        rows = np.random.default_rng(3).integers(0, 3000, 2048)
        result = client.score(x, rows, "big")
        assert rel_error(result.scores, probe.reference(x, rows)) <= 1e-5
    finally:
        client.unload_probe_set("big")


def test_demo_probe_set_scores(client):
    demo = {s.name: s for s in client.list_probe_sets()}["demo"]
    x = np.random.default_rng(0).standard_normal((4, demo.hidden_size)).astype(np.float32)
    result = client.score(x, [0, 1, 2, 3], "demo")
    assert result.scores.shape == (4, demo.num_probes)
    assert np.all(np.isfinite(result.scores))


def test_score_stream_in_order_with_failures_in_between(client, probe):
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((10, 384)).astype(np.float32) for _ in range(6)]
    requests = []
    for i, x in enumerate(xs):
        if i == 2:
            requests.append(score_request(x, [10], "t5", request_id=i))  # row out of range
        elif i == 4:
            requests.append(score_request(x, [0], "missing", request_id=i))
        else:
            requests.append(score_request(x, [i, 9 - i], "t5", request_id=i))
    results = list(client.score_stream(requests))
    assert len(results) == 6
    for i, result in enumerate(results):
        if i == 2:
            assert isinstance(result, ProbeSidecarError) and result.code.name == "INVALID_ARGUMENT"
            assert "rows[0] = 10" in result.message
        elif i == 4:
            assert isinstance(result, ProbeSidecarError) and result.code.name == "NOT_FOUND"
        else:
            assert result.request_id == i
            assert rel_error(result.scores, probe.reference(xs[i], [i, 9 - i])) <= 1e-5


def test_many_concurrent_clients(sidecar, probe):
    from concurrent.futures import ThreadPoolExecutor

    rng = np.random.default_rng(12)
    x = rng.standard_normal((32, 384)).astype(np.float32)
    ref = probe.reference(x, range(32))

    def one(i):
        with sidecar.client("uds" if i % 2 else "tcp") as c:
            return [rel_error(c.score(x, range(32), "t5").scores, ref) for _ in range(10)]

    with ThreadPoolExecutor(16) as pool:
        errors = [e for batch in pool.map(one, range(16)) for e in batch]
    assert len(errors) == 160 and max(errors) <= 1e-5


def _non_finite_total(sidecar) -> float:
    for line in sidecar.metrics_text().splitlines():
        if line.startswith("probesidecar_non_finite_scores_total "):
            return float(line.split()[1])
    raise AssertionError("probesidecar_non_finite_scores_total is not exported")


@pytest.mark.parametrize("dtype", ["fp32", "fp16", "bf16"])
def test_non_finite_scores_are_counted_and_never_fire(sidecar, probe, dtype):
    rng = np.random.default_rng(11)
    x = rng.standard_normal((6, 384)).astype(np.float32)
    x[1, 7] = np.nan
    x[3, 0] = np.inf
    x[4, 100] = -np.inf
    sent, exact, kw = _send(x, dtype)
    rows = [0, 1, 2, 3, 4, 5, 1]
    ref = probe.reference(exact, rows)
    expected = int((~np.isfinite(ref)).sum())
    assert expected >= 5  # rows 1 (twice), 3 and 4: every probe not finite
    before = _non_finite_total(sidecar)
    with sidecar.client() as c:
        result = c.score(sent, rows, "t5", dtype=kw)
        stream = list(c.score_stream([score_request(sent, rows, "t5", dtype=kw)]))
    assert result.non_finite == expected == stream[0].non_finite
    np.testing.assert_array_equal(np.isfinite(result.scores), np.isfinite(ref))
    # A NaN score never fires; finite rows fire as usual.
    assert not result.fired[~np.isfinite(result.scores)].any()
    np.testing.assert_array_equal(result.fired[[0, 2, 5]], probe.fired(ref[[0, 2, 5]]))
    assert _non_finite_total(sidecar) - before == 2 * expected
    # Finite requests report zero.
    with sidecar.client() as c:
        assert c.score(sent, [0, 2], "t5", dtype=kw).non_finite == 0
