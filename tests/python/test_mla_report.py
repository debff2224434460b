"""The MLA verify report (bench/mla_verify/report.py) on synthetic records in mla-verify-bench's
and peers.py's formats: the targets' rows say met or not at the targets' bounds, the previous
kernel and the committed figures are compared per point (the committed ones only on the same GPU
model), and a merged record renders again to the same JSON. No GPU."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "mla_verify"
sys.path.insert(0, str(BENCH))
import report  # noqa: E402

GIT, PREV_GIT, OLD_GIT = "a" * 40, "b" * 40, "c" * 40
DEVICE = "test GPU"
CEILINGS = {"copy_gbps": 1000.0, "bf16_tflops": 800.0}
WIDE = (128, 1, 64, 16384)  # the h_q=128 TFLOP/s target's point
LONG = (16, 1, 1, 65536)  # the batch 1 x 64k fraction-of-copy target's point


def record(point, impl, us, tflops=100.0, gbps=500.0, dispatched=False):
    h, s, b, L = point
    return {"bench": "mla_verify", "impl": impl, "dispatched": dispatched,
            "shape": {"h_q": h, "s_q": s, "batch": b, "seqlen": L, "page_size": 64},
            "graph_us_p50": us, "tflops": tflops, "gbps": gbps}


def write(path: pathlib.Path, doc: dict) -> str:
    path.write_text(json.dumps(doc))
    return str(path)


def run(tmp_path, ours, peers=(), previous=(), reference=None, reference_device=DEVICE):
    """report.main over the records given: (the targets' rows by their first cell, the .md)."""
    args = [write(tmp_path / "ours.json", {"device": DEVICE, "git": GIT, "date": "d",
                                           "ceilings": CEILINGS, "records": ours}),
            write(tmp_path / "peers.json", {"device": DEVICE, "git": GIT, "records": list(peers),
                                            "skipped": [], "notes": ["peers ran"]}),
            "--out-dir", str(tmp_path / "out"), "--command", "test"]
    if previous:
        args += ["--previous", write(tmp_path / "prev.json",
                                     {"git": PREV_GIT, "records": list(previous)})]
    if reference is not None:
        args += ["--reference", write(tmp_path / "ref.json",
                                      {"device": reference_device, "git": OLD_GIT, "date": "d0",
                                       "records": reference})]
    report.main(args)
    md = (tmp_path / "out" / "mla_verify.md").read_text()
    table = md.split("## Targets", 1)[1].split("## All points", 1)[0]
    rows = {}
    for line in table.splitlines():
        if line.startswith("| ") and not line.startswith("| target") and not line.startswith("|--"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0]] = cells
    return rows, md


def row(rows, start):
    (found,) = [cells for name, cells in rows.items() if name.startswith(start)]
    return found


@pytest.mark.parametrize("tflops, met", [(641.0, "yes"), (639.0, "no")])
def test_the_h128_target_is_640_tflops(tmp_path, tflops, met):
    rows, _ = run(tmp_path, [record(WIDE, "split_kv_sm90a", 10.0, tflops=tflops, dispatched=True)])
    cells = row(rows, "h_q=128 s_q=1, batch 64 x 16k: >= 640 TFLOP/s")
    assert cells[1] == f"{tflops:.0f}" and cells[3] == met


@pytest.mark.parametrize("gbps, met", [(560.0, "yes"), (540.0, "no")])
def test_the_long_request_target_is_a_fraction_of_copy(tmp_path, gbps, met):
    rows, _ = run(tmp_path, [record(LONG, "split_kv_sm90a", 10.0, gbps=gbps, dispatched=True)])
    assert row(rows, "batch 1 x 64k h_q=16 s_q=1: >= 0.55 of copy")[3] == met


@pytest.mark.parametrize("prev_us, met", [(9.9, "yes"), (9.7, "no")])
def test_the_previous_kernel_may_be_faster_by_two_percent_not_more(tmp_path, prev_us, met):
    """10.0 µs against 9.9 is 1.010x (met); against 9.7, 1.031x (not met, the point listed)."""
    other = (16, 2, 8, 4096)
    rows, _ = run(tmp_path,
                  [record(WIDE, "split_kv_sm90a", 10.0, dispatched=True),
                   record(other, "split_kv_sm90a", 5.0, dispatched=True)],
                  previous=[record(WIDE, "split_kv_sm90a", prev_us, dispatched=True),
                            record(WIDE, "split_kv", 1.0),  # not dispatched: not compared
                            record(other, "split_kv_sm90a", 6.0, dispatched=True)])
    cells = row(rows, "no point slower than the previous kernel (`bbbbbbb`")
    assert cells[3] == met
    assert cells[1].startswith("0 of 2 points" if met == "yes" else "1 of 2 points")
    assert f"worst {10.0 / prev_us:.3f}x at h128 s1 b64 16384" in cells[1]
    if met == "no":
        assert "h128 s1 b64 16384" in row(rows, "(points beyond it")[0]


def test_the_committed_figures_are_compared_on_the_same_gpu_model_only(tmp_path):
    ours = [record(WIDE, "split_kv_sm90a", 10.5, dispatched=True),
            record(LONG, "split_kv_sm90a", 5.0, dispatched=True)]
    then = [record(WIDE, "split_kv_sm90a", 10.0, dispatched=True),  # 1.05x: beyond 3%
            record(LONG, "split_kv_sm90a", 4.9, dispatched=True)]  # 1.02x: within
    rows, md = run(tmp_path, ours, reference=then)
    cells = row(rows, "no point slower than the committed figures (`ccccccc`) by more than 3%")
    assert cells[3] == "no" and cells[1].startswith("1 of 2 points")
    assert "h128 s1 b64 16384: 1.050" in row(rows, "(points beyond it")[0]
    assert f"committed figures compared with: `{OLD_GIT}`" in md

    rows, _ = run(tmp_path, ours, reference=then, reference_device="another GPU")
    cells = row(rows, "no point slower than the committed figures (`ccccccc`)")
    assert cells[1].startswith("not comparable: they were measured on another GPU")
    assert cells[3] == "–"


def test_flashinfer_and_flashmla_standing(tmp_path):
    """FlashInfer faster at one point, not excused (below 0.90 of copy): not met; the geomean of
    ours / FlashMLA time over two points, 1.1 and 0.8 -> 0.938: met."""
    ours = [record(WIDE, "split_kv_sm90a", 11.0, dispatched=True),
            record(LONG, "split_kv_sm90a", 8.0, dispatched=True)]
    peers = [record(WIDE, "flashinfer_fa3", 10.0), record(LONG, "flashinfer_fa3", 9.0),
             record(WIDE, "flashmla", 10.0), record(LONG, "flashmla", 10.0)]
    rows, md = run(tmp_path, ours, peers=peers)
    fi = row(rows, "faster than FlashInfer at every point")
    assert fi[3] == "no" and fi[1].startswith("slower at 1 of 2 points, 0 of them excused")
    mla = row(rows, "geomean ours / FlashMLA time <= 1.00")
    assert mla[1].startswith(f"{(1.1 * 0.8) ** 0.5:.3f}") and mla[3] == "yes"
    assert "h128 s1 b64 16384: 1.10" in md.split("Points where FlashInfer is faster", 1)[1]


def test_a_merged_record_renders_again_to_the_same_json(tmp_path):
    run(tmp_path, [record(WIDE, "split_kv_sm90a", 10.0, dispatched=True)],
        peers=[record(WIDE, "flashinfer_fa3", 9.0)],
        previous=[record(WIDE, "split_kv_sm90a", 9.95, dispatched=True)])
    merged = tmp_path / "out" / "mla_verify.json"
    again = tmp_path / "again"
    report.main([str(merged), "--out-dir", str(again)])
    assert (again / "mla_verify.json").read_text() == merged.read_text()
    md = (again / "mla_verify.md").read_text()
    assert "rendered again from this record's JSON" in md
    assert f"previous: the same benchmark built from `{PREV_GIT}`" in md
    with pytest.raises(SystemExit, match="already holds its peers"):
        report.main([str(merged), str(tmp_path / "peers.json"), "--out-dir", str(again)])


def test_peers_of_another_commit_are_refused(tmp_path):
    ours = write(tmp_path / "ours.json", {"device": DEVICE, "git": GIT, "date": "d",
                                          "ceilings": CEILINGS, "records": []})
    peers = write(tmp_path / "peers.json", {"git": PREV_GIT, "records": [], "skipped": [],
                                            "notes": []})
    with pytest.raises(SystemExit, match="name different commits"):
        report.main([ours, peers, "--out-dir", str(tmp_path / "out"), "--command", "x"])
