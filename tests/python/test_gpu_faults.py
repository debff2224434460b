"""Real CUDA faults against the real server (CUDA backend), from this torch process:

- a sticky fault (a test-only kernel that writes out of bounds, PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT
  in the test binary probe-sidecar-test-faults) loses the server's CUDA context: health turns
  NOT_SERVING, the faulting request and the one in flight beside it fail, new ones get
  UNAVAILABLE, the error is logged, and the process exits with status 3 within the grace period
  plus one second;
- the same fault in an enqueue-only window (the tap's path): the window itself was answered
  before the GPU ran it, and the next window fails;
- a non-sticky error (out of memory, with this process holding the GPU's memory) fails only its
  request;
- NaN and Inf in scores written to device outputs are counted on the GPU.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1). Figures go to
<build>/reliability/gpu_faults.json.
"""

from __future__ import annotations

import threading
import time

import grpc
import numpy as np
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import FAULTS_BIN, Sidecar  # noqa: E402
from gpu_faults_support import H, P, T, busy_stream, make_probes, request_after  # noqa: E402
from probe_files import float64_scores, rel_error  # noqa: E402
from probe_sidecar import ProbeSidecarError  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from server_state import figures_fixture, metric, wait_for  # noqa: E402

# What the tests measure, written once they have all run (server_state.figures_fixture).
figures = figures_fixture("gpu_faults")
ROWS = list(range(0, 64 * 37, 37))


@pytest.fixture(scope="module")
def probes():
    return make_probes()


@pytest.fixture(scope="module")
def server(probes):
    with Sidecar(["--backend=cuda", "--warmup-rows=1,64"]) as s:
        with s.client() as c:
            c.load_probe_set("p16", data=probes[2])
        yield s
        assert s.process.poll() is None, s.log()


def test_non_finite_scores_in_device_outputs_are_counted_on_the_gpu(figures, server, probes):
    weight, bias, _ = probes
    total = lambda: metric(server, "probesidecar_non_finite_scores_total")  # noqa: E731
    with TorchClient(server.uds_target) as tc:
        x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
        x[5] = float("nan")
        x[9, 3] = float("inf")
        rows = [0, 5, 1, 9, 2, 3, 4, 6]  # rows 5 and 9: every score of theirs is NaN or Inf
        out = torch.zeros(len(rows), P, device="cuda")
        before = total()
        # Synchronous, device output: the count is in the answer and in the metric.
        result = tc.score(x, rows, "p16", out=out)
        torch.cuda.synchronize()
        assert int((~torch.isfinite(out)).sum()) == 2 * P
        assert result.non_finite == 2 * P
        assert wait_for(lambda: total() - before == 2 * P, 5), total() - before
        # Enqueue-only (the tap's path): answered before the count exists; the metric has it
        # once the GPU has run it.
        handle = tc.score_async(x, rows, "p16", out=out)
        handle.wait()
        assert handle.response().enqueued and handle.response().non_finite_scores == 0
        assert wait_for(lambda: total() - before == 4 * P, 5), total() - before
        # Finite scores count nothing; rows found invalid on the GPU are NaN, and counted.
        good = [0, 1, 2, 3]
        result = tc.score(x, good, "p16", out=out[:4])
        assert result.non_finite == 0
        torch.cuda.synchronize()
        assert rel_error(out[:4].cpu().numpy(), float64_scores(x, good, weight, bias)) <= 1e-3
        device_rows = torch.tensor([1, T + 3], device="cuda", dtype=torch.int32)
        tc.score_async(x, device_rows, "p16", out=out[:2]).wait()
        assert wait_for(lambda: total() - before == 5 * P, 5), total() - before
    figures["non_finite_device"] = {"counted": total() - before}


SERVING, NOT_SERVING = 1, 2  # grpc.health.v1.HealthCheckResponse.ServingStatus


def _health_watch(channel: grpc.Channel):
    """grpc.health.v1.Health/Watch for the whole server, as a stream of status numbers (raw
    protobuf: grpcio-health-checking may be missing on the GPU machine)."""
    watch = channel.unary_stream("/grpc.health.v1.Health/Watch")(b"")
    # HealthCheckResponse {status = 1}: b"" (UNKNOWN) or b"\x08" + the enum value.
    return (reply[1] if len(reply) >= 2 else 0 for reply in watch)


def _statuses(watch, until, timeout: float) -> list:
    """Health Watch statuses until `until` is seen, the stream ends, or `timeout` passes."""
    seen = []
    done = threading.Event()

    def read():
        try:
            for status in watch:
                seen.append(status)
                if status == until:
                    break
        except grpc.RpcError:
            pass
        done.set()


    threading.Thread(target=read, daemon=True).start()
    done.wait(timeout)
    return seen


def test_a_real_cuda_fault_stops_the_server_and_fails_every_request(figures, probes, monkeypatch):
    weight, bias, data = probes
    grace = 2.0
    # Requests 1 and 2 succeed, 3 is in flight (waiting on the GPU for its ready event), 4 faults.
    monkeypatch.setenv("PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT", "4")
    s = Sidecar(["--backend=cuda", f"--shutdown-grace-seconds={grace}", "--warmup-rows=1,64"],
                binary=FAULTS_BIN)
    s.start()
    try:
        assert "test-only fault hook" in s.log()
        with s.client() as c:
            c.load_probe_set("p16", data=data)
        channel = grpc.insecure_channel(s.uds_target)
        watch = _health_watch(channel)
        assert next(watch) == SERVING
        with TorchClient(s.uds_target) as tc, TorchClient(s.uds_target, events_in_flight=4) as other:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            want = float64_scores(x, ROWS, weight, bias)
            for _ in range(2):
                assert rel_error(tc.score(x, ROWS, "p16").scores, want) <= 1e-3
            stream = busy_stream(1.0)
            waiting = other.client.stub.Score.future(request_after(other, stream, x, ROWS, "p16"),
                                                     timeout=30)
            assert wait_for(lambda: metric(s, "probesidecar_rpc_in_flight", rpc="Score") == 1, 10)
            faulted = time.monotonic()
            with pytest.raises(ProbeSidecarError) as error:
                tc.score(x, ROWS, "p16")
            assert error.value.code == grpc.StatusCode.INTERNAL, error.value
            assert "cudaErrorIllegalAddress" in error.value.message
            assert "context is lost" in error.value.message
            # The request in flight beside it fails too: no answer computed on a lost context.
            with pytest.raises(grpc.RpcError) as in_flight:
                waiting.result(timeout=30)
            assert in_flight.value.code() in (grpc.StatusCode.INTERNAL,
                                              grpc.StatusCode.UNAVAILABLE), in_flight.value
            statuses = _statuses(watch, NOT_SERVING, 10)
            assert NOT_SERVING in statuses, statuses
            # New requests: UNAVAILABLE (refused while it stops, or nobody listens any more).
            with pytest.raises(ProbeSidecarError) as refused:
                tc.score(x, ROWS, "p16")
            assert refused.value.code == grpc.StatusCode.UNAVAILABLE, refused.value
            code = s.wait(timeout=grace + 10)
            elapsed = time.monotonic() - faulted
            stream.synchronize()
        channel.close()
        log = s.log()
        figures["sticky_fault"] = {"exit_status": code, "exit_after_fault_s": round(elapsed, 3),
                                   "in_flight_code": in_flight.value.code().name,
                                   "health_watch": statuses}
        assert code == 3, log
        assert elapsed <= grace + 1.0, (elapsed, log)
        assert "CUDA context of device 0 is lost: cudaErrorIllegalAddress" in log, log
    finally:
        s.close()


def test_a_fault_in_an_enqueue_only_window_shows_on_the_next_window(figures, probes, monkeypatch):
    """The tap's path: a window answered as soon as it is queued (device rows and output, done
    event). The fault comes after that answer; the next window must fail, not succeed with stale
    scores. What the client's GPU sees of the failed window's done event is recorded."""
    _, _, data = probes
    monkeypatch.setenv("PROBE_SIDECAR_TEST_ILLEGAL_ADDRESS_AT", "3")
    s = Sidecar(["--backend=cuda", "--shutdown-grace-seconds=2", "--warmup-rows=1,64"],
                binary=FAULTS_BIN).start()
    try:
        with s.client() as c:
            c.load_probe_set("p16", data=data)
        with TorchClient(s.uds_target) as tc:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            rows = torch.arange(64, device="cuda", dtype=torch.int32)
            out = torch.zeros(64, P, device="cuda")
            for _ in range(2):
                tc.score_async(x, rows, "p16", out=out).wait(timeout=30)
            window = tc.score_async(x, rows, "p16", out=out)  # request 3: faults on the GPU
            assert window.response(timeout=30).enqueued
            # The next window: refused (the context is lost) or no server; either way an error.
            failed_next = None
            for _ in range(50):
                try:
                    tc.score_async(x, rows, "p16", out=out).response(timeout=30)
                except ProbeSidecarError as error:
                    failed_next = error
                    break
                time.sleep(0.05)
            assert failed_next is not None, "windows kept succeeding after the fault"
            assert failed_next.code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL,
                                        grpc.StatusCode.CANCELLED), failed_next
            code = s.wait(timeout=15)
            # Does the faulted window's done event ever complete for the client's GPU? (If not, a
            # stream that waits on it would hang: the tap must not wait on a failed window.)
            done = window._pair.done

            def query() -> bool:
                try:
                    return done.query()
                except RuntimeError:  # a CUDA error on the event
                    return False

            completed = wait_for(query, 5)
        figures["enqueue_only_fault"] = {"exit_status": code, "next_window": failed_next.code.name,
                                         "failed_windows_done_event_completes": completed}
        assert code == 3, s.log()
    finally:
        s.close()


def test_out_of_memory_fails_only_its_request(figures):
    """A non-sticky CUDA error: with this process holding nearly all the GPU's memory, a request
    that needs a larger staging buffer fails (INTERNAL, out of memory); the context stays usable,
    health stays SERVING, and once the memory is free the same request succeeds."""
    s = Sidecar(["--backend=cuda", "--warmup-rows=1"]).start()
    hog = []
    try:
        x = np.random.default_rng(0).standard_normal((1, 4096)).astype(np.float32)
        big_rows = np.zeros(16384, np.int32)  # staging of 16384 x 4096 float32 rows: 256 MiB
        with s.client(timeout=60) as c:
            assert c.score(x, [0, 0], "demo").scores.shape == (2, 4)
            while torch.cuda.mem_get_info()[0] > (3 << 30):
                hog.append(torch.empty(1 << 30, dtype=torch.uint8, device="cuda"))
            while torch.cuda.mem_get_info()[0] > (96 << 20):
                hog.append(torch.empty(32 << 20, dtype=torch.uint8, device="cuda"))
            left = torch.cuda.mem_get_info()[0]
            with pytest.raises(ProbeSidecarError) as error:
                c.score(x, big_rows, "demo")
            assert error.value.code == grpc.StatusCode.INTERNAL, error.value
            assert "memory" in error.value.message.lower(), error.value
            hog.clear()
            torch.cuda.empty_cache()
            assert c.score(x, [0, 0], "demo").scores.shape == (2, 4)
            assert c.score(x, big_rows, "demo").scores.shape == (16384, 4)
            assert next(_health_watch(c._channel)) == SERVING
        assert s.process.poll() is None
        assert "is lost" not in s.log()
        assert metric(s, "probesidecar_cuda_errors_total") == 1
        figures["out_of_memory"] = {"free_bytes_left": left, "message": error.value.message[:160]}
    finally:
        hog.clear()
        torch.cuda.empty_cache()
        s.close()
