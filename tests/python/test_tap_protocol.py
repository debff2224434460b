"""The tap protocol's two sides agree (docs/tap-protocol.md), on the CPU: the C++ side
(kernels/tap_write/tap_write.h, printed by tap_protocol_tool) and the Python side
(probe_sidecar.tap_op) have the same counters under the same names, lay out the same rings, name
the same parts of every window, and write the same bytes; each side's reader reads the other
side's rings as the slot rules say, and the table in the spec is the constants both have.

tests/python/test_gpu_tap_protocol.py does the same with the GPU writers (the C++ write and close
kernels, the Triton kernels).
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest

torch = pytest.importorskip("torch")

import tap_protocol_support as tp  # noqa: E402
from probe_sidecar import tap_op  # noqa: E402

ROOT = pathlib.Path(__file__).resolve().parents[2]

# (K, max_batch, H, P, dtype, device scores): small and odd shapes, a window of one step, a CPU
# ring (no scores or rows parts), a part exactly one alignment unit long.
CONFIGS = [(3, 4, 40, 2, "bf16", True), (1, 1, 1, 1, "fp32", True),
           (16, 64, 4096, 16, "bf16", True), (5, 3, 7, 3, "fp16", False),
           (2, 64, 1, 1, "fp32", False), (7, 5, 33, 17, "fp16", True), (4, 8, 64, 8, "fp32", True)]


@pytest.fixture(scope="module")
def tool():
    return tp.binary("PROBE_SIDECAR_TAP_PROTOCOL_TOOL", "tap_protocol_tool")


@pytest.fixture(scope="module")
def cpp(tool):
    done = tp.run(tool, "layout", *(",".join(str(int(v) if isinstance(v, bool) else v) for v in c)
                                    for c in CONFIGS))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def python_name(cpp_name: str) -> str:
    """kTapMetaNextSlot -> META_NEXT_SLOT, kTapArmedOff -> ARMED_OFF, kTapRingAlign ->
    RING_ALIGN."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", cpp_name.removeprefix("kTap")).upper()


def test_the_counters_have_the_same_names_and_values_on_both_sides(cpp):
    constants = cpp["constants"]
    for name, value in constants.items():
        assert getattr(tap_op, python_name(name), None) == value, name
    # ...and Python has none that C++ lacks.
    ours = {n for n in vars(tap_op) if re.fullmatch(r"(META|ARMED|RING)_[A-Z_]+", n)}
    assert ours == {python_name(n) for n in constants}


def test_layouts_initial_counters_and_window_parts_are_the_same(cpp):
    assert len(cpp["configs"]) == len(CONFIGS)
    for config, entry in zip(CONFIGS, cpp["configs"]):
        k, mb, h, p, dtype, device_scores = config
        assert entry["config"] == list(config)
        layout = tap_op.RingLayout.make(window=k, max_batch=mb, hidden_size=h, num_probes=p,
                                        dtype=tp.DTYPES[dtype], device_scores=device_scores)
        want = entry["layout"]
        for part in ("slots", "scores", "rows", "counts", "gather", "meta"):
            assert layout.offsets.get(part) == want[part], (config, part)
        assert (layout.nbytes, layout.slot_bytes, layout.element_size, layout.overflow_slot) == (
            want["total_bytes"], want["slot_bytes"], want["element_size"], want["overflow_slot"])
        assert tap_op.initial_meta(k) == entry["initial_meta"], config
        raw = torch.zeros(layout.nbytes, dtype=torch.uint8)
        assert layout.initialise(raw, tp.DTYPES[dtype])["meta"].tolist() == entry["initial_meta"]
        windows = [dataclass_dict(layout.window_parts(w["half"], w["steps"]))
                   for w in entry["windows"]]
        assert windows == entry["windows"], config


def dataclass_dict(parts: tap_op.WindowParts) -> dict:
    return {name: getattr(parts, name) for name in ("half", "steps", "first_slot", "rows",
                                                    "activations", "device_rows", "counts",
                                                    "scores", "writes")}


def test_the_specs_tables_are_what_both_sides_have(cpp):
    """docs/tap-protocol.md's tables of counters and parts: every row names the C++ and the Python
    constant and its value, which both sides have; every counter and part is in them."""
    text = (ROOT / "docs" / "tap-protocol.md").read_text()
    rows = re.findall(r"^\|\s*`(kTap\w+)`\s*\|\s*`(\w+)`\s*\|\s*(-?\d+)\s*\|", text, re.M)
    assert rows, "no constants table in docs/tap-protocol.md"
    for cpp_name, py_name, value in rows:
        assert cpp["constants"][cpp_name] == int(value), cpp_name
        assert python_name(cpp_name) == py_name
        assert getattr(tap_op, py_name) == int(value), py_name
    assert {r[0] for r in rows} == set(cpp["constants"])
    parts = re.findall(r"^\|\s*\d\s*\|\s*`(\w+)`\s*\|", text, re.M)
    layout = tap_op.RingLayout.make(window=2, max_batch=2, hidden_size=2, num_probes=1,
                                    dtype=torch.float32, device_scores=True)
    assert parts == list(layout.offsets), "the parts table is the parts, in their order"


def scripts(tool) -> list[tp.Script]:
    out = []
    for k, mb, h, p in ((3, 4, 40, 2), (2, 5, 33, 3), (1, 2, 9, 1), (4, 1, 300, 4)):
        for dtype in tp.DTYPES:
            for device_scores in (True, False):
                out.append(tp.cpp_scenario(tool, k, mb, h, p, dtype, device_scores))
    for seed in range(8):
        k, mb, h = 1 + seed % 4, 1 + seed % 4 * 2, 5 + 7 * seed
        out.append(tp.random_script(seed, k, mb, h, 1 + seed % 3, list(tp.DTYPES)[seed % 3],
                                    seed % 2 == 0))
    return out


def test_the_scenarios_keep_their_shape_and_bad_shapes_are_refused(tool):
    """A one-step window is a one-step window (not widened); a shape the ring line refuses is
    refused by the scenario command too, with a usage message."""
    one = tp.cpp_scenario(tool, 1, 2, 9, 1, "fp32", True)
    assert one.window == 1 and one.reads and all(op.steps == 1 for op in one.reads)
    assert sum(op.kind == "write" for op in one.ops) > len(one.reads)  # writes past the end
    for bad in (("3", "0", "4", "1", "fp32", "1"), ("0", "2", "4", "1", "fp32", "1"),
                ("3", "2", "4", "1", "fp64", "1"), ("3", "2", "99999999999", "1", "fp32", "1"),
                ("3", "2", "4", "1", "fp32")):
        done = tp.run(tool, "scenario", *bad)
        assert done.returncode == 2 and "usage: scenario" in done.stderr, (bad, done.stderr)


def test_the_python_writers_write_the_cpp_references_bytes_and_each_side_reads_the_other(
        tool, tmp_path):
    """Every script: the C++ CPU reference's rings (TapWriteRef, TapCloseRef) and the Python
    operator's (its CPU implementation and its torch-operations one, on host tensors) are equal
    byte for byte at every checkpoint; the Python reader reads the C++ rings as both models say,
    and the C++ reader (`read`) the Python rings."""
    for i, script in enumerate(scripts(tool)):
        where = f"script {i} ({script.describe()})"
        cpp_dir = tmp_path / f"cpp{i}"
        cpp_dir.mkdir()
        path = cpp_dir / "script.txt"
        path.write_text(script.text())
        done = tp.run(tool, "run-ref", str(path), str(cpp_dir))
        assert done.returncode == 0, (where, done.stderr)
        python_rings = [tp.run_python(script, "cpu"), tp.run_python(script, "cpu", impl="torch")]
        problems = tp.check_cpp_rings(cpp_dir, script, "cpu", python_rings)
        assert not problems, f"{where}:\n" + "\n".join(problems[:12])
        for j, rings in enumerate(python_rings):
            py_dir = tmp_path / f"py{i}_{j}"
            path = tp.save_run(py_dir, script, rings)
            done = tp.run(tool, "read", str(path), str(py_dir))
            assert done.returncode == 0, (where, j, done.stderr[-3000:])


def test_a_wrong_byte_or_a_wrong_offset_is_caught_by_both_readers(tool, tmp_path):
    """The checks can fail: one byte of a read slot changed (the C++ reader), or a reader that
    reads the other half (the Python reader)."""
    script = tp.cpp_scenario(tool, 3, 4, 40, 2, "bf16", True)
    rings = tp.run_python(script, "cpu")
    layout = script.layout()
    first = script.reads[0]
    bad = bytearray(rings[0])
    bad[tap_op.RingLayout.window_parts(layout, first.half, first.steps).activations + 3] ^= 0x40
    path = tp.save_run(tmp_path, script, [bytes(bad), *rings[1:]])
    done = tp.run(tool, "read", str(path), str(tmp_path))
    assert done.returncode == 1 and "checkpoint 0: rows" in done.stderr, done.stderr
    assert "ring at checkpoint 0: first difference" in done.stderr
    raw = torch.frombuffer(bytearray(rings[0]), dtype=torch.uint8)
    want = tp.model(script)[0]
    got = tp.read_window(raw, layout, torch.bfloat16, 1 - first.half, first.steps)
    assert tp.compare_window(want, got, "the other half"), "a reader of the wrong half passes"


def test_gather_mode_the_cpu_and_torch_writers_follow_the_slot_rules_byte_for_byte():
    """Gather mode (arm, disarm, following the engine's `starts`, residual streams), which the
    C++ side does not have: the operator's CPU implementation and its torch-operations one write
    the same bytes after every operation, and what they write is what the slot rules say."""
    for script in tp.gather_scripts():
        problems = tp.check_gather_writer(script, tp.run_gather(script, "torch"), "torch")
        assert not problems, "\n".join(problems[:12])


def test_the_gather_model_catches_a_wrong_row():
    """The gather check can fail: a row of a written slot changed."""
    script = tp.gather_scripts()[0]
    rings = tp.run_gather(script, "op")
    layout = script.layout()
    last = next(i for i in reversed(range(len(script.ops))) if script.ops[i].kind == "write")
    bad = bytearray(rings[last])
    raw = torch.frombuffer(bad, dtype=torch.uint8)
    counts = layout.view(raw, "counts", torch.int32, 2 * script.window + 1)
    slot = next(j for j in range(2 * script.window) if counts[j] > 0)
    bad[layout.offsets["slots"] + slot * layout.slot_bytes + 1] ^= 0x40
    problems = tp.check_gather_rings(script, [*rings[:last], bytes(bad), *rings[last + 1:]])
    assert any(f"after operation {last}" in p and "slot elements differ" in p for p in problems)


def test_the_triton_kernels_in_the_interpreter_write_the_cpp_references_bytes(tool, tmp_path):
    """The CUDA writer's Triton kernels (write and close), run by Triton's CPU interpreter on host
    rings: the C++ reader reads their rings as the model says and finds them equal to the C++
    reference's byte for byte (the GPU test runs the kernels for real); in gather mode, their
    rings are the operator's CPU implementation's, byte for byte after every operation."""
    pytest.importorskip("triton")
    chosen = [tp.cpp_scenario(tool, 3, 4, 40, 2, dtype, True) for dtype in tp.DTYPES]
    chosen += [tp.cpp_scenario(tool, 2, 3, 3000, 1, "bf16", False),
               tp.random_script(7, 3, 3, 33, 2, "fp16", True)]
    for i, script in enumerate(chosen):
        (tmp_path / f"s{i}").mkdir()
        (tmp_path / f"s{i}" / "script.txt").write_text(script.text())
    # The interpreter is chosen when the kernels are made: a process of its own.
    program = textwrap.dedent("""
        import pathlib, sys
        import tap_protocol_support as tp
        for d in sorted(pathlib.Path(sys.argv[1]).iterdir()):
            s = tp.parse_script((d / "script.txt").read_text())
            tp.save_run(d, s, tp.run_python(s, "cpu", impl="triton"))
        for i, s in enumerate(tp.gather_scripts()):
            pathlib.Path(sys.argv[2], f"g{i}.bin").write_bytes(
                b"".join(tp.run_gather(s, "triton")))
        print("written")
        """)
    env = {**os.environ, "TRITON_INTERPRET": "1",
           "PYTHONPATH": os.pathsep.join([str(pathlib.Path(__file__).parent),
                                          *sys.path])}
    env.pop("PROBE_SIDECAR_TAP_KERNEL", None)
    gathered = tmp_path.parent / f"{tmp_path.name}_gather"
    gathered.mkdir()
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path), str(gathered)], env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "written" in done.stdout, done.stderr[-4000:]
    for i, script in enumerate(chosen):
        d = tmp_path / f"s{i}"
        done = tp.run(tool, "read", str(d / "script.txt"), str(d))
        assert done.returncode == 0, (i, script.describe(), done.stderr[-3000:])
    for i, script in enumerate(tp.gather_scripts()):
        size = script.layout().nbytes
        data = (gathered / f"g{i}.bin").read_bytes()
        triton_rings = [data[j:j + size] for j in range(0, len(data), size)]
        problems = tp.check_gather_writer(script, triton_rings, f"gather script {i}, Triton")
        assert not problems, "\n".join(problems[:12])
