"""Verify (MLA verify attention) end to end from the Python client on registered torch tensors,
two processes (this one and the real server): against float64 torch on random, NaN-poisoned
inputs; shadow mode compares without writing anything of ours; bad tables are caught on the GPU.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1).
"""

from __future__ import annotations

import math

import grpc
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402
from probe_files import rel_error  # noqa: E402
from probe_sidecar import ProbeSidecarError  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402

PAGES, PAGE = 512, 64


def make_case(batch, s_q, h_q, lengths, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, s_q, h_q, 576, device="cuda", generator=g).to(torch.bfloat16)
    cache = torch.full((PAGES, PAGE, 576), float("nan"), device="cuda", dtype=torch.bfloat16)
    max_pages = max((L + PAGE - 1) // PAGE for L in lengths) + 1
    table = torch.full((batch, max_pages), -1, dtype=torch.int32)
    pages = torch.randperm(PAGES, generator=torch.Generator().manual_seed(seed))  # shuffled
    used = 0
    for i, L in enumerate(lengths):
        n = (L + PAGE - 1) // PAGE
        table[i, :n] = pages[used:used + n].to(torch.int32)
        for k in range(n):  # real keys; NaN stays past each sequence's end
            rows = min(PAGE, L - k * PAGE)
            cache[table[i, k], :rows] = torch.randn(rows, 576, device="cuda", generator=g).to(
                torch.bfloat16)
        used += n
    return q, cache, table, torch.tensor(lengths, dtype=torch.int32)


def reference(q, cache, table, lengths, scale, magnitude=None):
    """float64 torch: out [b, s_q, h_q, 512], lse [b, h_q, s_q]; `magnitude` (if given) receives
    sum_k p_k |v_k|, the scale of each output's rounding error."""
    b, s_q, h_q, _ = q.shape
    out = torch.empty(b, s_q, h_q, 512, dtype=torch.float64, device="cuda")
    lse = torch.empty(b, h_q, s_q, dtype=torch.float64, device="cuda")
    for i in range(b):
        L = int(lengths[i])
        n = (L + PAGE - 1) // PAGE
        keys = cache[table[i, :n].long().cuda()].reshape(-1, 576)[:L].double()
        scores = torch.einsum("jhd,kd->jhk", q[i].double(), keys) * scale
        visible = torch.arange(L, device="cuda")[None, :] <= (L - s_q + torch.arange(s_q,
                                                                                     device="cuda"))[:, None]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        lse[i] = torch.logsumexp(scores, dim=-1).transpose(0, 1)
        p = torch.softmax(scores, dim=-1)
        out[i] = torch.einsum("jhk,kd->jhd", p, keys[:, :512])
        if magnitude is not None:
            magnitude[i] = torch.einsum("jhk,kd->jhd", p, keys[:, :512].abs())
    return out, lse


def check_close(got, want, magnitude, what):
    got = got.double()
    assert not torch.isnan(got).any(), f"{what}: NaN in the output"
    # Every element: bf16 rounding of the output and of the probabilities (P . V on bf16 tensor
    # cores), each about 2^-8 relative, of |out| and of sum_k p_k |v_k|.
    bound = 2.0**-7 * (want.abs() + magnitude) + 1e-6
    worst = float(((got - want).abs() / bound).max())
    assert worst <= 1.0, f"{what}: worst element at {worst:.2f} of its bound"
    rel = rel_error(got, want)
    assert rel <= 1e-2, f"{what}: relative L2 error {rel:.3g}"


@pytest.fixture(scope="module")
def server():
    with Sidecar(["--backend=cuda", "--warmup-rows=1"]) as s:
        yield s
        assert s.process.poll() is None, s.log()


@pytest.mark.parametrize("s_q,h_q,lengths", [
    (1, 16, [1, 63, 64, 65, 1000]),          # below a page, on page boundaries
    (4, 16, [4, 129, 4096, 300]),
    (2, 128, [2, 777, 2048]),
    (16, 64, [16, 64 * 7, 5000]),
])
def test_verify_matches_float64(server, s_q, h_q, lengths):
    q, cache, table, seqlens = make_case(len(lengths), s_q, h_q, lengths, seed=s_q * 1000 + h_q)
    scale = 576 ** -0.5
    magnitude = torch.empty(len(lengths), s_q, h_q, 512, dtype=torch.float64, device="cuda")
    want_out, want_lse = reference(q, cache, table, seqlens, scale, magnitude)
    with TorchClient(server.uds_target) as tc:
        for tables_on_gpu in (False, True):
            out = torch.full((len(lengths), s_q, h_q, 512), float("nan"), device="cuda",
                             dtype=torch.bfloat16)
            lse = torch.full((len(lengths), h_q, s_q), float("nan"), device="cuda")
            t, L = (table.cuda(), seqlens.cuda()) if tables_on_gpu else (table, seqlens)
            result = tc.verify(q, cache, t, L, out, lse, softmax_scale=scale)
            assert result.kernel_path in ("split_kv", "split_kv_sm90a")
            check_close(out, want_out, magnitude, f"out (tables on GPU: {tables_on_gpu})")
            assert float((lse.double() - want_lse).abs().max()) <= 1e-3


def test_shadow_mode_reports_and_writes_nothing(server):
    lengths = [300, 2048, 70]
    q, cache, table, seqlens = make_case(3, 2, 16, lengths, seed=5)
    want_out, _ = reference(q, cache, table, seqlens, 0.1)
    theirs = want_out.to(torch.bfloat16)
    ours_untouched = torch.full_like(theirs, 7.0)
    with TorchClient(server.uds_target) as tc:
        good = tc.verify(q, cache, table.cuda(), seqlens.cuda(), ours_untouched, compare_to=theirs,
                         softmax_scale=0.1)
        assert good.shadow is not None and good.shadow.compared == theirs.numel()
        assert good.shadow.mismatched == 0, good.shadow
        assert good.shadow.rel_l2_error < 1e-2
        assert bool((ours_untouched == 7.0).all()), "shadow mode wrote the caller's output"
        bad = theirs.clone()
        bad[1, 0, 3, :10] += 1.0
        report = tc.verify(q, cache, table, seqlens, compare_to=bad, softmax_scale=0.1).shadow
        assert report.mismatched >= 10 and report.max_abs_error >= 0.5
    metrics = server.metrics_text()
    assert "probesidecar_shadow_mismatched_requests_total 1" in metrics
    assert 'probesidecar_shadow_rel_l2_error_count 2' in metrics


def test_bad_tables_on_the_gpu_are_refused_and_poisoned(server):
    lengths = [200, 100]
    q, cache, table, seqlens = make_case(2, 2, 16, lengths, seed=9)
    table[1, 1] = PAGES + 3  # request 1's second page is past the cache
    out = torch.zeros(2, 2, 16, 512, device="cuda", dtype=torch.bfloat16)
    with TorchClient(server.uds_target) as tc:
        with pytest.raises(ProbeSidecarError) as error:
            tc.verify(q, cache, table.cuda(), seqlens.cuda(), out, softmax_scale=0.1)
        assert error.value.code == grpc.StatusCode.INVALID_ARGUMENT
        assert "1 of the 2 requests" in error.value.message
        torch.cuda.synchronize()
        assert torch.isnan(out[1].float()).all() and not torch.isnan(out[0].float()).any()
        # The same table inline is refused on the host, naming the entry.
        with pytest.raises(ProbeSidecarError) as error:
            tc.verify(q, cache, table, seqlens, out, softmax_scale=0.1)
        assert "block_table[1, 1]" in error.value.message
    assert "probesidecar_invalid_verify_requests_total 1" in server.metrics_text()


def test_graph_replay_equals_eager_bit_for_bit_across_calls(server):
    """The same buffers every step (a decode loop): one graph serves each call; outputs repeat
    exactly, and new lengths written on the GPU are picked up."""
    lengths = [500, 1500]
    q, cache, table, seqlens = make_case(2, 4, 32, lengths, seed=3)
    t, L = table.cuda(), seqlens.cuda()
    outs = []
    with TorchClient(server.uds_target) as tc:
        out = torch.empty(2, 4, 32, 512, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            tc.verify(q, cache, t, L, out, softmax_scale=0.05)
            outs.append(out.clone())
        assert torch.equal(outs[0], outs[1]) and torch.equal(outs[1], outs[2])
        L.copy_(torch.tensor([400, 1500], dtype=torch.int32))  # written on the GPU
        tc.verify(q, cache, t, L, out, softmax_scale=0.05)
        magnitude = torch.empty(2, 4, 32, 512, dtype=torch.float64, device="cuda")
        want, _ = reference(q, cache, table, torch.tensor([400, 1500]), 0.05, magnitude)
        check_close(out, want, magnitude, "after new lengths")
    assert math.isfinite(float(out.float().sum()))
