"""Clients whose GPU work does not complete, against the real server (CUDA backend):

- a client whose stream is stuck (a kernel spinning for seconds before its ready event): its
  request answers DEADLINE_EXCEEDED at its deadline, nothing of it was queued on a stream (the
  server waits for a ready event on the host), other sessions are answered at their normal
  latency meanwhile (measured), and SIGTERM while it waits exits 0 in time;
- deadlines and cancellation of requests waiting on the GPU;
- SIGTERM with GPU work in flight (windows queued behind a busy stream, a Verify waiting): every
  request answered once, exit 0 within the grace period plus one second;
- a client SIGKILLed mid-window (while the server waits for its ready events, and while its
  windows are being scored): its buffers and events are released, no IPC handle or GPU memory
  stays, other clients are unaffected.

Runs on the GPU machine (tests/gpu/run.sh); skipped where torch or a CUDA device is missing
(and failed there instead, where PROBE_SIDECAR_REQUIRE_GPU=1). Figures go to
<build>/reliability/gpu_stuck.json.
"""

from __future__ import annotations

import pathlib
import signal
import subprocess
import sys
import textwrap
import threading
import time

import grpc
import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

from conftest import Sidecar  # noqa: E402
from gpu_faults_support import (H, P, T, busy_stream, cycles_per_second, in_flight,  # noqa: E402
                                latencies_ms, make_probes, parked, request_after, summary)
from probe_files import float64_scores, rel_error  # noqa: E402
from probe_sidecar import ProbeSidecarError  # noqa: E402
from probe_sidecar.torch import TorchClient  # noqa: E402
from probesidecar.v1 import buffers_pb2  # noqa: E402
from server_state import device_total, figures_fixture, metric, wait_for  # noqa: E402

# What the tests measure, written once they have all run (server_state.figures_fixture).
figures = figures_fixture("gpu_stuck", also=lambda: {"cycles_per_second": cycles_per_second()})
ROWS = list(range(0, 64 * 37, 37))


@pytest.fixture(scope="module")
def probes():
    return make_probes()


def start(data: bytes, *flags: str) -> Sidecar:
    s = Sidecar(["--backend=cuda", "--warmup-rows=1,64", *flags]).start()
    with s.client() as c:
        c.load_probe_set("p16", data=data)
    return s


def test_a_stuck_client_holds_up_nobody_else(figures, probes):
    weight, bias, data = probes
    grace = 2.0
    s = start(data, "--cuda-workers=4", f"--shutdown-grace-seconds={grace}")
    try:
        with TorchClient(s.uds_target, events_in_flight=16) as stuck, \
                TorchClient(s.uds_target) as other:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            want = float64_scores(x, ROWS, weight, bias)
            out = torch.zeros(64, P, device="cuda")
            rows = torch.tensor(ROWS, device="cuda", dtype=torch.int32)

            def other_sync():
                assert rel_error(other.score(x, ROWS, "p16").scores, want) <= 1e-3

            def other_window():
                other.score_async(x, rows, "p16", out=out).wait(timeout=30)

            other_sync()
            other_window()
            base_sync = latencies_ms(other_sync, 50)
            base_window = latencies_ms(other_window, 50)
            expired = metric(s, "probesidecar_executor_expired_requests_total")
            # The stuck client: its stream spins for 4 s before its ready event; its request's
            # deadline is 1 s.
            spin = busy_stream(4.0)
            spun = time.monotonic()
            answer = {}

            def stuck_call():
                started = time.monotonic()
                try:
                    stuck.client.stub.Score(request_after(stuck, spin, x, ROWS, "p16"), timeout=1.0)
                    answer["code"] = grpc.StatusCode.OK
                except grpc.RpcError as error:
                    answer["code"] = error.code()
                answer["after_s"] = time.monotonic() - started

            caller = threading.Thread(target=stuck_call)
            caller.start()
            assert wait_for(lambda: in_flight(s) == 1, 5)
            # Other sessions meanwhile: synchronous requests and enqueue-only windows.
            during_sync = latencies_ms(other_sync, 100)
            during_window = latencies_ms(other_window, 50)
            caller.join(timeout=10)
            assert answer["code"] == grpc.StatusCode.DEADLINE_EXCEEDED, answer
            # The server answered at the deadline too, not when the GPU got there.
            assert wait_for(lambda: in_flight(s) == 0, 0.5), "the server still holds the call"
            assert metric(s, "probesidecar_executor_expired_requests_total") == expired + 1
            # Nothing of the stuck request was queued (its ready event is waited for on the host,
            # never by a stream on the GPU): no slot waits for the stuck stream, all of them serve.
            # (The other session's windows park a slot for the microseconds until the GPU is past
            # them; one held by the stuck stream would stay parked the seconds it still spins.)
            assert wait_for(lambda: parked(s) == 0, 1.0)
            during_more = latencies_ms(other_sync, 50)
            assert wait_for(lambda: parked(s) == 0, 1.0)
            assert time.monotonic() - spun < 3.8, "the measurement outlasted the stuck stream"
            spin.synchronize()
            after = latencies_ms(other_sync, 50)
            figures["stuck_client"] = {
                "baseline_sync": summary(base_sync), "baseline_window": summary(base_window),
                "while_stuck_sync": summary(during_sync),
                "while_stuck_window": summary(during_window),
                "while_parked_sync": summary(during_more), "after_sync": summary(after),
                "stuck_request": {"code": answer["code"].name, "after_s": round(answer["after_s"], 3)},
            }
            # Normal latency meanwhile: nothing waited for the stuck stream (a wait would be
            # seconds). The bound leaves room for time-slicing with the spinning context (no MPS).
            for during in (during_sync, during_more):
                assert max(during) < 250, summary(during)
                assert sorted(during)[len(during) // 2] < sorted(base_sync)[25] + 20
            assert max(during_window) < 250, summary(during_window)

            # SIGTERM while a slot is stuck again (this time the request has no deadline): the
            # call is answered and the process exits 0 within the grace period plus one second.
            spin = busy_stream(3.5)
            waiting = stuck.client.stub.Score.future(request_after(stuck, spin, x, ROWS, "p16"))
            assert wait_for(lambda: in_flight(s) == 1, 5)
            signalled = time.monotonic()
            s.signal(signal.SIGTERM)
            code = s.wait(timeout=grace + 10)
            exit_s = time.monotonic() - signalled
            with pytest.raises(grpc.RpcError) as cut:
                waiting.result(timeout=10)
            figures["stuck_client"]["sigterm"] = {"exit_status": code, "exit_s": round(exit_s, 3),
                                                  "stuck_call": cut.value.code().name}
            assert code == 0, s.log()
            assert exit_s <= grace + 1.0, (exit_s, s.log())
            assert cut.value.code() in (grpc.StatusCode.CANCELLED, grpc.StatusCode.UNAVAILABLE)
            spin.synchronize()
    finally:
        s.close()


def test_deadlines_and_cancellation_of_requests_waiting_on_the_gpu(probes):
    _, _, data = probes
    s = start(data, "--cuda-workers=2")
    try:
        with TorchClient(s.uds_target, events_in_flight=16) as tc:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            cancelled = metric(s, "probesidecar_executor_cancelled_requests_total")
            spin = busy_stream(3.0)
            # Cancelled while its stream waits: the server lets go at once.
            call = tc.client.stub.Score.future(request_after(tc, spin, x, ROWS, "p16"), timeout=30)
            assert wait_for(lambda: in_flight(s) == 1, 5)
            call.cancel()
            assert wait_for(lambda: in_flight(s) == 0, 1.0)
            assert wait_for(
                lambda: metric(s, "probesidecar_executor_cancelled_requests_total") == cancelled + 1, 2)
            # Nothing of it was queued (the ready event is waited for on the host): no slot is
            # parked, both serve.
            assert wait_for(lambda: parked(s) == 0, 1.0)
            assert tc.score(x, ROWS, "p16").scores.shape == (64, P)
            # Past its deadline with both slots' streams busy: DEADLINE_EXCEEDED, not a hang.
            spin2 = busy_stream(2.0)
            with pytest.raises(grpc.RpcError) as late:
                tc.client.stub.Score(request_after(tc, spin2, x, ROWS, "p16"), timeout=0.5)
            assert late.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            assert wait_for(lambda: in_flight(s) == 0, 0.5)
            spin.synchronize()
            spin2.synchronize()
            assert wait_for(lambda: parked(s) == 0, 5)
            assert tc.score(x, ROWS, "p16").scores.shape == (64, P)
        assert s.process.poll() is None, s.log()
    finally:
        s.close()


def test_sigterm_with_gpu_work_in_flight_answers_everything_once(figures, probes):
    """Windows queued behind a busy client stream and a Verify waiting on the GPU when SIGTERM
    comes: every call is answered exactly once (done, or refused/cut with a status), and the
    process exits 0 within the grace period plus one second."""
    weight, bias, data = probes
    grace = 3.0
    s = start(data, f"--shutdown-grace-seconds={grace}")
    try:
        with TorchClient(s.uds_target, events_in_flight=16) as tc:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            rows = torch.tensor(ROWS, device="cuda", dtype=torch.int32)
            outs = [torch.zeros(64, P, device="cuda") for _ in range(12)]
            spin = busy_stream(1.5)
            windows = [tc.score_async(x, rows, "p16", out=o, stream=spin) for o in outs]
            # A Verify whose inputs the same busy stream writes (its ready event follows the spin).
            b, s_q, h_q, pages = 2, 2, 16, 8
            q = torch.randn(b, s_q, h_q, 576, device="cuda").to(torch.bfloat16)
            cache = torch.randn(pages, 64, 576, device="cuda").to(torch.bfloat16)
            table = torch.arange(pages, dtype=torch.int32, device="cuda").reshape(b, pages // b)
            lengths = torch.tensor([100, 200], dtype=torch.int32, device="cuda")
            vout = torch.zeros(b, s_q, h_q, 512, device="cuda", dtype=torch.bfloat16)
            verified = {}

            def verify():
                try:
                    verified["path"] = tc.verify(q, cache, table, lengths, vout, stream=spin)
                    verified["code"] = grpc.StatusCode.OK
                except ProbeSidecarError as error:
                    verified["code"] = error.code
                except Exception as error:  # a bug of the test or the client: say which
                    verified["error"] = repr(error)

            verifier = threading.Thread(target=verify)
            verifier.start()
            # The Verify is the server's (queued behind the windows, or waiting for its ready
            # event), or already answered.
            assert wait_for(lambda: in_flight(s, "Verify") >= 1 or verified, 10)
            assert "error" not in verified, verified["error"]
            signalled = time.monotonic()
            s.signal(signal.SIGTERM)
            code = s.wait(timeout=grace + 10)
            exit_s = time.monotonic() - signalled
            verifier.join(timeout=10)
            codes = []
            for w in windows:
                try:
                    codes.append("OK" if w.response(timeout=10).enqueued else "OK-sync")
                except ProbeSidecarError as error:
                    codes.append(error.code.name)
            spin.synchronize()
            torch.cuda.synchronize()
            want = float64_scores(x, ROWS, weight, bias)
            for o, c in zip(outs, codes):
                if c == "OK":
                    assert rel_error(o.cpu().numpy(), want) <= 1e-3
        figures["sigterm_gpu_in_flight"] = {"exit_status": code, "exit_s": round(exit_s, 3),
                                            "windows": codes, "verify": verified["code"].name}
        assert code == 0, s.log()
        assert exit_s <= grace + 1.0, (exit_s, s.log())
        assert verified["code"] == grpc.StatusCode.OK, verified  # admitted: it finishes
        assert "OK" in codes and set(codes) <= {"OK", "UNAVAILABLE", "CANCELLED"}, codes
    finally:
        s.close()


CHILD = """
    import sys, time, torch
    from probe_sidecar.torch import TorchClient
    sys.path.insert(0, {tests!r})
    from gpu_faults_support import busy_stream
    tc = TorchClient({target!r}, events_in_flight=16)
    x = torch.randn({T}, {H}, device="cuda", dtype=torch.bfloat16)
    rows = torch.arange(64, device="cuda", dtype=torch.int32)
    outs = [torch.zeros(64, {P}, device="cuda") for _ in range(4)]
    if {mode!r} == "waiting":
        # Two of the server's four streams wait on this process's ready events, behind 5 s of
        # GPU spin.
        spin = busy_stream(5.0)
        outs = outs[:2]
        handles = [tc.score_async(x, rows, "p16", out=o, stream=spin) for o in outs]
        print("ready", flush=True)  # the server waits for their ready events (the parent checks)
    else:
        # Windows scored back to back, each waited for on the GPU: killed while some are in flight.
        i = 0
        while True:
            tc.score_async(x, rows, "p16", out=outs[i % 4]).wait_stream()
            i += 1
            if i == 200:
                print("ready", flush=True)
    time.sleep(600)
"""


def _gpu_memory_mib(pid: int) -> int | None:
    """The GPU memory nvidia-smi reports for process `pid`, or None."""
    try:
        lines = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory",
                                "--format=csv,noheader,nounits"], capture_output=True, text=True,
                               timeout=20).stdout.splitlines()
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in lines:
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid):
            return int(fields[1])
    return None


@pytest.mark.parametrize("mode", ["waiting", "scoring"])
def test_a_client_killed_mid_window_leaves_nothing_behind(figures, probes, mode):
    weight, bias, data = probes
    s = start(data)
    try:
        with TorchClient(s.uds_target, timeout=30, events_in_flight=16) as survivor:
            x = torch.randn(T, H, device="cuda", dtype=torch.bfloat16)
            want = float64_scores(x, ROWS, weight, bias)
            # The survivor's scores go to a device output: a host one grows the staging of
            # whichever stream slot first serves one (1 MiB, once), which a slot the child held
            # can do after the kill and read as memory left behind.
            scores = torch.empty(len(ROWS), P, device="cuda")

            def served() -> float:
                survivor.score(x, ROWS, "p16", out=scores)
                return rel_error(scores, want)

            assert served() <= 1e-3

            def listed() -> int:
                return len(survivor.client.stub.ListBuffers(buffers_pb2.ListBuffersRequest(),
                                                             timeout=10).buffers)

            # The child's kind of request (device rows and output, answered when queued) first
            # from here, so that every stream slot already holds its graph: a graph captured for
            # the child would otherwise read as memory it left behind.
            rows = torch.arange(64, device="cuda", dtype=torch.int32)
            outs = [torch.zeros(64, P, device="cuda") for _ in range(4)]
            for i in range(200):
                survivor.score_async(x, rows, "p16", out=outs[i % 4]).wait_stream()
            torch.cuda.synchronize()
            assert wait_for(lambda: parked(s) == 0, 20)
            buffers_before = listed()
            handles_before = device_total(s, "probesidecar_ipc_handles_open")
            device_before = device_total(s, "probesidecar_device_memory_bytes")
            assert device_before > 0
            gpu_before = _gpu_memory_mib(s.process.pid)
            code = textwrap.dedent(CHILD).format(tests=str(pathlib.Path(__file__).parent),
                                                 target=s.uds_target, T=T, H=H, P=P, mode=mode)
            child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, text=True)
            try:
                line = child.stdout.readline()
                assert line.strip() == "ready", child.stderr.read()
                assert listed() > buffers_before
                if mode == "waiting":
                    assert wait_for(lambda: in_flight(s, "ScoreStream") >= 1, 10)
                killed = time.monotonic()
                child.send_signal(signal.SIGKILL)
                child.wait(timeout=10)
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait()
            # Others are served meanwhile.
            assert served() <= 1e-3
            released = wait_for(lambda: listed() == buffers_before, 20)
            handles = wait_for(
                lambda: device_total(s, "probesidecar_ipc_handles_open") == handles_before, 20)
            unparked = wait_for(lambda: parked(s) == 0, 20)
            settled_s = time.monotonic() - killed
            gpu_after = _gpu_memory_mib(s.process.pid)
            figures[f"killed_{mode}"] = {
                "buffers_released": released, "ipc_handles_closed": handles,
                "slots_back": unparked, "settled_s": round(settled_s, 3),
                "device_memory_bytes": [device_before,
                                        device_total(s, "probesidecar_device_memory_bytes")],
                "gpu_memory_mib": [gpu_before, gpu_after]}
            assert released and handles and unparked, (figures[f"killed_{mode}"], s.log()[-3000:])
            assert device_total(s, "probesidecar_device_memory_bytes") == device_before
            if gpu_before is not None and gpu_after is not None:
                assert gpu_after <= gpu_before + 2, (gpu_before, gpu_after)
            assert served() <= 1e-3
        assert s.process.poll() is None, s.log()
    finally:
        s.close()
