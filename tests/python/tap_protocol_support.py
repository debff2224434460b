"""The Python half of the tap protocol's cross-language checks (docs/tap-protocol.md), shared by
test_tap_protocol.py (CPU) and test_gpu_tap_protocol.py (GPU).

A script of ring operations (the text format of kernels/tap_write/tap_protocol_script.h) runs on
both sides: here with the Python writer (probe_sidecar.tap_op: the operator's CPU and CUDA
implementations, the close), there with the C++ write and close kernels or their CPU reference.
At each `read` checkpoint the writer's side plays the sidecar (it writes the window's scores where
its own code says the output is) and saves the ring; the other side's reader then reads every
checkpoint's window. The model here, like the one there, says what each window must read from the
slot rules alone.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import random
import subprocess

import numpy as np
import pytest
import torch

from conftest import BIN
from probe_sidecar import tap_op

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def binary(env: str, name: str) -> pathlib.Path:
    """A C++ side binary: $<env>, else next to the server binary (build/bin, a bundle's bin)."""
    path = pathlib.Path(os.environ.get(env) or BIN.parent / name)
    if not path.exists():
        message = (f"{path} is missing (build the {name} target, or set {env})")
        if os.environ.get(env) or os.environ.get("PROBE_SIDECAR_REQUIRE_GPU") == "1":
            pytest.fail(message, pytrace=False)
        pytest.skip(message)
    return path


def run(tool: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(tool), *args], capture_output=True, text=True, timeout=300)


# --- scripts --------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Op:
    kind: str  # "write", "close" or "read"
    n: int = 0
    stride_extra: int = 0
    count_kind: str = "none"  # "none", "i32", "i64"
    count: int = 0
    half: int = 0
    next_base: int = 0
    next_limit: int = 0
    record: bool = True
    steps: int = 0


@dataclasses.dataclass
class Script:
    window: int
    max_batch: int
    hidden: int
    probes: int
    dtype: str
    device_scores: bool
    ops: list[Op] = dataclasses.field(default_factory=list)

    def layout(self) -> tap_op.RingLayout:
        return tap_op.RingLayout.make(window=self.window, max_batch=self.max_batch,
                                      hidden_size=self.hidden, num_probes=self.probes,
                                      dtype=DTYPES[self.dtype], device_scores=self.device_scores)

    @property
    def reads(self) -> list[Op]:
        return [op for op in self.ops if op.kind == "read"]

    def text(self) -> str:
        lines = [f"ring {self.window} {self.max_batch} {self.hidden} {self.probes} {self.dtype} "
                 f"{int(self.device_scores)}"]
        for op in self.ops:
            if op.kind == "write":
                lines.append(f"write {op.n} {op.stride_extra} {op.count_kind} {op.count}")
            elif op.kind == "close":
                lines.append(f"close {op.half} {op.next_base} {op.next_limit} {int(op.record)}")
            else:
                lines.append(f"read {op.half} {op.steps}")
        return "\n".join(lines) + "\n"

    def describe(self) -> str:
        return (f"K {self.window} max_batch {self.max_batch} H {self.hidden} P {self.probes} "
                f"{self.dtype}{'' if self.device_scores else ' host ring'}")


def parse_script(text: str) -> Script:
    script = None
    for line in text.splitlines():
        words = line.split("#")[0].split()
        if not words:
            continue
        if words[0] == "ring":
            k, mb, h, p = (int(w) for w in words[1:5])
            script = Script(k, mb, h, p, words[5], words[6] == "1")
            continue
        assert script is not None, "the ring line comes first"
        if words[0] == "write":
            script.ops.append(Op("write", n=int(words[1]), stride_extra=int(words[2]),
                                 count_kind=words[3], count=int(words[4])))
        elif words[0] == "close":
            script.ops.append(Op("close", half=int(words[1]), next_base=int(words[2]),
                                 next_limit=int(words[3]), record=words[4] == "1"))
        else:
            assert words[0] == "read", line
            script.ops.append(Op("read", half=int(words[1]), steps=int(words[2])))
    assert script is not None
    return script


def cpp_scenario(tool: pathlib.Path, window: int, max_batch: int, hidden: int, probes: int,
                 dtype: str, device_scores: bool) -> Script:
    """The C++ side's wrapped-ring scenario (WrappedScenario) for this shape."""
    done = run(tool, "scenario", str(window), str(max_batch), str(hidden), str(probes), dtype,
               str(int(device_scores)))
    assert done.returncode == 0, done.stderr
    return parse_script(done.stdout)


def random_script(seed: int, window: int, max_batch: int, hidden: int, probes: int, dtype: str,
                  device_scores: bool, windows: int = 12) -> Script:
    """Windows as a tap makes them, drawn at random: full, partial, empty and overfull (the spare
    slot), diverted ones followed by a lost window (its close keeps the half's count), row counts
    on the device in and out of range, strided sources; a read after every window that is sent,
    and after a lost one, a read of its half's last window (which it must not have touched)."""
    rng = random.Random(seed)
    s = Script(window, max_batch, hidden, probes, dtype, device_scores)
    half, last_steps, lose_next = 0, [0, 0], False
    for _ in range(windows):
        lost = lose_next
        writes = rng.choice([0, 1, window, window, window + rng.randint(1, 3),
                             rng.randint(1, window)])
        for _ in range(writes):
            n = rng.randint(1, max_batch)
            kind = rng.choice(["none", "i32", "i64"])
            count = 0
            if kind != "none":
                count = rng.choice([n, rng.randint(0, n), -rng.randint(1, 5), n + rng.randint(1, 5)]
                                   + ([1 << 40, -(1 << 33)] if kind == "i64" else []))
            s.ops.append(Op("write", n=n, stride_extra=rng.choice([0, 0, 1, 3, 8]),
                            count_kind=kind, count=count))
        divert = rng.random() < 0.25
        base = (1 - half) * window
        s.ops.append(Op("close", half=half, next_base=base,
                        next_limit=base if divert else base + window, record=not lost))
        if lost:
            if last_steps[half]:
                s.ops.append(Op("read", half=half, steps=last_steps[half]))
        else:
            steps = min(max(writes, 1), window) if rng.random() < 0.7 else rng.randint(1, window)
            s.ops.append(Op("read", half=half, steps=steps))
            last_steps[half] = steps
        lose_next = divert
        half = 1 - half
    return s


# --- what the writer writes, what a reader must read -----------------------------------------


def source_values(write: int, rows: int, cols: int) -> np.ndarray:
    """SourceValue: multiples of 1/4 in [-12, 12] (exact in every dtype), float64 [rows, cols]."""
    r = np.arange(rows)[:, None]
    c = np.arange(cols)[None, :]
    return ((write * 37 + r * 11 + c * 3) % 97 - 48) / 4.0


def score_values(checkpoint: int, rows: int, probes: int) -> np.ndarray:
    """ScoreValue, float32 [rows, probes]."""
    r = np.arange(rows)[:, None]
    p = np.arange(probes)[None, :]
    return (((checkpoint * 13 + r * 7 + p * 5) % 101 - 50) / 8.0).astype(np.float32)


@dataclasses.dataclass
class WindowRead:
    rows: np.ndarray  # float32 [steps * max_batch * H], NaN: never written
    counts: np.ndarray  # int32 [steps], -1: never written
    writes: int
    scores: np.ndarray | None  # float32 [steps * max_batch * P]


def model(s: Script) -> list[WindowRead]:
    """What every checkpoint must read, from the slot rules (docs/tap-protocol.md) alone."""
    k, spare = s.window, 2 * s.window
    source = np.full((spare + 1, s.max_batch), -1, np.int64)  # the write each row last came from
    counts = np.full(spare + 1, -1, np.int32)
    next_slot, limit, writes, half_writes = 0, k, 0, [0, 0]
    write = checkpoint = 0
    out = []
    for op in s.ops:
        if op.kind == "write":
            target = next_slot if next_slot < limit else spare
            source[target, :op.n] = write
            counts[target] = op.n if op.count_kind == "none" else min(max(op.count, 0), op.n)
            next_slot = min(next_slot + 1, limit)
            writes += 1
            write += 1
        elif op.kind == "close":
            if op.record:
                half_writes[op.half] = writes
            next_slot, limit, writes = op.next_base, op.next_limit, 0
        else:
            first = op.half * k
            src = source[first:first + op.steps, :, None]  # [steps, max_batch, 1]
            r = np.arange(s.max_batch)[None, :, None]
            c = np.arange(s.hidden)[None, None, :]
            values = ((src * 37 + r * 11 + c * 3) % 97 - 48) / 4.0  # SourceValue
            rows = np.where(src >= 0, values, np.nan).astype(np.float32)
            scores = (score_values(checkpoint, op.steps * s.max_batch, s.probes).ravel()
                      if s.device_scores else None)
            out.append(WindowRead(rows.ravel(), counts[first:first + op.steps].copy(),
                                  half_writes[op.half], scores))
            checkpoint += 1
    return out


def read_window(raw: torch.Tensor, layout: tap_op.RingLayout, dtype: torch.dtype, half: int,
                steps: int) -> WindowRead:
    """The Python reader: the window's views where the Python client reads them
    (RingLayout.window_views: what a CUDA ring's delivery copies, what a CPU ring sends inline);
    `raw` on the host or the device."""
    views = layout.window_views(raw, half, steps, dtype)
    return WindowRead(views.rows.float().cpu().numpy().ravel(), views.counts.cpu().numpy().copy(),
                      int(views.writes.cpu()[0]),
                      None if views.scores is None else views.scores.cpu().numpy().ravel())


def compare_window(want: WindowRead, got: WindowRead, where: str) -> list[str]:
    """Every element: NaN exactly where NaN is wanted, every other value equal."""
    problems = []

    def check(name: str, w: np.ndarray, g: np.ndarray) -> None:
        if w.shape != g.shape:
            problems.append(f"{where}: {name} has shape {g.shape}, want {w.shape}")
            return
        bad = np.flatnonzero(~((w == g) | (np.isnan(w) & np.isnan(g))))
        if len(bad):
            problems.append(f"{where}: {len(bad)} of {w.size} {name} differ, first [{bad[0]}] = "
                            f"{g[bad[0]]}, want {w[bad[0]]}")

    check("rows", want.rows, got.rows)
    check("counts", want.counts.astype(np.float64), got.counts.astype(np.float64))
    if want.writes != got.writes:
        problems.append(f"{where}: write count {got.writes}, want {want.writes}")
    if (want.scores is None) != (got.scores is None):
        problems.append(f"{where}: scores present {got.scores is not None}, want "
                        f"{want.scores is not None}")
    elif want.scores is not None and got.scores is not None:
        check("scores", want.scores, got.scores)
    return problems


def part_of(layout: tap_op.RingLayout, at: int) -> str:
    """Which part of the ring byte `at` lies in."""
    name = max((o, n) for n, o in layout.offsets.items() if o <= at)[1]
    if name == "slots":
        return f"slots: slot {at // layout.slot_bytes} byte {at % layout.slot_bytes}"
    if name == "meta":
        return f"meta [{(at - layout.offsets['meta']) // 8}]"
    return name


def compare_rings(want: bytes, got: bytes, layout: tap_op.RingLayout, where: str) -> list[str]:
    if want == got:
        return []
    if len(want) != len(got):
        return [f"{where}: {len(got)} bytes, want {len(want)}"]
    a, b = np.frombuffer(want, np.uint8), np.frombuffer(got, np.uint8)
    bad = np.flatnonzero(a != b)
    return [f"{where}: {len(bad)} bytes differ, the first at {bad[0]} ({part_of(layout, bad[0])}):"
            f" {b[bad[0]]}, want {a[bad[0]]}"]


# --- the Python writer -----------------------------------------------------------------------


def poisoned_ring(layout: tap_op.RingLayout, device: str | torch.device) -> torch.Tensor:
    """0xff bytes everywhere (NaN in every dtype, -1 in counts), the counters initial_meta(K)."""
    raw = torch.full((layout.nbytes,), 255, dtype=torch.uint8, device=device)
    layout.view(raw, "meta", torch.int64, tap_op.META_SIZE).copy_(
        torch.tensor(tap_op.initial_meta(layout.window), dtype=torch.int64))
    return raw


def run_python(s: Script, device: str, impl: str = "op") -> list[bytes]:
    """The script with the Python writer on `device`: the tap operator (impl "op": its CPU
    implementation, or on CUDA the Triton kernels or torch operations as PROBE_SIDECAR_TAP_KERNEL
    says), its torch-operations implementation called directly ("torch"), or its Triton kernels
    called directly ("triton": also on host tensors, in Triton's interpreter); the close
    (tap_op.close_window, or the Triton close kernel);
    at each checkpoint the scores written at the window's output offset (window_parts), as the
    sidecar writes them. The ring's bytes at every checkpoint and at the end."""
    layout = s.layout()
    dtype = DTYPES[s.dtype]
    raw = poisoned_ring(layout, device)
    args = layout.op_args()
    saved, write, checkpoint = [], 0, 0
    for op in s.ops:
        if op.kind == "write":
            stride = s.hidden + op.stride_extra
            buffer = torch.full((op.n, stride), float("nan"), dtype=torch.float64)
            buffer[:, :s.hidden] = torch.from_numpy(source_values(write, op.n, s.hidden))
            hidden = buffer.to(dtype).to(device)[:, :s.hidden]
            num_rows = None
            if op.count_kind != "none":
                kind = torch.int32 if op.count_kind == "i32" else torch.int64
                num_rows = torch.tensor([op.count], device=device, dtype=kind)
            if impl == "torch":
                tap_op._tap_write_cuda_torch(hidden, raw, args, None, num_rows, False)
            elif impl == "triton":
                tap_op._tap_write_cuda(hidden, raw, args, None, num_rows, False)
            else:
                tap_op.tap_write(hidden, raw, args, num_rows=num_rows)
            write += 1
        elif op.kind == "close":
            assert op.next_limit in (op.next_base, op.next_base + s.window), op
            if impl == "triton":
                kernels = tap_op._triton_kernels()
                assert kernels is not None, "no Triton"
                kernels[1][(1,)](raw, layout.offsets["meta"], op.half, op.next_base,
                                 op.next_limit, int(op.record))
            else:
                tap_op.close_window(raw, layout, op.half, op.next_base,
                                    divert=op.next_limit == op.next_base, record=op.record)
        else:
            parts = layout.window_parts(op.half, op.steps)
            if parts.scores is not None:
                scores = torch.from_numpy(score_values(checkpoint, parts.rows, s.probes).ravel())
                raw[parts.scores:parts.scores + scores.numel() * 4].copy_(
                    scores.view(torch.uint8).to(device))
            saved.append(raw.cpu().numpy().tobytes())
            checkpoint += 1
    saved.append(raw.cpu().numpy().tobytes())
    return saved


# --- the files the two sides exchange -------------------------------------------------------


def expected_bytes(windows: list[WindowRead]) -> bytes:
    out = bytearray()
    for w in windows:
        out += w.rows.astype("<f4").tobytes() + w.counts.astype("<i4").tobytes()
        out += np.array([w.writes], "<i8").tobytes()
        if w.scores is not None:
            out += w.scores.astype("<f4").tobytes()
    return bytes(out)


def parse_expected(s: Script, data: bytes) -> list[WindowRead]:
    out, at = [], 0

    def take(dtype: str, count: int) -> np.ndarray:
        nonlocal at
        size = np.dtype(dtype).itemsize * count
        assert at + size <= len(data), "expected.bin is too short"
        array = np.frombuffer(data[at:at + size], dtype).copy()
        at += size
        return array

    for op in s.reads:
        rows = op.steps * s.max_batch
        r = take("<f4", rows * s.hidden)
        c = take("<i4", op.steps)
        w = int(take("<i8", 1)[0])
        out.append(WindowRead(r, c, w, take("<f4", rows * s.probes) if s.device_scores else None))
    assert at == len(data), "expected.bin is too long"
    return out


def save_run(directory: pathlib.Path, s: Script, rings: list[bytes]) -> pathlib.Path:
    """script.txt, rings.bin and expected.bin (the Python model) in `directory`; the script's
    path."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "script.txt").write_text(s.text())
    (directory / "rings.bin").write_bytes(b"".join(rings))
    (directory / "expected.bin").write_bytes(expected_bytes(model(s)))
    return directory / "script.txt"


def load_rings(directory: pathlib.Path, s: Script) -> list[bytes]:
    data = (directory / "rings.bin").read_bytes()
    size = s.layout().nbytes
    assert len(data) == size * (len(s.reads) + 1), (len(data), size)
    return [data[i:i + size] for i in range(0, len(data), size)]


def check_cpp_rings(directory: pathlib.Path, s: Script, device: str,
                    python_rings: list[list[bytes]]) -> list[str]:
    """Rings the C++ side saved in `directory` (its expected.bin: its model), read by the Python
    reader (on `device`) against the C++ model and the Python one, and every ring byte for byte
    against each of `python_rings` (the same script by the Python writers)."""
    layout, dtype = s.layout(), DTYPES[s.dtype]
    rings = load_rings(directory, s)
    cpp_model = parse_expected(s, (directory / "expected.bin").read_bytes())
    py_model = model(s)
    problems = []
    for i, op in enumerate(s.reads):
        raw = torch.frombuffer(bytearray(rings[i]), dtype=torch.uint8).to(device)
        got = read_window(raw, layout, dtype, op.half, op.steps)
        problems += compare_window(cpp_model[i], got, f"checkpoint {i} (C++ model)")
        problems += compare_window(py_model[i], got, f"checkpoint {i} (Python model)")
    for j, other in enumerate(python_rings):
        problems += compare_ring_runs(rings, other, layout, f"Python writer {j}")
    return problems


# --- gather mode: the Python writers against each other and a model --------------------------
# (The C++ client has no gather mode: these scripts are the Python operator's alone.)


@dataclasses.dataclass(frozen=True)
class GatherOp:
    kind: str  # "arm", "disarm", "follow", "unfollow", "write" or "close"
    rows: tuple[int, ...] = ()  # arm: the row indices
    lengths: tuple[int, ...] | None = None  # write: each request's tokens (`starts`), or none
    residual: bool = False  # write: with a residual stream
    half: int = 0  # close


@dataclasses.dataclass
class GatherScript:
    window: int
    max_batch: int
    hidden: int
    dtype: str
    ops: list[GatherOp]

    @property
    def tokens(self) -> int:
        """The rows of every write's `hidden` (an engine's padded token count)."""
        return 3 * self.max_batch

    def layout(self) -> tap_op.RingLayout:
        return tap_op.RingLayout.make(window=self.window, max_batch=self.max_batch,
                                      hidden_size=self.hidden, num_probes=1,
                                      dtype=DTYPES[self.dtype], device_scores=False)


def gather_script(seed: int, window: int, max_batch: int, hidden: int, dtype: str,
                  ops: int = 40) -> GatherScript:
    """Arms of 0 to max_batch rows, following on and off, disarms, writes with and without the
    engine's `starts` (non-empty requests first, padding last) and a residual stream, and closes
    that alternate the halves, in a random order."""
    rng = random.Random(seed)
    s = GatherScript(window, max_batch, hidden, dtype, [])
    half = 0
    for _ in range(ops):
        kind = rng.choice(["arm", "arm", "disarm", "follow", "unfollow", "write", "write", "write",
                           "write", "close"])
        if kind == "arm":
            count = rng.randint(0, max_batch)
            s.ops.append(GatherOp("arm", rows=tuple(rng.randrange(s.tokens)
                                                    for _ in range(count))))
        elif kind == "write":
            lengths = None
            if rng.random() < 0.8:
                requests = rng.randint(0, max_batch)
                lengths = tuple([rng.randint(1, 3) for _ in range(requests)]
                                + [0] * (max_batch - requests))
            s.ops.append(GatherOp("write", lengths=lengths, residual=rng.random() < 0.5))
        elif kind == "close":
            s.ops.append(GatherOp("close", half=half))
            half = 1 - half
        else:
            s.ops.append(GatherOp(kind))
    return s


def gather_scripts() -> list[GatherScript]:
    """The gather scripts of the tests: a window of one step, one row a step, odd sizes."""
    shapes = [(3, 4, 40, "bf16"), (2, 1, 7, "fp32"), (1, 5, 33, "fp16"), (4, 3, 300, "bf16")]
    return [gather_script(seed, k, mb, h, dtype) for seed, (k, mb, h, dtype) in enumerate(shapes)]


def _gather_inputs(s: GatherScript, write: int, op: GatherOp
                   ) -> tuple[np.ndarray, np.ndarray | None, np.ndarray | None]:
    """A write's hidden [tokens, H] and residual (float64, multiples of 1/4: every sum exact in
    every dtype) and starts [max_batch + 1] (int64, or None)."""
    hidden = source_values(write, s.tokens, s.hidden)
    residual = source_values(write + 1000, s.tokens, s.hidden) if op.residual else None
    starts = None if op.lengths is None else np.concatenate([[0], np.cumsum(op.lengths)])
    return hidden, residual, starts


def run_gather(s: GatherScript, impl: str, device: str = "cpu") -> list[bytes]:
    """The script with one Python writer (impl "op": the operator as dispatched; "torch": its
    torch-operations implementation; "triton": its Triton kernels, on host tensors in Triton's
    interpreter): the ring's bytes after every operation."""
    layout, dtype = s.layout(), DTYPES[s.dtype]
    raw = poisoned_ring(layout, device)
    args = layout.op_args()
    saved, write = [], 0
    for op in s.ops:
        if op.kind == "arm":
            rows = torch.tensor(list(op.rows) or [0], dtype=torch.int64, device=device)
            tap_op.arm(raw, layout, rows, len(op.rows))
        elif op.kind == "disarm":
            tap_op.disarm(raw, layout)
        elif op.kind in ("follow", "unfollow"):
            tap_op.follow_starts(raw, layout, on=op.kind == "follow")
        elif op.kind == "close":
            tap_op.close_window(raw, layout, op.half, (1 - op.half) * s.window)
        else:
            h, r, st = _gather_inputs(s, write, op)
            hidden = torch.from_numpy(h).to(dtype).to(device)
            residual = None if r is None else torch.from_numpy(r).to(dtype).to(device)
            starts = None if st is None else torch.from_numpy(st).to(torch.int32).to(device)
            if impl == "torch":
                tap_op._tap_write_cuda_torch(hidden, raw, args, residual, None, True, starts)
            elif impl == "triton":
                tap_op._tap_write_cuda(hidden, raw, args, residual, None, True, starts)
            else:
                tap_op.tap_write(hidden, raw, args, residual=residual, gather=True, starts=starts)
            write += 1
        saved.append(raw.cpu().numpy().tobytes())
    return saved


def compare_ring_runs(want: list[bytes], got: list[bytes], layout: tap_op.RingLayout,
                      where: str) -> list[str]:
    """Two writers' rings of one script (each after the same operations), byte for byte."""
    problems = [] if len(want) == len(got) else [f"{where}: {len(got)} rings, want {len(want)}"]
    for i, (a, b) in enumerate(zip(want, got)):
        problems += compare_rings(a, b, layout, f"{where}, ring {i}")
    return problems


def check_gather_writer(s: GatherScript, rings: list[bytes], writer: str) -> list[str]:
    """A writer's rings of gather script `s` against those of the operator's CPU implementation,
    which are checked against the slot rules first."""
    where = f"K {s.window} max_batch {s.max_batch} {s.dtype}"
    cpu = run_gather(s, "op")
    problems = [f"{where}: {p}" for p in check_gather_rings(s, cpu)]
    return problems + compare_ring_runs(cpu, rings, s.layout(), f"{where}, {writer}")


def check_gather_rings(s: GatherScript, rings: list[bytes]) -> list[str]:
    """The rings after every operation against the slot rules (docs/tap-protocol.md, gather
    mode): every slot's rows (NaN where never written), counts and counters."""
    k, mb, spare = s.window, s.max_batch, 2 * s.window
    layout, dtype = s.layout(), DTYPES[s.dtype]
    slots = np.full((spare + 1, mb, s.hidden), np.nan)
    counts = np.full(spare + 1, -1, np.int64)
    meta = tap_op.initial_meta(k)
    armed_rows: list[int] = []  # the last arm's
    problems, write = [], 0
    for i, (op, ring) in enumerate(zip(s.ops, rings)):
        if op.kind == "arm":
            meta[tap_op.META_ARMED] = len(op.rows)
            armed_rows = list(op.rows)
        elif op.kind == "disarm":
            meta[tap_op.META_ARMED] = meta[tap_op.META_REST]
        elif op.kind in ("follow", "unfollow"):
            value = tap_op.ARMED_FOLLOW if op.kind == "follow" else tap_op.ARMED_OFF
            meta[tap_op.META_ARMED] = meta[tap_op.META_REST] = value
        elif op.kind == "close":
            meta[tap_op.META_HALF_WRITES + op.half] = meta[tap_op.META_WRITES]
            meta[tap_op.META_NEXT_SLOT] = (1 - op.half) * k
            meta[tap_op.META_LIMIT] = (1 - op.half) * k + k
            meta[tap_op.META_WRITES] = 0
        else:
            h, r, st = _gather_inputs(s, write, op)
            source = h if r is None else h + r
            armed = meta[tap_op.META_ARMED]
            index = None
            if armed >= 0:
                index = armed_rows
            elif armed == tap_op.ARMED_FOLLOW and st is not None:
                index = [int(st[j + 1]) - 1 for j in range(mb) if st[j + 1] > st[j]]
            if index is not None:
                slot, limit = meta[tap_op.META_NEXT_SLOT], meta[tap_op.META_LIMIT]
                target = slot if slot < limit else spare
                slots[target, :len(index)] = source[index]
                counts[target] = len(index)
                meta[tap_op.META_NEXT_SLOT] = min(slot + 1, limit)
                meta[tap_op.META_WRITES] += 1
                meta[tap_op.META_ARMED] = meta[tap_op.META_REST]
            write += 1
        raw = torch.frombuffer(bytearray(ring), dtype=torch.uint8)
        got_slots = layout.view(raw, "slots", dtype, slots.size).double().numpy().reshape(
            slots.shape)
        got_counts = layout.view(raw, "counts", torch.int32, spare + 1).numpy()
        got_meta = layout.view(raw, "meta", torch.int64, tap_op.META_SIZE).tolist()
        where = f"after operation {i} ({op.kind})"
        bad = np.argwhere(~((got_slots == slots) | (np.isnan(got_slots) & np.isnan(slots))))
        if len(bad):
            problems.append(f"{where}: {len(bad)} slot elements differ, the first at "
                            f"{tuple(bad[0])}")
        if got_counts.tolist() != counts.tolist():
            problems.append(f"{where}: counts {got_counts.tolist()}, want {counts.tolist()}")
        if got_meta != meta:
            problems.append(f"{where}: meta {got_meta}, want {meta}")
    if len(rings) != len(s.ops):
        problems.append(f"{len(rings)} rings for {len(s.ops)} operations")
    return problems
