"""What the GPU fault tests share: a probe set, a GPU stream that stays
busy for a chosen time (torch.cuda._sleep: the "client whose GPU work never completes"), Score
requests ordered behind such a stream through the client's IPC ready event, and the server's
figures read from /metrics. Imported only by GPU test modules (it needs torch)."""

from __future__ import annotations

import time

import torch

from probe_files import bf16_probes, bf16_tensor_file
from probesidecar.v1 import score_pb2
from server_state import device_total, metric

T, H, P = 4096, 4096, 16


def make_probes(seed: int = 7) -> tuple[torch.Tensor, torch.Tensor, bytes]:
    weight, bias = bf16_probes(P, H, generator=torch.Generator(device="cuda").manual_seed(seed))
    return weight, bias, bf16_tensor_file(weight, bias, {"activation": "none"})


_CYCLES_PER_SECOND: list[float] = []


def cycles_per_second() -> float:
    """GPU clock cycles per second as torch.cuda._sleep counts them (measured once)."""
    if not _CYCLES_PER_SECOND:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(10_000_000)  # warm
        start.record()
        torch.cuda._sleep(200_000_000)
        end.record()
        end.synchronize()
        _CYCLES_PER_SECOND.append(200_000_000 / (start.elapsed_time(end) / 1e3))
    return _CYCLES_PER_SECOND[0]


def busy_stream(seconds: float) -> torch.cuda.Stream:
    """A new stream that spins on the GPU for about `seconds` (a client's stuck decode step)."""
    stream = torch.cuda.Stream()
    cycles = int(seconds * cycles_per_second())
    with torch.cuda.stream(stream):
        torch.cuda._sleep(cycles)
    return stream


def request_after(tc, stream: torch.cuda.Stream, x: torch.Tensor, rows, probe_set: str,
                  out: torch.Tensor | None = None) -> score_pb2.ScoreRequest:
    """A Score whose ready event is recorded on `stream` now: the server's stream waits on the
    GPU until `stream` gets there. Host rows; scores inline unless `out` is given (then a done
    event too: enqueue-only)."""
    pool = tc._event_pool(x.device)
    pair = pool.acquire()  # not given back (make the TorchClient with events_in_flight to spare)
    pair.ready.record(stream)
    request = score_pb2.ScoreRequest(probe_set=probe_set, session_id=tc.session_id,
                                     ready_event=pair.ready_id)
    request.activations.CopyFrom(tc.tensor_ref(x))
    request.rows.extend(int(r) for r in rows)
    if out is not None:
        request.output.CopyFrom(tc.tensor_ref(out))
        request.done_event = pair.done_id
    return request


def parked(server) -> float:
    return device_total(server, "probesidecar_stream_slots_parked")


def in_flight(server, rpc: str = "Score") -> float:
    return metric(server, "probesidecar_rpc_in_flight", rpc=rpc)


def latencies_ms(call, n: int) -> list[float]:
    out = []
    for _ in range(n):
        start = time.perf_counter()
        call()
        out.append((time.perf_counter() - start) * 1e3)
    return out


def summary(values: list[float]) -> dict:
    v = sorted(values)
    return {"n": len(v), "p50_ms": round(v[len(v) // 2], 3),
            "p99_ms": round(v[min(len(v) - 1, int(len(v) * 0.99))], 3), "max_ms": round(v[-1], 3)}
