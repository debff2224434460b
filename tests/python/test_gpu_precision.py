"""A probe set's precision on a real GPU, across two processes: the same float32 weights loaded as
exact and as fast, bf16 activations registered over CUDA IPC and scored through the client.
exact must equal float64 with the file's own weights; fast, float64 with the weights rounded to
bf16 on tensor-core paths (fused_tc, gather_gemm) and the file's weights on the CUDA-core path
(fused_cuda, which always multiplies float32 weights).

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1).
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import sidecar_fixture  # noqa: E402
from probe_files import rel_error, safetensors_bytes  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402

T, H = 8192, 4096
U32 = 2.0**-24  # float32's unit roundoff
TENSOR_CORE_PATHS = {"fused_tc", "gather_gemm", "gather_wgmma"}


def f32_probe_file(weight: torch.Tensor, bias: torch.Tensor) -> bytes:
    """A probe set whose float32 weights are exactly the tensors' (not representable in bf16)."""
    return safetensors_bytes({"weight": (weight.cpu().numpy(), "fp32"),
                              "bias": (bias.cpu().numpy(), "fp32")}, {"activation": "none"})


def reference(x: torch.Tensor, rows, weight: torch.Tensor, bias: torch.Tensor):
    """float64 scores of x[rows] with `weight` (float32, used as given) and the magnitude
    sum_h |x w| + |b| that scales every fp32 rounding error."""
    idx = torch.as_tensor(rows, device=x.device, dtype=torch.long)
    xs = x.index_select(0, idx).double()
    w, b = weight.double(), bias.double()
    return torch.addmm(b, xs, w.t()), torch.addmm(b.abs(), xs.abs(), w.abs().t())


def assert_within(got: torch.Tensor, ref: torch.Tensor, magnitude: torch.Tensor, what: str):
    """Every element within 1e-5 of its magnitude plus fp32 accumulation over H + 1 terms in any
    order, with tensor cores' truncation (c = 4, kernels/probe_score/probe_score_compare.h)."""
    bound = (1e-5 + 4 * (H + 1) * U32) * magnitude + 1e-30
    err = (got - ref).abs()
    over = (~(err <= bound)).nonzero()
    if over.numel():
        r, p = over[0].tolist()
        raise AssertionError(f"{what}: {over.shape[0]} of {err.numel()} over the bound; first at "
                             f"row {r} probe {p}: got {got[r, p].item()!r}, want "
                             f"{ref[r, p].item()!r}, bound {bound[r, p].item():.3g}")


sidecar = sidecar_fixture("--backend=cuda", "--warmup-rows=1,64")


@pytest.fixture(scope="module")
def probe_sets(sidecar):
    torch.manual_seed(3)
    sets = {}
    with sidecar.client() as c:
        for p in (1, 16, 64, 1024):
            weight = torch.randn(p, H, dtype=torch.float32) / H**0.5
            bias = torch.randn(p, dtype=torch.float32) * 0.1
            data = f32_probe_file(weight, bias)
            assert c.load_probe_set(f"exact{p}", data=data, precision="exact").precision == "exact"
            assert c.load_probe_set(f"fast{p}", data=data, precision="fast").precision == "fast"
            sets[p] = (weight.cuda(), bias.cuda())
    return sets


@pytest.fixture(scope="module")
def tclient(sidecar):
    with TorchClient(sidecar.uds_target) as c:
        yield c


@pytest.mark.parametrize("num_probes", [1, 16, 64, 1024])
@pytest.mark.parametrize("num_rows", [1, 64, 1000])
def test_exact_uses_the_file_weights_and_fast_the_rounded_ones(tclient, probe_sets, num_probes,
                                                                num_rows):
    weight, bias = probe_sets[num_probes]
    gen = torch.Generator(device="cuda").manual_seed(num_probes * 10007 + num_rows)
    x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16, generator=gen)
    rows = torch.randint(0, T, (num_rows,), device="cuda", generator=gen).tolist()
    rows[-1] = T - 1  # boundary row
    if num_rows > 2:
        rows[1] = rows[2]  # duplicate

    exact = tclient.score(x, rows, f"exact{num_probes}")
    fast = tclient.score(x, rows, f"fast{num_probes}")
    assert (exact.precision, fast.precision) == ("exact", "fast")
    assert exact.scores.shape == fast.scores.shape == (num_rows, num_probes)
    got_exact = torch.from_numpy(np.array(exact.scores)).cuda().double()
    got_fast = torch.from_numpy(np.array(fast.scores)).cuda().double()

    ref_exact, mag_exact = reference(x, rows, weight, bias)
    assert_within(got_exact, ref_exact, mag_exact, f"exact on {exact.kernel_path}")

    # fast rounds the weights to bf16 where tensor cores multiply them; fused_cuda multiplies
    # the float32 weights at either precision.
    rounds = fast.kernel_path in TENSOR_CORE_PATHS
    fast_weight = weight.to(torch.bfloat16).float() if rounds else weight
    ref_fast, mag_fast = reference(x, rows, fast_weight, bias)
    assert_within(got_fast, ref_fast, mag_fast, f"fast on {fast.kernel_path}")

    # Across the block: exact is as close as fp32 accumulation gets; fast on tensor cores is off
    # the file's weights by bf16's rounding (~1e-3 relative), measurably more.
    assert rel_error(got_exact, ref_exact) <= 1e-4, exact.kernel_path
    if rounds and num_rows * num_probes >= 64:
        assert rel_error(got_fast, ref_exact) >= 2e-4, fast.kernel_path
