"""The tap protocol across languages on a real GPU (docs/tap-protocol.md), no server: rings written
by the C++ write and close kernels (kernels/tap_write, run by `tap_protocol_gpu_test write`) read
by the Python reader (RingLayout.window_views, on the device), and rings written by the Python
writer on the GPU (the Triton kernels, and the torch operations used without Triton) read by the
C++ reader (`tap_protocol_gpu_test read`), at every dtype. The scripts wrap the ring: more writes
than a window holds (the spare slot), closes alternating halves, a diverted window and the close
of the lost one, device row counts in and out of range; rings are poisoned with NaN (0xff bytes)
so that a read of anything not written shows. Every element of every checkpoint's window is
checked against both sides' models, and every ring byte against the other side's writer. Gather
mode (the Python writer's alone): the GPU writers' rings byte for byte against its CPU
implementation's after every operation.

Runs on the GPU machine (tests/gpu/run.sh, which bundles tap_protocol_gpu_test); skipped where
torch or a CUDA device is missing (a failure under PROBE_SIDECAR_REQUIRE_GPU=1).
"""

from __future__ import annotations

import pytest

from conftest import require_cuda  # noqa: E402

torch = require_cuda()

import tap_protocol_support as tp  # noqa: E402

DTYPES = list(tp.DTYPES)
# (K, max_batch, H, P): rows copied in 16-, 8-, 4- and 2-byte units, one block per row and several
# (H 3000: Triton's BLOCK is 1024, the C++ kernel's 256 threads copy 3000 elements), one row.
SHAPES = [(3, 4, 40, 2), (2, 5, 33, 3), (3, 3, 3000, 1), (2, 1, 40, 1)]


@pytest.fixture(scope="module")
def gpu_test():
    return tp.binary("PROBE_SIDECAR_TAP_PROTOCOL_GPU_TEST", "tap_protocol_gpu_test")


def scripts(binary, dtype: str) -> list[tp.Script]:
    out = [tp.cpp_scenario(binary, k, mb, h, p, dtype, device_scores)
           for k, mb, h, p in SHAPES for device_scores in (True, False)]
    for seed, (k, mb, h) in enumerate([(2, 3, 40), (4, 2, 33), (2, 2, 3000)]):
        out.append(tp.random_script(100 + seed, k, mb, h, 2, dtype, True))
    return out


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_cpp_kernels_rings_read_by_the_python_reader(gpu_test, dtype, kernel, tmp_path):
    chosen = scripts(gpu_test, dtype)
    pairs = []
    for i, script in enumerate(chosen):
        directory = tmp_path / f"cpp{i}"
        directory.mkdir()
        (directory / "script.txt").write_text(script.text())
        pairs += [str(directory / "script.txt"), str(directory)]
    done = tp.run(gpu_test, "write", *pairs)  # one process, one CUDA context, every script
    assert done.returncode == 0, (done.returncode, done.stderr)
    for i, script in enumerate(chosen):
        # The same script by the Python writer on the GPU (the `kernel` fixture's), and by the
        # torch operations called directly: the same bytes as the C++ kernels'.
        python_rings = [tp.run_python(script, "cuda"), tp.run_python(script, "cuda", impl="torch")]
        problems = tp.check_cpp_rings(tmp_path / f"cpp{i}", script, "cuda", python_rings)
        assert not problems, f"script {i} ({script.describe()}):\n" + "\n".join(problems[:12])


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_python_writers_rings_read_by_the_cpp_reader(gpu_test, dtype, kernel, tmp_path):
    chosen = scripts(gpu_test, dtype)
    pairs = []
    for i, script in enumerate(chosen):
        directory = tmp_path / f"py{i}"
        pairs += [str(tp.save_run(directory, script, tp.run_python(script, "cuda"))),
                  str(directory)]
    done = tp.run(gpu_test, "read", *pairs)
    assert done.returncode == 0, done.stderr[-6000:]
    assert done.stdout.count("rings equal to the reference") == len(chosen), done.stdout


def test_gather_mode_on_the_gpu_writes_the_cpu_implementations_bytes(kernel):
    """Gather mode, which only the Python writer has: the operator on the GPU (the `kernel`
    fixture's Triton kernels or torch operations, with the arm and close kernels) writes, after
    every operation, the bytes its CPU implementation writes, which follow the slot rules."""
    for script in tp.gather_scripts():
        problems = tp.check_gather_writer(script, tp.run_gather(script, "op", device="cuda"),
                                          "GPU")
        assert not problems, "\n".join(problems[:12])
