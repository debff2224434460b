"""The tap operator (probe_sidecar.tap_op) on the CPU: its counters and slots in plain and gather
mode, both of its torch implementations, the Triton kernels in Triton's interpreter, and a
torch.compile'd function that calls it (the failure that kept compiled models from being tapped:
an operator that mutates one uint8 ring is one node of the graph, and every call writes)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

from probe_sidecar import tap_op  # noqa: E402

K, MB, H = 3, 4, 40


def ring(dtype=torch.float32, window=K):
    layout = tap_op.RingLayout.make(window=window, max_batch=MB, hidden_size=H, num_probes=2,
                                    dtype=dtype, device_scores=False)
    raw = torch.zeros(layout.nbytes, dtype=torch.uint8)
    return layout, raw, layout.initialise(raw, dtype)


IMPLEMENTATIONS = {"cpu": tap_op._tap_write_cpu, "torch": tap_op._tap_write_cuda_torch}


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_plain_writes_fill_the_window_then_the_spare_slot(impl):
    write = IMPLEMENTATIONS[impl]
    layout, raw, v = ring()
    rows = [torch.randn(n, H) for n in (3, 1, 4, 2)]
    for i, x in enumerate(rows):
        num_rows = torch.tensor([2], dtype=torch.int32) if i == 2 else None
        write(x, raw, layout.op_args(), None, num_rows, False)
    meta = v["meta"].tolist()
    # Three slots in the window, the fourth write went to the spare slot (never read).
    assert meta[tap_op.META_NEXT_SLOT] == K and meta[tap_op.META_WRITES] == 4
    assert meta[tap_op.META_ARMED] == -1
    assert v["counts"].tolist() == [3, 1, 2, 0, 0, 0, 0][:2 * K] + [2]
    for slot in range(K):
        assert torch.equal(v["slots"][slot, :rows[slot].shape[0]], rows[slot])
    assert torch.equal(v["slots"][2 * K, :2], rows[3])


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_gather_writes_the_armed_rows_once_with_the_residual_stream(impl):
    write = IMPLEMENTATIONS[impl]
    layout, raw, v = ring(torch.bfloat16)
    hidden = torch.randn(7, H).to(torch.bfloat16)
    residual = torch.randn(7, H).to(torch.bfloat16)
    write(hidden, raw, layout.op_args(), residual, None, True)  # not armed: nothing at all
    # (the torch path writes such a call into the spare slot, which nothing reads)
    assert v["meta"].tolist()[:4] == [0, K, 0, 0] and v["slots"][:2 * K].abs().sum() == 0
    tap_op.arm(raw, layout, torch.tensor([6, 0, 3]), 3)
    assert v["meta"][tap_op.META_ARMED] == 3
    write(hidden, raw, layout.op_args(), residual, None, True)
    want = (hidden.float() + residual.float()).to(torch.bfloat16)[[6, 0, 3]]
    assert torch.equal(v["slots"][0, :3], want)
    assert v["counts"][0] == 3 and v["meta"][tap_op.META_NEXT_SLOT] == 1
    assert v["meta"][tap_op.META_ARMED] == -1  # the write disarms: the next forward writes nothing
    write(hidden, raw, layout.op_args(), residual, None, True)
    assert v["meta"][tap_op.META_NEXT_SLOT] == 1 and v["meta"][tap_op.META_WRITES] == 1


@pytest.mark.parametrize("impl", IMPLEMENTATIONS)
def test_following_starts_writes_each_requests_last_row_without_arming(impl):
    """vLLM's query_start_loc: request i is rows starts[i]..starts[i+1]-1, padded requests are
    empty. Following, every write takes each request's last row (no arm() per forward); an
    explicit arm() wins for one write; disarm() and the write return to following."""
    write = IMPLEMENTATIONS[impl]
    layout, raw, v = ring(torch.bfloat16)
    hidden = torch.randn(9, H).to(torch.bfloat16)
    residual = torch.randn(9, H).to(torch.bfloat16)
    starts = torch.tensor([0, 4, 5, 9, 9], dtype=torch.int32)  # 3 requests, one padded slot
    write(hidden, raw, layout.op_args(), residual, None, True, starts)  # not following: nothing
    assert v["meta"].tolist()[:4] == [0, K, 0, 0] and v["slots"][:2 * K].abs().sum() == 0
    tap_op.follow_starts(raw, layout)
    full = (hidden.float() + residual.float()).to(torch.bfloat16)
    write(hidden, raw, layout.op_args(), residual, None, True, starts)
    assert v["counts"][0] == 3 and torch.equal(v["slots"][0, :3], full[[3, 4, 8]])
    assert v["meta"][tap_op.META_ARMED] == tap_op.ARMED_FOLLOW  # still following
    tap_op.arm(raw, layout, torch.tensor([1]), 1)
    write(hidden, raw, layout.op_args(), residual, None, True, starts)
    assert v["counts"][1] == 1 and torch.equal(v["slots"][1, :1], full[[1]])
    tap_op.arm(raw, layout, torch.tensor([2]), 1)
    tap_op.disarm(raw, layout)  # the armed forward did not run: following again
    starts = torch.tensor([0, 1, 2, 3, 4], dtype=torch.int32)  # a full decode batch
    write(hidden, raw, layout.op_args(), residual, None, True, starts)
    assert v["counts"][2] == MB and torch.equal(v["slots"][2, :MB], full[:MB])
    assert v["meta"][tap_op.META_WRITES] == 3
    tap_op.follow_starts(raw, layout, on=False)
    write(hidden, raw, layout.op_args(), residual, None, True, starts)
    assert v["meta"][tap_op.META_WRITES] == 3  # not following: a forward writes nothing unarmed
    with pytest.raises(ValueError, match="starts"):
        tap_op.tap_write(hidden, raw, layout.op_args(), gather=True, starts=starts[:MB])


def test_close_window_keeps_the_count_and_moves_to_the_other_half():
    layout, raw, v = ring()
    tap_op.tap_write(torch.randn(2, H), raw, layout.op_args())
    tap_op.tap_write(torch.randn(2, H), raw, layout.op_args())
    tap_op.close_window(raw, layout, 0, K)
    assert v["meta"].tolist()[:6] == [K, 2 * K, 0, 0, 2, 0]


def test_checks_refuse_what_the_operator_cannot_write():
    layout, raw, _ = ring()
    with pytest.raises(ValueError, match="hidden must be"):
        tap_op.tap_write(torch.randn(2, H + 1), raw, layout.op_args())
    with pytest.raises(ValueError, match="max_batch"):
        tap_op.tap_write(torch.randn(MB + 1, H), raw, layout.op_args())
    with pytest.raises(ValueError, match="contiguous"):
        tap_op.tap_write(torch.randn(H, 2).t(), raw, layout.op_args())
    with pytest.raises(ValueError, match="arm"):
        tap_op.arm(raw, layout, torch.arange(MB + 1), MB + 1)


def test_a_compiled_function_writes_at_every_call():
    """torch.compile (Inductor, fullgraph): the operator is one node that mutates the ring in
    place; each call writes the next slot, decided by the ring's own counters."""
    layout, raw, v = ring(window=8)
    args = layout.op_args()

    def step(x, ring_tensor):
        hidden = torch.tanh(x) * 2
        tap_op.tap_write(hidden[:, -1], ring_tensor, args)
        return hidden.sum()

    compiled = torch.compile(step, fullgraph=True)
    xs = [torch.randn(3, 5, H) for _ in range(4)]
    for x in xs:
        compiled(x, raw)
    for slot, x in enumerate(xs):
        assert torch.allclose(v["slots"][slot, :3], torch.tanh(x)[:, -1] * 2)
    assert v["meta"][tap_op.META_NEXT_SLOT] == 4 and v["meta"][tap_op.META_WRITES] == 4


def test_the_triton_kernels_in_the_interpreter():
    """The CUDA path's Triton kernels, run by Triton's CPU interpreter (the GPU tests run them for
    real): plain and gathered writes, the arm and close kernels."""
    pytest.importorskip("triton")
    script = textwrap.dedent("""
        import torch
        from probe_sidecar import tap_op
        write, close, arm = tap_op._make_triton_kernels()
        layout = tap_op.RingLayout.make(window=2, max_batch=4, hidden_size=40, num_probes=3,
                                        dtype=torch.bfloat16, device_scores=True)
        raw = torch.zeros(layout.nbytes, dtype=torch.uint8)
        v = layout.initialise(raw, torch.bfloat16)
        slots_at, counts_at, meta_at, gather_at, mb, h, spare = layout.op_args()
        hidden = torch.randn(6, 40).to(torch.bfloat16)
        res = torch.randn(6, 40).to(torch.bfloat16)

        def run(grid, n, residual, gather, starts=None):
            write[grid](hidden, 40, res if residual else hidden, 40, raw, slots_at, counts_at,
                        meta_at, gather_at, raw, raw if starts is None else starts, n, h, mb,
                        spare, BLOCK=32, BATCH_BLOCK=4, HAS_NUM_ROWS=False,
                        HAS_RESIDUAL=residual, GATHER=gather, HAS_STARTS=starts is not None)

        run((3, 2), 3, False, False)
        assert v["meta"].tolist()[:4] == [1, 2, 0, 1], v["meta"]
        assert v["counts"][0] == 3 and torch.equal(v["slots"][0, :3], hidden[:3])
        run((mb, 2), 6, True, True)  # not armed
        assert v["meta"].tolist()[:4] == [1, 2, 0, 1] and v["slots"][1].abs().sum() == 0
        arm[(1,)](torch.tensor([5, 1, 2]), raw, gather_at, meta_at, 2, BLOCK=4)
        assert v["meta"][6] == 2 and v["gather"][:2].tolist() == [5, 1]
        run((mb, 2), 6, True, True)
        want = (hidden.float() + res.float())[[5, 1]]
        # The interpreter converts to bf16 by truncation (the GPU rounds): one bf16 ulp.
        assert torch.allclose(v["slots"][1, :2].float(), want, rtol=2 ** -7, atol=0)
        assert v["meta"].tolist()[:7] == [2, 2, 0, 2, 0, 0, -1] and v["counts"][1] == 2
        close[(1,)](raw, meta_at, 0, 2, 4)
        assert v["meta"].tolist()[:6] == [2, 4, 0, 0, 2, 0]
        # Following vLLM-style starts: requests of 3, 1 and 2 tokens, one padded (empty) entry.
        starts = torch.tensor([0, 3, 4, 6, 6], dtype=torch.int32)
        run((mb, 2), 6, False, True, starts)  # not following yet: nothing
        assert v["meta"].tolist()[:4] == [2, 4, 0, 0]
        tap_op.follow_starts(raw, layout)
        run((mb, 2), 6, False, True, starts)
        assert v["meta"].tolist() == [3, 4, 0, 1, 2, 0, -2, -2], v["meta"]
        assert v["counts"][2] == 3 and torch.equal(v["slots"][2, :3], hidden[[2, 3, 5]])
        arm[(1,)](torch.tensor([4]), raw, gather_at, meta_at, 1, BLOCK=4)  # one explicit step
        run((mb, 2), 6, False, True, starts)
        assert v["counts"][3] == 1 and torch.equal(v["slots"][3, :1], hidden[[4]])
        assert v["meta"][6] == -2  # then following again
        print("interpreted kernels ok")
        """)
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0 and "interpreted kernels ok" in done.stdout, done.stderr[-4000:]
