"""Renders a GPU-families run (bench/gpu_families/run.sh) as markdown: the outcome of each kernel
test configuration from its log, and the speed of each family's tiles from the benchmarks' JSON.

  python3 bench/gpu_families/report.py RESULTS_DIR PREFIX --out FILE.md

RESULTS_DIR holds PREFIX.log and PREFIX_{mla_verify,probe_score}_{native,sm_80,sm_120}.json.
Plain Python 3.
"""
from __future__ import annotations

import argparse
import json
import os
import re


def steps(log: str) -> list[tuple[str, int, int, list[str]]]:
    """(step, exit status, seconds, [dispatch lines]) per '== step' section of the log."""
    out, cur, lines = [], None, []
    for line in log.splitlines():
        m = re.match(r"^== (\S+): exit (\d+), (\d+) s$", line)
        if m:
            out.append((m.group(1), int(m.group(2)), int(m.group(3)),
                        [l for l in lines if l.startswith("[dispatch]") or "FAILED  ]" in l]))
            cur, lines = None, []
        elif line.startswith("== "):
            cur, lines = line[3:], []
        elif cur is not None:
            lines.append(line)
    return out


def family_results(folder: str, prefix: str, kernel: str) -> dict[str, dict]:
    """The benchmark JSON of `kernel` per family that has one: PREFIX_KERNEL_FAMILY.json."""
    out = {}
    for fam in ("native", "sm_80", "sm_120"):
        path = os.path.join(folder, f"{prefix}_{kernel}_{fam}.json")
        if os.path.exists(path):
            out[fam] = json.load(open(path))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("prefix")
    ap.add_argument("--out", required=True)
    ap.add_argument("--notes", help="a markdown file appended as the Notes section")
    a = ap.parse_args()
    log = open(os.path.join(a.dir, a.prefix + ".log")).read()
    head = log.splitlines()[:5]
    md = [f"# GPU families on one H200: {a.prefix}", "",
          "Rendered by `bench/gpu_families/report.py` from `" + a.prefix + ".log` and the JSON files "
          "beside it (`bench/gpu_families/run.sh`, one device-tool call). " + head[0], "",
          "```", *head[1:], "```", "", "## Kernel tests", "",
          "| step | exit | s | failures and the dispatcher's view |", "|---|---|---|---|"]
    for name, rc, secs, notes in steps(log):
        if name.startswith("bench_"):
            continue
        cell = "<br>".join(n.replace("|", "/") for n in notes) or "-"
        md.append(f"| {name} | {rc} | {secs} | {cell} |")
    md += ["", "## MLA verify: each family's portable tile on the H200 (graph replay p50, µs)", "",
           "The tiles the planner gives each family's limits, all run by the H200's 132 SMs and "
           "HBM: what changes is the tile and ring depth (and blocks per SM), not the GPU.", ""]
    mla = family_results(a.dir, a.prefix, "mla_verify")
    if mla:
        md += ["| h_q | s_q | batch | seqlen | H200 split_kv_sm90a | H200 split_kv (tile) | sm_80 tiles | "
               "sm_120 tiles | sm_120 / H200 split_kv |", "|---|---|---|---|---|---|---|---|---|"]
        rows = {}
        for fam, d in mla.items():
            for r in d["records"]:
                s = r["shape"]
                key = (s["h_q"], s["s_q"], s["batch"], s["seqlen"])
                rows.setdefault(key, {})[(fam, r["impl"])] = r
        for key in sorted(rows):
            v = rows[key]

            def cell(fam: str, impl: str) -> str:
                r = v.get((fam, impl))
                if r is None:
                    return "-"
                t = f" ({r['tile']})" if r.get("tile") else ""
                return f"{r['graph_us_p50']:.1f}{t}"
            base, small = v.get(("native", "split_kv")), v.get(("sm_120", "split_kv"))
            ratio = f"{small['graph_us_p50'] / base['graph_us_p50']:.2f}" if base and small else "-"
            md.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {cell('native', 'split_kv_sm90a')} | "
                      f"{cell('native', 'split_kv')} | {cell('sm_80', 'split_kv')} | "
                      f"{cell('sm_120', 'split_kv')} | {ratio} |")
    md += ["", "## Probe scoring: each family's plans on the H200 (graph replay p50, µs)", ""]
    ps = family_results(a.dir, a.prefix, "probe_score")
    if ps:
        md += ["| dtype | R | H | P | impl | H200 | sm_80 | sm_120 |", "|---|---|---|---|---|---|---|---|"]
        rows = {}
        for fam, d in ps.items():
            for r in d["records"]:
                s = r["shape"]
                impl = r["impl"]
                if r.get("precision") == "exact" and "exact" not in impl:
                    impl += "+exact"
                rows.setdefault((r["dtype"], s["R"], s["H"], s["P"], impl), {})[fam] = r
        for key in rows:
            v = rows[key]

            def cell(fam: str) -> str:
                r = v.get(fam)
                return "-" if r is None else f"{r['graph_us_p50']:.1f} `{r.get('variant', '')}`"
            md.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {key[4]} | {cell('native')} | "
                      f"{cell('sm_80')} | {cell('sm_120')} |")
    if a.notes:
        md += ["", "## Notes", "", open(a.notes).read().rstrip()]
    open(a.out, "w").write("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
