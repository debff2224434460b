"""The CUDA tap (TorchClient.tap) on a real GPU, across two processes: rows written on the GPU
(eagerly and inside a captured CUDA graph) into the tap's own ring, one Score per window ordered
by CUDA IPC events, every window's scores checked against float64 of the same rows, on the host
and in the device ring.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing.
"""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402
from probe_files import bf16_probes, bf16_tensor_file, float64_scores, rel_error  # noqa: E402
from probe_sidecar.tap import TapError  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probesidecar.v1 import buffers_pb2  # noqa: E402

H, P = 2048, 16
TOLERANCE = 1e-3  # relative L2 error of fp32-accumulated bf16 scores against float64


def probe_file(weight, bias):
    thresholds = "[" + ", ".join("0" if p % 2 else "null" for p in range(P)) + "]"
    return bf16_tensor_file(weight, bias, {"activation": "none", "thresholds": thresholds})


@pytest.fixture(scope="module")
def setup():
    torch.manual_seed(11)
    weight, bias = bf16_probes(P, H)
    with Sidecar(["--backend=cuda", "--warmup-rows=none"]) as server:
        with server.client() as c:
            c.load_probe_set("tap16", data=probe_file(weight, bias))
        yield server, weight, bias
        assert server.process.poll() is None, server.log()


def check_windows(windows, history, weight, bias, batch_of):
    """Every written row of every window against float64; padding rows are not delivered."""
    steps = 0
    for window in windows:
        assert window.error is None, window.error
        for i in range(window.steps):
            t = window.first_step + i
            n = batch_of(t)
            assert window.num_rows[i] == n, (t, window.num_rows[i], n)
            want = float64_scores(history[t][:n], None, weight, bias)
            got = torch.from_numpy(window.scores[i, :n]).double().to(want.device)
            rel = rel_error(got, want)
            assert rel <= TOLERANCE, f"step {t}: relative error {rel:.3g}"
            fired = torch.from_numpy(window.fired[i, :n])
            expected = (got >= 0).cpu() & (torch.arange(P) % 2 == 1)
            assert torch.equal(fired, expected), f"step {t}: fired flags"
            steps += 1
    return steps


def test_eager_writes_every_window_against_float64(setup, kernel):
    server, weight, bias = setup
    batches = [8, 8, 3, 8, 1, 5]
    with TorchClient(server.uds_target) as tc:
        tap = tc.tap("tap16", max_batch=8, window=4)
        history = []
        for t in range(23):  # 5 full windows and a partial one
            torch.cuda._sleep(200_000)  # the writes land late: the sidecar must wait for them
            hidden = torch.randn(batches[t % 6], H, device="cuda", dtype=torch.bfloat16)
            history.append(hidden.clone())
            tap.write(hidden)
            tap.step()
        tap.close()
        windows = list(tap.windows())
    assert [w.steps for w in windows] == [4, 4, 4, 4, 4, 3]
    assert check_windows(windows, history, weight, bias, lambda t: batches[t % 6]) == 23
    assert all(w.device_latency_s is not None and w.device_latency_s >= 0 for w in windows)


def test_graph_captured_writes_and_device_rows(setup, kernel):
    """The write inside a captured graph: each replay writes the next slot with no host work but
    step(); a device-resident row count varies the batch replay by replay."""
    server, weight, bias = setup
    max_batch, steps, k = 16, 40, 8
    with TorchClient(server.uds_target) as tc:
        tap = tc.tap("tap16", max_batch=max_batch, window=k)
        stream = torch.cuda.Stream()
        state = torch.zeros(max_batch, H, device="cuda", dtype=torch.bfloat16)
        noise = torch.randn(steps, max_batch, H, device="cuda", dtype=torch.bfloat16)
        t_dev = torch.zeros((), dtype=torch.int64, device="cuda")
        counts = torch.tensor([max_batch - (t % 5) * 3 for t in range(steps)], device="cuda")
        num_rows = torch.zeros((), dtype=torch.int64, device="cuda")
        stream.wait_stream(torch.cuda.current_stream())
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.stream(stream):
            with torch.cuda.graph(graph, stream=stream):
                state.copy_(noise.index_select(0, t_dev.view(1)).squeeze(0))  # "the step"
                num_rows.copy_(counts.index_select(0, t_dev.view(1)).squeeze(0))
                tap.write(state, num_rows=num_rows)
                t_dev.add_(1)
            t_dev.zero_()
            for _ in range(steps):
                graph.replay()
                tap.step()
            tap.flush()
            tap.wait_delivered()
            windows = list(tap.windows())
            # The last window's scores also stay in the device ring, for readers on the GPU.
            last = windows[-1]
            device = tap.device_scores(last.index).cpu().numpy()
            with pytest.raises(TapError, match="no longer in the ring"):
                tap.device_scores(last.index - 2)
            tap.close()
        batch_of = lambda t: max_batch - (t % 5) * 3  # noqa: E731
        assert check_windows(windows, list(noise), weight, bias, batch_of) == steps
        for i in range(last.steps):
            n = batch_of(last.first_step + i)
            np.testing.assert_array_equal(device[i, :n], last.scores[i, :n])


def test_submit_after_ready_scores_the_same(setup):
    server, weight, bias = setup
    with TorchClient(server.uds_target) as tc:
        tap = tc.tap("tap16", max_batch=4, window=4, submit="host")
        history = []
        for _ in range(16):
            torch.cuda._sleep(500_000)
            hidden = torch.randn(4, H, device="cuda", dtype=torch.bfloat16)
            history.append(hidden.clone())
            tap.write(hidden)
            tap.step()
        tap.close()
        assert check_windows(list(tap.windows()), history, weight, bias, lambda t: 4) == 16


def test_a_tap_never_overwrites_a_half_the_sidecar_is_reading(setup):
    """A long window of work between the writes and the sidecar's read: if the loop reused a half
    before the sidecar had read it, later rows would show up in earlier steps' scores."""
    server, weight, bias = setup
    with TorchClient(server.uds_target) as tc:
        tap = tc.tap("tap16", max_batch=64, window=1)
        history = []
        for t in range(30):
            hidden = torch.randn(64, H, device="cuda", dtype=torch.bfloat16)
            history.append(hidden.clone())
            tap.write(hidden)
            tap.step()
        tap.close()
        assert check_windows(list(tap.windows()), history, weight, bias, lambda t: 64) == 30


def test_misuse_is_refused_clearly(setup):
    server, _, _ = setup
    with TorchClient(server.uds_target) as tc:
        with pytest.raises(TapError, match="does not match"):
            tc.tap("tap16", max_batch=4, window=4, hidden_size=H // 2)
        with pytest.raises(TapError, match="max-rows"):
            tc.tap("tap16", max_batch=1 << 12, window=1 << 12)
        tap = tc.tap("tap16", max_batch=4, window=4)
        with pytest.raises(TapError, match="max_batch"):
            tap.write(torch.zeros(5, H, device="cuda", dtype=torch.bfloat16))
        with pytest.raises(TapError, match="float32"):
            tap.write(torch.zeros(4, H, device="cuda", dtype=torch.float32))
        with pytest.raises(TapError, match="CUDA tensor"):
            tap.write(torch.zeros(4, H, dtype=torch.bfloat16))
        with pytest.raises(TapError, match="num_rows"):
            tap.write(torch.zeros(4, H, device="cuda", dtype=torch.bfloat16), num_rows=3)
    # Closing the client closes its taps.
    with pytest.raises(TapError, match="closed"):
        tap.step()
    with TorchClient(server.uds_target) as tc:
        buffers = lambda: len(tc.client.stub.ListBuffers(  # noqa: E731
            buffers_pb2.ListBuffersRequest()).buffers)
        before = buffers()
        tap = tc.tap("tap16", max_batch=4, window=4)
        assert buffers() == before + 1
        tap.close()
        assert buffers() == before, "a closed tap leaves its ring registered"


def test_works_with_expandable_segments(setup, tmp_path):
    """The ring is the tap's own allocation: a decode process whose caching allocator uses
    expandable segments (which CUDA IPC cannot share) still taps."""
    server, weight, bias = setup
    script = tmp_path / "loop.py"
    torch.save({"weight": weight.cpu(), "bias": bias.cpu()}, tmp_path / "probe.pt")
    script.write_text(textwrap.dedent(f"""
        import sys
        import torch
        from probe_sidecar.torch import TorchClient
        sys.path.insert(0, {str(pathlib.Path(__file__).parent)!r})
        from probe_files import float64_scores, rel_error
        probe = torch.load({str(tmp_path / "probe.pt")!r})
        weight, bias = probe["weight"].cuda(), probe["bias"].cuda()
        x = torch.empty(1 << 20, device="cuda")  # the caching allocator's expandable segment
        assert x.untyped_storage()._share_cuda_()[1][1:2] == b"e", "not an expandable segment"
        with TorchClient({server.uds_target!r}) as tc:
            tap = tc.tap("tap16", max_batch=4, window=2)
            rows = []
            for _ in range(4):
                x = torch.randn(4, {H}, device="cuda", dtype=torch.bfloat16)
                rows.append(x.clone())
                tap.write(x)
                tap.step()
            tap.close()
            for w in tap.windows():
                for i in range(w.steps):
                    want = float64_scores(rows[w.first_step + i], None, weight, bias)
                    assert rel_error(w.scores[i], want) < {TOLERANCE}
        print("ok")
    """))
    env = dict(os.environ, PYTORCH_CUDA_ALLOC_CONF="expandable_segments:True")
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith("ok")


def test_a_sidecar_killed_mid_loop_never_stops_the_decode_stream(tmp_path):
    """SIGKILL the sidecar while windows are in flight: the loop's stream must go on (the tap
    never makes it wait on the GPU for the sidecar), the tap must fail loudly within its
    reuse_timeout_s, and the process must exit. Run in a child process, so that a hang fails the
    test instead of stalling it."""
    torch.manual_seed(3)
    weight, _ = bf16_probes(P, H, device="cpu")
    bias = torch.zeros(P, dtype=torch.bfloat16)
    server = Sidecar(["--backend=cuda", "--warmup-rows=none"]).start()
    with server.client() as c:
        c.load_probe_set("tap16", data=probe_file(weight, bias))
    script = tmp_path / "loop.py"
    script.write_text(textwrap.dedent(f"""
        import os, signal, time, torch
        from probe_sidecar.tap import TapError
        from probe_sidecar.torch import TorchClient
        tc = TorchClient({server.uds_target!r})
        tap = tc.tap("tap16", max_batch=8, window=4, reuse_timeout_s=2.0, raise_errors=True)
        x = torch.randn(8, {H}, device="cuda", dtype=torch.bfloat16)
        failed_at = None
        start = time.monotonic()
        for t in range(400):
            torch.cuda._sleep(1_000_000)  # ~0.5 ms of GPU work per step
            tap.write(x)
            if t == 40:
                os.kill({server.process.pid}, signal.SIGKILL)
            try:
                tap.step()
            except (TapError, Exception) as error:
                failed_at = failed_at if failed_at is not None else (t, repr(error)[:200])
        torch.cuda.synchronize()  # the decode stream finished: nothing of ours waits on the sidecar
        print("failed_at", failed_at, "seconds", round(time.monotonic() - start, 1), flush=True)
        try:
            tap.close(timeout=3)
        except Exception as error:
            print("close:", repr(error)[:200])
        os._exit(0)  # the session's gRPC channel to a dead server need not be torn down
    """))
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                              timeout=120)
    finally:
        server.close()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "failed_at (" in done.stdout, done.stdout + done.stderr
