"""The A/B report of two MLA verify builds (bench/mla_verify/ab_report.py) on synthetic passes in
mla-verify-bench's record format: the per-point ratio is the median over passes of B against the
same pass's A, A's own spread is reported, and points missing from one side are left out. No GPU."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest

BENCH = pathlib.Path(__file__).resolve().parents[2] / "bench" / "mla_verify"
sys.path.insert(0, str(BENCH))
import ab_report  # noqa: E402


def write_pass(out: pathlib.Path, side: str, n: int, times: dict) -> None:
    records = [{"bench": "mla_verify", "impl": "split_kv_sm90a", "dispatched": True,
                "shape": {"h_q": h, "s_q": s, "batch": b, "seqlen": L, "page_size": 64},
                "graph_us_p50": us} for (h, s, b, L), us in times.items()]
    doc = {"device": "test GPU", "git": side * 40, "date": "2026-12-06", "records": records}
    (out / f"ab_{side}_{n}.json").write_text(json.dumps(doc))


def test_ratio_is_the_median_of_same_pass_ratios(tmp_path):
    p1, p2 = (128, 1, 64, 16384), (16, 1, 1, 1024)
    # Pass 2 runs everything 10% slower (a warmer GPU): the same-pass ratio does not see it.
    a = [{p1: 100.0, p2: 10.0}, {p1: 110.0, p2: 11.0}, {p1: 100.0, p2: 10.0}]
    b = [{p1: 90.0, p2: 10.5}, {p1: 99.0, p2: 11.55}, {p1: 95.0, p2: 10.5}]
    for n, (ta, tb) in enumerate(zip(a, b), 1):
        write_pass(tmp_path, "a", n, ta)
        write_pass(tmp_path, "b", n, tb)
    out = tmp_path / "ab.md"
    js = tmp_path / "ab.json"
    assert ab_report.main([str(tmp_path), "--out", str(out), "--json", str(js)]) == 0
    doc = json.loads(js.read_text())
    rows = {(r["h_q"], r["s_q"], r["batch"], r["seqlen"]): r for r in doc["builds"]["b"]["rows"]}
    assert rows[p1]["ratio"] == pytest.approx(0.90)  # median of 0.90, 0.90, 0.95
    assert rows[p1]["ratio_max"] == pytest.approx(0.95)
    assert rows[p1]["a_spread"] == pytest.approx(1.10)
    assert rows[p2]["ratio"] == pytest.approx(1.05)
    text = out.read_text()
    assert "B > 2% faster at 1, > 2% slower at 1" in text
    geo = (0.90 * 1.05) ** 0.5
    assert f"geomean B / A {geo:.3f}" in text


def test_points_on_one_side_only_are_left_out(tmp_path):
    write_pass(tmp_path, "a", 1, {(16, 1, 8, 4096): 20.0, (16, 2, 8, 4096): 30.0})
    write_pass(tmp_path, "b", 1, {(16, 1, 8, 4096): 22.0})
    js = tmp_path / "ab.json"
    assert ab_report.main([str(tmp_path), "--out", str(tmp_path / "ab.md"), "--json", str(js)]) == 0
    rows = json.loads(js.read_text())["builds"]["b"]["rows"]
    assert [(r["s_q"], r["ratio"]) for r in rows] == [(1, pytest.approx(1.1))]


def test_each_build_against_the_first(tmp_path):
    p = (128, 2, 64, 16384)
    write_pass(tmp_path, "a", 1, {p: 100.0})
    write_pass(tmp_path, "b", 1, {p: 97.0})
    write_pass(tmp_path, "c", 1, {p: 104.0})
    js = tmp_path / "ab.json"
    assert ab_report.main([str(tmp_path), "--out", str(tmp_path / "ab.md"), "--json", str(js)]) == 0
    builds = json.loads(js.read_text())["builds"]
    assert builds["b"]["rows"][0]["ratio"] == pytest.approx(0.97)
    assert builds["c"]["rows"][0]["ratio"] == pytest.approx(1.04)
    text = (tmp_path / "ab.md").read_text()
    assert "build B against build A" in text and "build C against build A" in text


def test_no_common_points_is_an_error(tmp_path):
    write_pass(tmp_path, "a", 1, {(16, 1, 8, 4096): 20.0})
    assert ab_report.main([str(tmp_path)]) == 1
