"""Stand-ins for CUDA and the sidecar, for a dry run of the benchmark on a CPU (worker.py
--cpu-dry-run): they run every line of the loop, the bookkeeping and the report, but time
nothing real. The fake client scores in float32 at once, on the host; its taps are the client's
real taps (probe_sidecar.tap, host ring) over a stand-in for the ScoreStream."""

from __future__ import annotations

import time
import types

import numpy as np
import torch

from probe_sidecar.client import ProbeSetInfo
from probe_sidecar.tap import HostRing, Tap
from probesidecar.v1 import probes_pb2, score_pb2

# The fake server's probe sets: they outlive a client, as the real server's do.
_PROBE_SETS: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}


class CpuEvent:
    def record(self, stream=None) -> None:
        self.at = time.perf_counter()

    def elapsed_time(self, later: "CpuEvent") -> float:  # milliseconds, like torch.cuda.Event
        return (later.at - self.at) * 1e3

    def synchronize(self) -> None:  # the CPU "GPU" is never behind
        pass


class CpuGraph:
    def __init__(self, step):
        self._step = step

    def replay(self) -> None:
        self._step()

    def pool(self):
        return None


class CpuDevice:
    name = "cpu"

    def event(self) -> CpuEvent:
        return CpuEvent()

    def current_stream(self):
        return None

    def synchronize(self) -> None:
        pass

    def capture(self, decoder, slot, tap, pool, step=None) -> CpuGraph:
        step = step or decoder.step
        return CpuGraph(lambda: step(slot, tap))

    def capturing(self) -> bool:
        return True  # a CpuGraph "replays" by running the step, hooks included

    def profile(self, graph, replays: int = 2) -> dict:
        return {"replays": replays, "kernels": [["cpu-step", 1, 0.0]]}

    def description(self) -> str:
        return "cpu (dry run)"


class FakeHandle:
    def __init__(self, pair):
        self._pair = pair  # like ScoreHandle: the event pair this request used

    def wait_stream(self, stream=None) -> None:
        pass


class FakeTorchClient:
    """TorchClient's calls that the benchmark makes, answered on the host. Event pairs are handed
    out like the real client's pool (last released, first reused), so the pair-reuse diagnostic
    runs too."""

    def __init__(self, mps: bool):
        self._free = [object() for _ in range(8)]
        info = types.SimpleNamespace(mps=mps, backend="cpu-dry-run", version="dry-run",
                                     git_commit="", device_name="cpu")
        self.client = types.SimpleNamespace(server_info=lambda: info,
                                            load_probe_set=self._load_probe_set)

    def _load_probe_set(self, name: str, *, data: bytes, replace: bool = False):
        from safetensors.torch import load

        tensors = load(data)
        _PROBE_SETS[name] = (tensors["weight"].float(), tensors["bias"].float())

    def score(self, hidden, rows, probe_set, *, out):
        weight, bias = _PROBE_SETS[probe_set]
        index = torch.as_tensor(rows, dtype=torch.long)
        out.copy_(torch.addmm(bias, hidden.float().index_select(0, index), weight.t()))

    def score_async(self, hidden, rows, probe_set, *, out, stream=None):
        self.score(hidden, rows, probe_set, out=out)
        pair = self._free.pop()
        self._free.append(pair)  # answered at once: released at once, reused next
        return FakeHandle(pair)

    def tap(self, probe_set, *, max_batch, window, submit="gpu", **options):
        weight, _ = _PROBE_SETS[probe_set]
        info = ProbeSetInfo(probes_pb2.ProbeSetInfo(
            name=probe_set, num_probes=weight.shape[0], hidden_size=weight.shape[1],
            probes=[probes_pb2.Probe(name=f"p{i}") for i in range(weight.shape[0])]))
        ring = HostRing(probe_set, 0, weight.shape[1], max_batch, window, "bfloat16")
        return Tap(ring, FakeStream(), info, submit=submit, **options)

    def close(self) -> None:
        pass


class FakeStream:
    """The ScoreStreamPipeline's submit(), answered at once from the inline bf16 rows."""

    def submit(self, request, on_answer):
        weight, bias = _PROBE_SETS[request.probe_set]
        rows, hidden = request.activations.shape
        bits = np.frombuffer(request.activations.data, dtype=np.uint16).reshape(rows, hidden)
        x = torch.from_numpy(bits.astype(np.int16)).view(torch.bfloat16).float()
        scores = torch.addmm(bias, x, weight.t()).numpy().astype("<f4")
        on_answer(score_pb2.ScoreResponse(num_rows=rows, num_probes=weight.shape[0],
                                          scores=scores.tobytes()), None)

    def close(self) -> None:
        pass
