#!/usr/bin/env python3
"""The quick kernel sweeps against the committed full-sweep figures.

Runs `probe-score-bench --sweep quick` and `mla-verify-bench --sweep quick` PASSES times, takes each
point's fastest pass, and compares it with the committed figure of the same implementation and
shape (bench/results/probe_score_cuda.json, bench/results/mla_verify.json): ratio = now / committed.
A change that moves kernel code without meaning to change its speed should leave every ratio near 1.

  python3 bench/kernels_quick.py --bin-dir BIN_DIR --out-dir DIR [--passes 2] [--threshold 1.03]
      [--git HASH[+dirty]] [--allow-dirty] [--mla-impls a,b,...] [--report FILE]
      [--committed probe=FILE] [--committed mla=FILE]

BIN_DIR holds probe-score-bench and mla-verify-bench (tests/gpu/run.sh's `quick` step runs it from
the bundle). Each pass's JSON is kept in DIR (kernels_quick_{probe,mla}_passN.json); the report is
printed and written to --report (default DIR/kernels_quick.txt). The MLA benchmark runs the
implementations the committed file holds (--mla-impls overrides; it ignores names it does not
measure itself, such as the peers and the previous build). A measured point whose implementation
and shape have no committed figure is listed as such. --committed names another committed file
for one benchmark (e.g. mla=bench/results/mla_verify_8774902_h100.json on an H100).

The ratios say whether the code got slower only where the committed figures were measured on the
same GPU model. Where every pass ran on another model than the default file's and no --committed
names the benchmark's file, the newest committed full sweep of that benchmark measured on the
pass's model (bench/results/<name>_*.json, by its date) is taken instead, and the report says so.
Where there is none, the passes are compared all the same, and the report says that the ratios set
two GPUs against each other, not two commits.

Exit status: 3 when a benchmark measured nothing (it failed, or wrote no points), else 4 when a
pass ran on another GPU model than its committed figures, else 1 when a point's ratio is over
--threshold, else 2 when a measured point has no committed figure, else 0.

The comparison (compare, render, exit_status) is plain functions over the parsed JSON, tested
without a GPU by tests/python/test_kernels_quick.py. Plain Python 3: runs here and on the GPU
machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import pathlib
import subprocess
import sys
from typing import Callable

import receipt

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
TOP = 8  # the highest ratios, listed again under each table

OK, REGRESSION, NO_FIGURE, NO_MEASUREMENT, OTHER_DEVICE = 0, 1, 2, 3, 4


@dataclasses.dataclass(frozen=True)
class Bench:
    """One benchmark: its binary, its committed figures, and how a record names its point."""
    name: str
    binary: str
    committed: str  # file name under bench/results
    key: Callable[[dict], tuple]  # (implementation, shape...): the same point in either file
    label: Callable[[dict], str]


def _probe_key(r: dict) -> tuple:
    s = r["shape"]
    return (r["impl"], r["dtype"], s["R"], s["H"], s["P"])


def _probe_label(r: dict) -> str:
    s = r["shape"]
    return (f"{r['impl']:<22} {r['dtype']} R={s['R']:<5} H={s['H']:<5} P={s['P']:<5} "
            f"{r.get('precision', '')}")


def _mla_key(r: dict) -> tuple:
    s = r["shape"]
    return (r["impl"], s["h_q"], s["s_q"], s["batch"], s["seqlen"])


def _mla_label(r: dict) -> str:
    s = r["shape"]
    return (f"{r['impl']:<23} h_q={s['h_q']:<4} s_q={s['s_q']:<2} batch={s['batch']:<4} "
            f"len={s['seqlen']}")


PROBE = Bench("probe", "probe-score-bench", "probe_score_cuda.json", _probe_key, _probe_label)
MLA = Bench("mla", "mla-verify-bench", "mla_verify.json", _mla_key, _mla_label)
BENCHES = (PROBE, MLA)


@dataclasses.dataclass
class Point:
    label: str
    now_us: float
    then_us: float | None  # None: no committed figure

    @property
    def ratio(self) -> float | None:
        return None if self.then_us is None else self.now_us / self.then_us


@dataclasses.dataclass
class Comparison:
    """One benchmark's measured points against its committed figures."""
    bench: Bench
    committed: dict  # the committed file's header (device, git, date, ceilings)
    points: list[Point]
    threshold: float
    notes: list[str] = dataclasses.field(default_factory=list)  # failed passes and such
    passes_headers: list[dict] = dataclasses.field(default_factory=list)  # device, ceilings...
    committed_file: str = ""  # where the committed figures came from (default bench.committed)

    @property
    def source(self) -> str:
        return self.committed_file or self.bench.committed

    @property
    def compared(self) -> list[Point]:
        return [p for p in self.points if p.then_us is not None]

    @property
    def without_figure(self) -> list[Point]:
        return [p for p in self.points if p.then_us is None]

    @property
    def over(self) -> list[Point]:
        return [p for p in self.compared if p.ratio > self.threshold]

    @property
    def worst(self) -> float | None:
        return max((p.ratio for p in self.compared), default=None)

    @property
    def ceilings_now(self) -> list:
        return [h.get("ceilings") for h in self.passes_headers]

    @property
    def devices_now(self) -> list[str]:
        return sorted({str(c.get("device")) for c in self.passes_headers})

    @property
    def other_device(self) -> bool:
        """A pass ran on another GPU model than the committed figures."""
        return any(d != str(self.committed.get("device")) for d in self.devices_now)


def _time(r: dict) -> float | None:
    t = r.get("graph_us_p50")
    return t if isinstance(t, (int, float)) and math.isfinite(t) and t > 0 else None


def compare(bench: Bench, committed: dict, passes: list[dict], threshold: float,
            notes: list[str] | None = None, committed_file: str = "") -> Comparison:
    """Each point measured in any pass (its fastest pass) against the committed record of the same
    implementation and shape. Committed points the passes did not measure are not listed: the
    committed file is a full sweep, the passes a quick one."""
    then = {}
    for r in committed["records"]:
        if _time(r) is not None:
            then[bench.key(r)] = _time(r)
    best: dict[tuple, tuple[float, dict]] = {}
    for doc in passes:
        for r in doc.get("records", []):
            t = _time(r)
            if t is not None and (bench.key(r) not in best or t < best[bench.key(r)][0]):
                best[bench.key(r)] = (t, r)
    points = [Point(bench.label(r), t, then.get(key)) for key, (t, r) in sorted(best.items())]
    def header(doc: dict) -> dict:
        return {k: v for k, v in doc.items() if k != "records"}
    return Comparison(bench, header(committed), points, threshold, list(notes or []),
                      [header(doc) for doc in passes], committed_file)


def exit_status(comparisons: list[Comparison]) -> int:
    if any(not c.points for c in comparisons):
        return NO_MEASUREMENT
    if any(c.other_device for c in comparisons):
        return OTHER_DEVICE
    if any(c.over for c in comparisons):
        return REGRESSION
    if any(c.without_figure for c in comparisons):
        return NO_FIGURE
    return OK


def render(comparisons: list[Comparison], git: str, passes: int) -> str:
    threshold = comparisons[0].threshold if comparisons else 0.0
    over_label = f"over {threshold:g}x"
    sources = ", ".join(f"{c.source} at {str(c.committed.get('git'))[:12]}"
                        for c in comparisons)
    lines = [
        f"# Quick kernel sweeps at {git} against the committed full-sweep figures ({sources})",
        f"# ratio = now / committed, per point (minimum of the passes, {passes}); > {threshold:g} "
        "is flagged.",
    ]
    for c in comparisons:
        h = c.committed
        lines += ["", f"== {c.bench.name}: committed {c.source} at "
                      f"{str(h.get('git'))[:12]} ({h.get('date')}, {h.get('device')}), "
                      f"ceilings then {h.get('ceilings')}; measured now {c.ceilings_now}"]
        if c.other_device:
            lines.append(f"note: measured on {', '.join(c.devices_now)}, the committed figures on "
                         f"{h.get('device')}: the ratios set two GPUs against each other, not two "
                         "commits")
        lines += [f"note: {n}" for n in c.notes]
        lines.append(f"{'point':<64} {'now us':>9} {'then us':>9} {'ratio':>7}")
        for p in c.points:
            row = f"{p.label:<64} {p.now_us:9.2f} "
            if p.ratio is None:
                lines.append(row + f"{'—':>9} {'—':>7}  no committed figure")
            else:
                flag = f"  {over_label}" if p.ratio > c.threshold else ""
                lines.append(row + f"{p.then_us:9.2f} {p.ratio:7.3f}{flag}")
        for p in sorted(c.compared, key=lambda p: -p.ratio)[:TOP]:
            lines.append(f"top {c.bench.name} {p.label} ratio {p.ratio:.3f}")
        worst = "—" if c.worst is None else f"{c.worst:.3f}"
        lines.append(f"== {c.bench.name}: {len(c.points)} points, worst ratio {worst}, "
                     f"{len(c.over)} {over_label}, {len(c.without_figure)} without a committed "
                     "figure")
    status = exit_status(comparisons)
    verdict = {OK: "ok", REGRESSION: f"a point {over_label}", NO_FIGURE:
               "a measured point without a committed figure", NO_MEASUREMENT:
               "a benchmark measured nothing", OTHER_DEVICE:
               "measured on another GPU model than the committed figures"}[status]
    lines += ["", f"== exit {status}: {verdict}"]
    return "\n".join(lines) + "\n"


def mla_impls(committed: dict) -> str:
    """The implementations the committed MLA figures hold, in their order, comma-separated."""
    return ",".join(dict.fromkeys(r["impl"] for r in committed["records"]))


def same_model_record(directory: pathlib.Path, committed: str, device: str
                      ) -> tuple[pathlib.Path, dict] | None:
    """The newest committed full sweep of a benchmark (`committed`'s stem, then _<anything>.json,
    e.g. mla_verify_26b25f9_h100.json) measured on `device`, or None."""
    found = []
    for path in sorted(directory.glob(f"{pathlib.Path(committed).stem}_*.json")):
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(doc, dict) and doc.get("device") == device and doc.get("records"):
            found.append((str(doc.get("date", "")), path.name, path, doc))
    if not found:
        return None
    _, _, path, doc = max(found, key=lambda f: f[:2])
    return path, doc


def run_passes(bench: Bench, bin_dir: pathlib.Path, out_dir: pathlib.Path, passes: int,
               receipt_args: list[str], extra: list[str]) -> tuple[list[dict], list[str]]:
    """Runs the quick sweep `passes` times: the JSON of each pass that wrote one, and a note for
    each that did not."""
    docs, notes = [], []
    for n in range(1, passes + 1):
        out = out_dir / f"kernels_quick_{bench.name}_pass{n}.json"
        command = [str(bin_dir / bench.binary), "--sweep", "quick", "--out", str(out),
                   *receipt_args, *extra]
        print("$", " ".join(command), flush=True)
        out.unlink(missing_ok=True)  # a file left by an earlier run is no measurement of this one
        try:
            returncode = subprocess.run(command).returncode
        except OSError as e:
            notes.append(f"pass {n}: cannot run {command[0]}: {e.strerror}")
            continue
        if returncode != 0 or not out.exists():
            notes.append(f"pass {n}: {bench.binary} exit {returncode}"
                         + ("" if out.exists() else ", no results file"))
            continue
        docs.append(json.loads(out.read_text()))
    return docs, notes


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--bin-dir", type=pathlib.Path, default=ROOT / "build" / "bin")
    parser.add_argument("--out-dir", type=pathlib.Path, required=True)
    parser.add_argument("--report", type=pathlib.Path,
                        help="where the report goes (default OUT_DIR/kernels_quick.txt)")
    parser.add_argument("--passes", type=int, default=2)
    parser.add_argument("--threshold", type=float, default=1.03,
                        help="a ratio over this is a regression (default 1.03)")
    parser.add_argument("--committed-dir", type=pathlib.Path, default=RESULTS,
                        help="where probe_score_cuda.json and mla_verify.json are read")
    parser.add_argument("--committed", action="append", default=[], metavar="NAME=FILE",
                        help="the committed figures of one benchmark (probe or mla) from FILE "
                        "instead of --committed-dir")
    parser.add_argument("--mla-impls", help="mla-verify-bench --impls (default: the "
                        "implementations of the committed mla_verify.json)")
    parser.add_argument("--git",
                        help="the commit measured (else $PROBE_SIDECAR_GIT, or the checkout)")
    parser.add_argument("--allow-dirty", action="store_true")
    args = parser.parse_args(argv)

    git = receipt.check(receipt.identify(args.git), args.allow_dirty)
    receipt_args = ["--git", git] + (["--allow-dirty"] if args.allow_dirty else [])
    args.out_dir.mkdir(parents=True, exist_ok=True)
    files = {b.name: args.committed_dir / b.committed for b in BENCHES}
    named = {}  # the --committed files, as named
    for item in args.committed:
        name, _, path = item.partition("=")
        if name not in files or not path:
            parser.error(f"--committed {item}: expected NAME=FILE, NAME one of {', '.join(files)}")
        files[name] = pathlib.Path(path)
        named[name] = path
    committed = {name: json.loads(path.read_text()) for name, path in files.items()}
    extra = {PROBE.name: [],
             MLA.name: ["--impls", args.mla_impls or mla_impls(committed[MLA.name])]}
    comparisons = []
    for bench in BENCHES:
        docs, notes = run_passes(bench, args.bin_dir, args.out_dir, args.passes, receipt_args,
                                 extra[bench.name])
        figures, source = committed[bench.name], named.get(bench.name, "")
        devices = {str(d.get("device")) for d in docs}
        if not source and len(devices) == 1 and devices != {str(figures.get("device"))}:
            # The default file is another GPU model's: the newest full sweep committed on this
            # one, where there is one, says more about the code than a comparison of two GPUs.
            (device,) = devices
            same = same_model_record(files[bench.name].parent, bench.committed, device)
            if same is not None:
                path, doc = same
                source = str(path.relative_to(ROOT) if path.is_relative_to(ROOT) else path)
                notes.append(f"{bench.committed} was measured on {figures.get('device')}; the "
                             f"figures are {source}'s, the newest committed full sweep on "
                             f"{device}")
                figures = doc
        comparisons.append(compare(bench, figures, docs, args.threshold, notes, source))
    report = render(comparisons, git, args.passes)
    report_path = args.report or args.out_dir / "kernels_quick.txt"
    report_path.write_text(report)
    sys.stdout.write(report)
    print(f"report: {report_path}")
    return exit_status(comparisons)


if __name__ == "__main__":
    sys.exit(main())
