"""The quick kernel check (bench/kernels_quick.py) on synthetic results in the shape of the real
files: each point's fastest pass against the committed figure of the same implementation and
shape, the report and the exit status; and the whole script against stand-in benchmarks that
write such files. No GPU."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
import kernels_quick as kq  # noqa: E402

GIT = "0123456789abcdef0123456789abcdef01234567"


def probe_record(impl, R, P, us, dtype="bf16", precision="fast", **extra):
    return {"bench": "probe_score", "impl": impl, "dtype": dtype,
            "shape": {"R": R, "H": 4096, "P": P}, "graph_us_p50": us, "eager_us_p50": us + 1,
            "precision": precision, "variant": "tile=64x16 splits=16 grid=1x1x16", **extra}


def mla_record(impl, h_q, s_q, batch, seqlen, us):
    return {"bench": "mla_verify", "impl": impl, "tile": "one_page", "dispatched": True,
            "dtype": "bf16", "graph_us_p50": us, "eager_us_p50": us + 4,
            "shape": {"batch": batch, "s_q": s_q, "h_q": h_q, "seqlen": seqlen, "page_size": 64}}


def results(records, git="f49a9bb80456e7054de8188ea3add9a3b9e06db9", copy_gbps=4259.0,
            device="NVIDIA H200"):
    return {"device": device, "git": git, "date": "2026-12-02T01:32:27Z",
            "command": "bench --sweep full", "ceilings": {"copy_gbps": copy_gbps,
                                                           "bf16_tflops": 793.5},
            "records": records}


# A full sweep's figures: more shapes than the quick sweep measures, and a tuned variant it never
# runs.
PROBE_COMMITTED = results([
    probe_record("fused_tc", 1, 16, 10.0),
    probe_record("fused_tc", 64, 16, 20.0),
    probe_record("fused_tc", 8, 16, 15.0),
    probe_record("dispatch", 1, 16, 10.0, path="fused_tc"),
    probe_record("gather_gemm+exact", 8192, 1024, 300.0, precision="exact"),
    probe_record("fused_tc[64x16]", 1, 16, 9.0),
])
MLA_COMMITTED = results([
    mla_record("split_kv_sm90a", 16, 1, 1, 4096, 16.0),
    mla_record("split_kv_sm90a_one_page", 16, 1, 1, 4096, 16.2),
    mla_record("flashinfer_fa3", 16, 1, 1, 4096, 30.0),
    mla_record("previous", 16, 1, 1, 4096, 16.1),
    mla_record("split_kv_sm90a", 16, 1, 1, 1024, 14.0),
])


def probe_pass(scale=1.0, slow=None, device="NVIDIA H200"):
    """The quick sweep's points of PROBE_COMMITTED, each `scale` times its committed time (`slow`:
    {(impl, R, P): factor} instead)."""
    slow = slow or {}
    points = [("fused_tc", 1, 16, 10.0, "fast"), ("fused_tc", 64, 16, 20.0, "fast"),
              ("dispatch", 1, 16, 10.0, "fast"), ("gather_gemm+exact", 8192, 1024, 300.0, "exact")]
    return results([probe_record(impl, R, P, us * slow.get((impl, R, P), scale), precision=prec)
                    for impl, R, P, us, prec in points], git=GIT, device=device)


def probe(passes, threshold=1.03):
    return kq.compare(kq.PROBE, PROBE_COMMITTED, passes, threshold)


def test_every_point_is_compared_with_the_same_implementation_and_shape():
    c = probe([probe_pass(1.01)])
    ratios = {p.label.split()[0] + " " + p.label.split()[2]: round(p.ratio, 6) for p in c.points}
    assert ratios == {"dispatch R=1": 1.01, "fused_tc R=1": 1.01, "fused_tc R=64": 1.01,
                      "gather_gemm+exact R=8192": 1.01}
    assert [p.then_us for p in c.points] == [10.0, 10.0, 20.0, 300.0]
    assert not c.over and not c.without_figure
    assert round(c.worst, 6) == 1.01
    assert kq.exit_status([c]) == kq.OK


def test_the_fastest_pass_counts():
    # fused_tc R=64 is slow in the first pass only: noise, not a regression.
    c = probe([probe_pass(1.0, slow={("fused_tc", 64, 16): 1.2}), probe_pass(1.01)])
    assert not c.over
    assert round(c.worst, 6) == 1.01
    assert [p.now_us for p in c.points] == pytest.approx([10.0, 10.0, 20.2, 300.0])
    assert c.ceilings_now == [PROBE_COMMITTED["ceilings"]] * 2


def test_a_point_over_the_threshold_in_every_pass_is_a_regression():
    slow = {("gather_gemm+exact", 8192, 1024): 1.05}
    c = probe([probe_pass(1.0, slow), probe_pass(1.0, slow)])
    assert [p.label.split()[0] for p in c.over] == ["gather_gemm+exact"]
    assert round(c.worst, 6) == 1.05
    assert kq.exit_status([c]) == kq.REGRESSION
    report = kq.render([c], GIT, 2)
    line = next(x for x in report.splitlines() if x.startswith("gather_gemm+exact"))
    assert line.split()[-5:] == ["315.00", "300.00", "1.050", "over", "1.03x"]
    assert "== probe: 4 points, worst ratio 1.050, 1 over 1.03x, 0 without a committed figure" \
        in report
    assert report.rstrip().endswith("== exit 1: a point over 1.03x")
    # The same point is within a looser threshold.
    assert kq.exit_status([probe([probe_pass(1.0, slow)], threshold=1.06)]) == kq.OK


def test_a_ratio_at_the_threshold_is_not_over_it():
    c = probe([probe_pass(1.0, {("fused_tc", 1, 16): 1.03})], threshold=1.03)
    assert not c.over


def test_a_measured_point_without_a_committed_figure_is_reported():
    mla_pass = results([mla_record("split_kv_sm90a", 16, 1, 1, 4096, 16.3),
                        mla_record("baseline", 16, 1, 1, 4096, 280.0),
                        mla_record("split_kv_sm90a", 128, 1, 1, 4096, 23.0)], git=GIT)
    c = kq.compare(kq.MLA, MLA_COMMITTED, [mla_pass], 1.03)
    assert [(p.label.split()[0], p.label.split()[1], p.then_us) for p in c.points] == [
        ("baseline", "h_q=16", None), ("split_kv_sm90a", "h_q=16", 16.0),
        ("split_kv_sm90a", "h_q=128", None)]
    assert len(c.without_figure) == 2 and not c.over
    assert kq.exit_status([probe([probe_pass()]), c]) == kq.NO_FIGURE
    report = kq.render([c], GIT, 1)
    assert sum(line.endswith("no committed figure") for line in report.splitlines()) == 2
    assert "== mla: 3 points, worst ratio 1.019, 0 over 1.03x, 2 without a committed figure" \
        in report
    # A regression outranks a missing figure.
    slow = {("fused_tc", 1, 16): 1.1}
    assert kq.exit_status([probe([probe_pass(1.0, slow)]), c]) == kq.REGRESSION


def test_a_benchmark_that_measured_nothing():
    c = probe([], threshold=1.03)
    assert not c.points and c.worst is None
    assert kq.exit_status([c, probe([probe_pass(2.0)])]) == kq.NO_MEASUREMENT
    assert "== probe: 0 points, worst ratio —" in kq.render([c], GIT, 2)


def test_a_pass_on_another_gpu_is_not_a_regression_test():
    # An H100 runs every point 1.4x the H200's time: the ratios are the GPUs', not the code's.
    c = probe([probe_pass(1.0), probe_pass(1.4, device="NVIDIA H100 80GB HBM3")])
    assert c.other_device and c.devices_now == ["NVIDIA H100 80GB HBM3", "NVIDIA H200"]
    assert kq.exit_status([c]) == kq.OTHER_DEVICE
    # It outranks a regression (the ratio says nothing then) but not a benchmark that measured
    # nothing.
    h100 = probe([probe_pass(1.4, device="NVIDIA H100 80GB HBM3")])
    assert h100.over and kq.exit_status([h100]) == kq.OTHER_DEVICE
    assert kq.exit_status([h100, probe([])]) == kq.NO_MEASUREMENT
    report = kq.render([h100], GIT, 1)
    assert ("note: measured on NVIDIA H100 80GB HBM3, the committed figures on NVIDIA H200: the "
            "ratios set two GPUs against each other, not two commits") in report
    assert report.rstrip().endswith(
        "== exit 4: measured on another GPU model than the committed figures")
    # The same GPU model: no note.
    assert "note: measured on" not in kq.render([probe([probe_pass(1.0)])], GIT, 1)


def test_the_mla_benchmark_runs_the_committed_implementations():
    assert kq.mla_impls(MLA_COMMITTED) == \
        "split_kv_sm90a,split_kv_sm90a_one_page,flashinfer_fa3,previous"


# A stand-in for probe-score-bench and mla-verify-bench: writes the records of the JSON file in
# $FAKE_RECORDS (keyed by the binary's name), scaled by the next of $FAKE_SCALES (one per call of
# either, in order); exits 1 where the scale is "fail". Each call's arguments go to $FAKE_LOG.
FAKE_BENCH = """\
#!{python}
import json, os, pathlib, sys
name = pathlib.Path(sys.argv[0]).name
args = sys.argv[1:]
log = pathlib.Path(os.environ["FAKE_LOG"])
with log.open("a") as f:
    f.write(json.dumps([name, args]) + "\\n")
calls = len(log.read_text().splitlines())
scale = os.environ["FAKE_SCALES"].split(",")[calls - 1]
if scale == "fail":
    sys.exit(1)
doc = json.loads(pathlib.Path(os.environ["FAKE_RECORDS"]).read_text())[name]
for r in doc["records"]:
    r["graph_us_p50"] *= float(scale)
pathlib.Path(args[args.index("--out") + 1]).write_text(json.dumps(doc))
"""


def run_script(tmp_path, scales, *flags, device="NVIDIA H200", more_committed=None):
    """kernels_quick.py over the stand-in benchmarks, their passes on `device`; more_committed:
    {file name: document} beside the default committed files."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("probe-score-bench", "mla-verify-bench"):
        (bin_dir / name).write_text(FAKE_BENCH.format(python=sys.executable))
        (bin_dir / name).chmod(0o755)
    committed = tmp_path / "committed"
    committed.mkdir()
    (committed / "probe_score_cuda.json").write_text(json.dumps(PROBE_COMMITTED))
    (committed / "mla_verify.json").write_text(json.dumps(MLA_COMMITTED))
    for name, doc in (more_committed or {}).items():
        (committed / name).write_text(json.dumps(doc))
    quick_mla = results([mla_record("split_kv_sm90a", 16, 1, 1, 4096, 16.0),
                         mla_record("split_kv_sm90a_one_page", 16, 1, 1, 4096, 16.2)], git=GIT,
                        device=device)
    (tmp_path / "records.json").write_text(json.dumps(
        {"probe-score-bench": probe_pass(device=device), "mla-verify-bench": quick_mla}))
    env = dict(os.environ, FAKE_LOG=str(tmp_path / "calls.jsonl"), FAKE_SCALES=scales,
               FAKE_RECORDS=str(tmp_path / "records.json"))
    env.pop("PROBE_SIDECAR_GIT", None)
    done = subprocess.run(
        [sys.executable, str(pathlib.Path(kq.__file__)), "--bin-dir", str(bin_dir),
         "--out-dir", str(tmp_path / "out"), "--committed-dir", str(committed), "--git", GIT,
         *flags], capture_output=True, text=True, env=env, timeout=120)
    log = tmp_path / "calls.jsonl"
    calls = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, calls


def test_the_script_runs_each_benchmark_per_pass_and_writes_the_report(tmp_path):
    done, calls = run_script(tmp_path, "1.02,1.0,1.0,1.0")
    assert done.returncode == kq.OK, done.stdout + done.stderr
    assert [name for name, _ in calls] == ["probe-score-bench"] * 2 + ["mla-verify-bench"] * 2
    for name, args in calls:
        assert args[:2] == ["--sweep", "quick"] and args[args.index("--git") + 1] == GIT
        assert ("--impls" in args) == (name == "mla-verify-bench")
    mla_args = calls[-1][1]
    assert mla_args[mla_args.index("--impls") + 1] == kq.mla_impls(MLA_COMMITTED)
    out = tmp_path / "out"
    assert sorted(p.name for p in out.iterdir()) == [
        "kernels_quick.txt", "kernels_quick_mla_pass1.json", "kernels_quick_mla_pass2.json",
        "kernels_quick_probe_pass1.json", "kernels_quick_probe_pass2.json"]
    report = (out / "kernels_quick.txt").read_text()
    assert report in done.stdout
    assert "== probe: 4 points, worst ratio 1.000, 0 over 1.03x" in report
    assert "== mla: 2 points, worst ratio 1.000, 0 over 1.03x" in report


def test_the_script_reports_a_failed_pass_and_a_benchmark_that_measured_nothing(tmp_path):
    done, _ = run_script(tmp_path, "fail,1.1,fail,fail", "--threshold", "1.2")
    assert done.returncode == kq.NO_MEASUREMENT, done.stdout + done.stderr
    report = (tmp_path / "out" / "kernels_quick.txt").read_text()
    assert "note: pass 1: probe-score-bench exit 1, no results file" in report
    assert "== probe: 4 points, worst ratio 1.100, 0 over 1.2x" in report
    assert "== mla: 0 points" in report


def test_the_script_exits_1_on_a_regression(tmp_path):
    done, _ = run_script(tmp_path, "1.05,1.04,1.0,1.0", "--passes", "2")
    assert done.returncode == kq.REGRESSION, done.stdout + done.stderr
    assert textwrap.dedent("""\
        == probe: 4 points, worst ratio 1.040, 4 over 1.03x, 0 without a committed figure
        """) in done.stdout


def test_the_script_takes_one_benchmarks_figures_from_another_file(tmp_path):
    # The MLA figures of this GPU in a file of their own, 1.1x the default file's: the quick pass
    # (at the default file's times) is then 0.909 of them.
    other = tmp_path / "mla_h100.json"
    doc = json.loads(json.dumps(MLA_COMMITTED))
    for r in doc["records"]:
        r["graph_us_p50"] *= 1.1
    other.write_text(json.dumps(doc))
    done, _ = run_script(tmp_path, "1.0,1.0,1.0,1.0", "--committed", f"mla={other}")
    assert done.returncode == kq.OK, done.stdout + done.stderr
    assert f"== mla: committed {other} at f49a9bb80456" in done.stdout
    assert "== probe: committed probe_score_cuda.json at f49a9bb80456" in done.stdout
    assert "== mla: 2 points, worst ratio 0.909, 0 over 1.03x" in done.stdout
    (tmp_path / "bad").mkdir()
    done, _ = run_script(tmp_path / "bad", "1.0,1.0,1.0,1.0", "--committed", "attention=x.json")
    assert done.returncode == 2 and "expected NAME=FILE, NAME one of probe, mla" in done.stderr


def test_the_script_says_when_a_benchmark_cannot_run(tmp_path):
    done, _ = run_script(tmp_path, "1.0,1.0,1.0,1.0", "--bin-dir", str(tmp_path / "nowhere"))
    assert done.returncode == kq.NO_MEASUREMENT, done.stdout + done.stderr
    assert "note: pass 2: cannot run " in done.stdout


def test_on_another_gpu_the_newest_record_of_that_model_is_taken(tmp_path):
    """The passes ran on an H100; the default files are an H200's. For MLA the newest committed
    full sweep of the H100 is taken (not an older one, not another model's, not a file that is no
    record); probe scoring, with no H100 record, is compared with the H200's and exits 4."""
    h100 = "NVIDIA H100 80GB HBM3"

    def scaled(factor, date, device=h100):
        doc = json.loads(json.dumps(MLA_COMMITTED))
        doc.update(device=device, date=date)
        for r in doc["records"]:
            r["graph_us_p50"] *= factor
        return doc
    more = {"mla_verify_old_h100.json": scaled(2.0, "2026-12-01T00:00:00Z"),
            "mla_verify_new_h100.json": scaled(1.25, "2026-12-07T00:00:00Z"),
            "mla_verify_zz_h200.json": scaled(4.0, "2026-12-08T00:00:00Z", "NVIDIA H200"),
            "mla_verify_zz_trace.json": [{"not": "a record"}]}
    done, _ = run_script(tmp_path, "1.0,1.0,1.0,1.0", device=h100, more_committed=more)
    assert done.returncode == kq.OTHER_DEVICE, done.stdout + done.stderr
    assert "== mla: 2 points, worst ratio 0.800, 0 over 1.03x" in done.stdout
    assert ("note: mla_verify.json was measured on NVIDIA H200; the figures are "
            f"{tmp_path}/committed/mla_verify_new_h100.json's") in done.stdout
    mla = done.stdout.split("== mla: committed", 1)[1].split("\n== ", 1)[0]
    assert "set two GPUs against each other" not in mla
    probe = done.stdout.split("== probe: committed", 1)[1].split("\n== mla", 1)[0]
    assert "the ratios set two GPUs against each other" in probe

    # With an H100 record of probe scoring too, nothing is compared across models: exit 0.
    more["probe_score_cuda_x_h100.json"] = dict(PROBE_COMMITTED, device=h100)
    (tmp_path / "again").mkdir()
    done, _ = run_script(tmp_path / "again", "1.0,1.0,1.0,1.0", device=h100, more_committed=more)
    assert done.returncode == kq.OK, done.stdout + done.stderr

    # A file named with --committed is taken as named, whatever its model.
    (tmp_path / "named").mkdir()
    done, _ = run_script(tmp_path / "named", "1.0,1.0,1.0,1.0", "--committed",
                         f"mla={tmp_path / 'committed' / 'mla_verify_zz_h200.json'}",
                         device=h100, more_committed=more)
    assert "== mla: 2 points, worst ratio 0.250" in done.stdout
