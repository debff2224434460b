"""A probe set's precision on the CPU backend: the default rule (exact up to 2 probes, fast
above), LoadProbeSet's choice, --probe-precision for the sets loaded at start, a bad value, and the
scores: exact equals float64 with the file's own weights, fast equals float64 with the weights
rounded to the activations' 16-bit type, and every response says which one it is."""

from __future__ import annotations

import grpc
import numpy as np
import pytest

from conftest import Sidecar
from probe_files import ProbeFile, as_dtype, bf16_bits, bf16_to_f32
from probe_sidecar import ProbeSidecarError, score_request
from probesidecar.v1 import probes_pb2

H = 1024


def rounded(weight: np.ndarray, dtype: str) -> np.ndarray:
    """The weights as fast multiplies them on `dtype` activations."""
    if dtype == "bf16":
        return bf16_to_f32(bf16_bits(weight))
    if dtype == "fp16":
        return weight.astype(np.float16).astype(np.float32)
    return weight


def reference(x: np.ndarray, rows, weight: np.ndarray, bias: np.ndarray):
    """float64 scores and, per element, the bound of an fp32 evaluation: sum |x w| + |b| times
    4 (H + 1) 2^-24 (any summation order, probe_score_compare.h), plus a floor."""
    xs = x[np.asarray(rows)].astype(np.float64)
    w = weight.astype(np.float64)
    ref = xs @ w.T + bias
    magnitude = np.abs(xs) @ np.abs(w).T + np.abs(bias)
    return ref, 4.0 * (xs.shape[1] + 1) * 2.0**-24 * magnitude + 1e-30


def assert_within(got: np.ndarray, ref: np.ndarray, bound: np.ndarray, what: str):
    err = np.abs(got.astype(np.float64) - ref)
    over = np.argwhere(~(err <= bound))
    assert over.size == 0, (f"{what}: {len(over)} of {err.size} over the bound; first at "
                            f"{tuple(over[0])}: got {got[tuple(over[0])]!r}, want "
                            f"{ref[tuple(over[0])]!r}, bound {bound[tuple(over[0])]:.3g}")


def _set(name: str, client) -> probes_pb2.ProbeSetInfo:
    return {s.name: s for s in client.list_probe_sets()}[name]


def test_the_default_rule_is_exact_up_to_2_probes(sidecar, client):
    small = ProbeFile(2, 64, seed=1)
    big = ProbeFile(3, 64, seed=2)
    assert client.load_probe_set("rule2", data=small.data).precision == "exact"
    assert client.load_probe_set("rule3", data=big.data, precision=None).precision == "fast"
    assert _set("rule2", client).precision == "exact"
    assert _set("rule3", client).precision == "fast"
    # The bundled demo set (P = 4), loaded at start with the default rule.
    assert _set("demo", client).precision == "fast"
    # ServerInfo lists the resolved precision too (the raw enum).
    infos = {s.name: s for s in client.server_info().probe_sets}
    assert infos["rule3"].precision == probes_pb2.PRECISION_FAST
    assert infos["rule2"].precision == probes_pb2.PRECISION_EXACT


def test_load_probe_set_chooses_the_precision(sidecar, client):
    small, big = ProbeFile(4, 64, seed=3), ProbeFile(64, 64, seed=4)
    assert client.load_probe_set("fast4", data=small.data, precision="fast").precision == "fast"
    assert client.load_probe_set("exact64", data=big.data, precision="exact").precision == "exact"
    assert _set("fast4", client).precision == "fast"
    assert _set("exact64", client).precision == "exact"
    # A replacement takes the precision its own load asks for.
    assert client.load_probe_set("fast4", data=small.data, replace=True,
                                 precision="exact").precision == "exact"
    assert _set("fast4", client).precision == "exact"
    with pytest.raises(ValueError, match="precision must be None, 'exact' or 'fast'"):
        client.load_probe_set("nope", data=small.data, precision="medium")


@pytest.mark.parametrize("value", [3, 7, -1])
def test_a_precision_outside_the_enum_is_invalid_and_loads_nothing(sidecar, client, value):
    before = [s.proto.SerializeToString() for s in client.list_probe_sets()]
    request = probes_pb2.LoadProbeSetRequest(name="bad_precision", safetensors=ProbeFile(2, 8).data,
                                             precision=value)
    with pytest.raises(grpc.RpcError) as error:
        client.stub.LoadProbeSet(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"precision {value} is not a Precision" in error.value.details()
    # ... also when it would replace a loaded set: that set stays as it was.
    request.name, request.replace = "demo", True
    with pytest.raises(grpc.RpcError) as error:
        client.stub.LoadProbeSet(request, timeout=10)
    assert error.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert [s.proto.SerializeToString() for s in client.list_probe_sets()] == before


def test_probe_precision_flag_sets_the_precision_of_the_sets_loaded_at_start(tmp_path):
    probes = tmp_path / "probes"
    probes.mkdir()
    (probes / "small.safetensors").write_bytes(ProbeFile(2, 16, seed=5).data)
    with Sidecar(["--backend=cpu", "--probe-precision=fast"]) as s, s.client() as c:
        assert _set("demo", c).precision == "fast"
        # LoadProbeSet keeps its own rule: unspecified is the default, not the flag.
        assert c.load_probe_set("later", data=ProbeFile(2, 16).data).precision == "exact"
    with Sidecar(["--backend=cpu", "--probe-precision=exact"], probes_dir=probes) as s, \
            s.client() as c:
        assert _set("small", c).precision == "exact"


def test_a_bad_probe_precision_flag_fails_the_start():
    import subprocess

    from conftest import BIN
    result = subprocess.run([str(BIN), "--probe-precision=medium"], capture_output=True,
                            text=True, timeout=30)
    assert result.returncode == 2
    assert "--probe-precision=medium: expected default, exact or fast" in result.stderr


@pytest.fixture(scope="module")
def weights(sidecar):
    """One float32 probe set (weights not representable in 16 bits), loaded as exact and as
    fast."""
    probe = ProbeFile(8, H, dtype="fp32", seed=11)
    with sidecar.client() as c:
        assert c.load_probe_set("w_exact", data=probe.data, precision="exact").precision == "exact"
        assert c.load_probe_set("w_fast", data=probe.data, precision="fast").precision == "fast"
    return probe


@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_exact_scores_use_the_file_weights_and_fast_the_rounded_ones(sidecar, client, weights,
                                                                     dtype):
    rng = np.random.default_rng(21)
    sent, x, kw = *as_dtype(rng.standard_normal((40, H)), dtype), ("bf16" if dtype == "bf16" else None)
    rows = rng.integers(0, 40, size=33)
    exact = client.score(sent, rows, "w_exact", dtype=kw)
    fast = client.score(sent, rows, "w_fast", dtype=kw)
    assert (exact.precision, fast.precision) == ("exact", "fast")

    ref_exact, bound_exact = reference(x, rows, weights.weight, weights.bias)
    ref_fast, bound_fast = reference(x, rows, rounded(weights.weight, dtype), weights.bias)
    assert_within(exact.scores, ref_exact, bound_exact, "exact against the file's weights")
    assert_within(fast.scores, ref_fast, bound_fast, "fast against the rounded weights")
    # The rounding is visible: fast is off the file's weights by far more than fp32 summation,
    # by up to the dtype's unit roundoff of sum |x w|.
    u = 2.0**-8 if dtype == "bf16" else 2.0**-11
    magnitude = np.abs(x[rows].astype(np.float64)) @ np.abs(weights.weight.astype(np.float64)).T
    fast_err = np.abs(fast.scores - ref_exact)
    assert np.all(fast_err <= u * magnitude + bound_exact)
    assert np.linalg.norm(fast_err) > 100 * np.linalg.norm(exact.scores - ref_exact)
    assert np.count_nonzero(fast.scores != exact.scores) > 0.9 * fast.scores.size


def test_float32_activations_score_the_same_at_both_precisions(sidecar, client, weights):
    x = np.random.default_rng(22).standard_normal((9, H)).astype(np.float32)
    exact = client.score(x, range(9), "w_exact")
    fast = client.score(x, range(9), "w_fast")
    assert (exact.precision, fast.precision) == ("exact", "fast")
    np.testing.assert_array_equal(exact.scores, fast.scores)
    ref, bound = reference(x, range(9), weights.weight, weights.bias)
    assert_within(exact.scores, ref, bound, "fp32 activations")


def test_score_stream_responses_carry_the_precision(sidecar, client, weights):
    sent, _ = as_dtype(np.random.default_rng(23).standard_normal((4, H)), "bf16")
    requests = [score_request(sent, [0, 3], name, dtype="bf16", request_id=i)
                for i, name in enumerate(["w_exact", "w_fast", "w_exact"])]
    results = list(client.score_stream(requests))
    assert not any(isinstance(r, ProbeSidecarError) for r in results), results
    assert [r.precision for r in results] == ["exact", "fast", "exact"]
    np.testing.assert_array_equal(results[0].scores, results[2].scores)
