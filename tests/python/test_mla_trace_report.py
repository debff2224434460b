"""The MLA verify trace report (bench/mla_verify/trace_report.py) on a synthetic trace in the format
of kernels/mla_verify/mla_verify_trace.h: the per-step waits of each warpgroup, the blocks' span,
and which blocks end last with what their end goes with. No GPU."""

from __future__ import annotations

import pathlib
import struct
import subprocess
import sys

import numpy as np

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "mla_verify"
sys.path.insert(0, str(BENCH))
import trace_report as tr  # noqa: E402

EVENTS = 64  # pairs per warpgroup
KHZ = 1_000_000  # 1 GHz: a cycle is a nanosecond


def block_events(steps, kv_wait, step_cycles):
    """A warpgroup's events: the plan wait, then per step a step mark and one page-box wait of
    kv_wait cycles inside step_cycles; then done, with the last step's index (as the kernels
    record it). Cycles since the block's start."""
    ev, t = [(100, 13 << 24)], 100
    for k in range(steps):
        ev.append((t, k))
        ev.append((t + 10, (1 << 24) | k))
        ev.append((t + 10 + kv_wait, (2 << 24) | k))
        t += step_cycles
    ev.append((t, (12 << 24) | (steps - 1)))
    return ev, t


def write_trace(path, blocks, h_q=128, s_q=1):
    """blocks: (sm, start_ns, kv_wait) per block, in block order; its end follows from its work."""
    data = np.zeros((len(blocks), 2, EVENTS, 2), dtype=np.uint32)
    for b, (sm, start_ns, kv_wait) in enumerate(blocks):
        for w in range(2):
            ev, t = block_events(4, kv_wait if w == 1 else 0, 1000 + kv_wait)
            data[b, w, 0] = (len(ev) + 2, sm)
            data[b, w, 1] = (start_ns, start_ns + t + 50)
            data[b, w, 2:2 + len(ev)] = ev
    header = struct.pack("<8si7i", b"MLATRACE", 1, len(blocks), EVENTS, h_q, s_q, 64, 16384, KHZ)
    path.write_bytes(header + data.tobytes())


def test_the_late_blocks_are_named_and_their_waits_go_with_their_end(tmp_path):
    # 16 blocks, two row tiles a range (h_q=128, s_q=1); SMs 6 and 7 (one TPC) wait 800 cycles a
    # step for page boxes, the others 0-60: those two end last.
    blocks = [(sm, 5 * sm, 800 if sm in (6, 7) else 4 * sm) for sm in range(16)]
    write_trace(tmp_path / "trace_h128_s1_b64_l16384_split_kv_sm90a.bin", blocks)
    meta, data = tr.read(tmp_path / "trace_h128_s1_b64_l16384_split_kv_sm90a.bin")
    rows = tr.block_rows(meta, data, tr.block_summaries(data))
    assert [r["sm"] for r in rows] == list(range(16))
    assert [(r["range"], r["tile"]) for r in rows[:4]] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert rows[0]["start_us"] == 0 and abs(rows[3]["start_us"] - 0.015) < 1e-9
    # Block 6: 4 steps of 1800 cycles after 100, start 30 ns, end 50 ns after done.
    assert abs(rows[6]["end_us"] - (30 + 100 + 4 * 1800 + 50) / 1e3) < 1e-9
    assert rows[6]["wg1_kv_per_step"] == 800 and rows[6]["wg0_kv_per_step"] == 0
    late = tr.late_blocks(rows, show=3)
    assert {r["sm"] for r in late["last"][:2]} == {6, 7}
    assert late["first"][0]["sm"] == 0
    assert late["corr_end_kv_wait"] > 0.99
    # Block 6's TPC partner is block 7 (both slow), and they are one range's two row tiles.
    assert late["corr_end_tpc_partner_end"] > 0.9
    assert late["corr_end_range_peers_end"] > 0.9

    out = subprocess.run([sys.executable, str(BENCH / "trace_report.py"), str(tmp_path),
                          "--out", str(tmp_path / "report.md")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    report = (tmp_path / "report.md").read_text()
    assert "Which blocks end last" in report
    last = [line for line in report.splitlines() if line.lstrip().startswith("last ")]
    assert "sm   6" in last[0] or "sm   7" in last[0], report


def test_no_correlation_is_claimed_from_a_flat_or_tiny_trace():
    assert tr.late_blocks([], show=3) is None
    rows = [{"block": b, "sm": b, "range": b, "tile": 0, "start_us": 0.0, "end_us": 10.0,
             "steps": 4, "wg0_kv_per_step": 5.0, "wg1_kv_per_step": 5.0,
             "wg0_own_per_step": 100.0, "wg1_own_per_step": 100.0} for b in range(8)]
    late = tr.late_blocks(rows, show=2)
    # Every block ends together: nothing to correlate, and the report says so.
    assert late["corr_end_kv_wait"] is None and late["corr_end_own_work"] is None
    assert "–" in tr.late_lines("h16 s1 b8 1024", "split_kv_sm90a", late)[0]
