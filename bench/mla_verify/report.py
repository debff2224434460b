"""Merges the MLA verify benchmark (ours) and the peers' results into bench/results/mla_verify.json,
and renders mla_verify.md (table, targets, who wins each point) and mla_verify.png (time vs
length per h_q).

  python3 report.py OURS.json [PEERS.json] --out-dir DIR --command "..." [--previous PREV.json]
                   [--trace TRACE.md] [--reference COMMITTED.json]
  python3 report.py MERGED.json --out-dir DIR [--trace TRACE.md] [--reference COMMITTED.json]

Both inputs must name the same commit. Peers' fractions are computed against the ceilings the
CUDA benchmark measured in the same run. PREV.json: the same benchmark built from an earlier
commit and run in the same call (its dispatched records become impl "previous", the kernel the
"never slower than" target compares with). TRACE.md: trace_report.py's table, appended.
COMMITTED.json: an earlier record (a merged mla_verify.json), whose dispatched figures the
"no point slower than the committed figures" target compares with, where it was measured on the
same GPU model. MERGED.json: a record this script wrote, rendered again (e.g. with newer targets);
its command, notes and previous kernel are kept.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections import defaultdict

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import receipt  # noqa: E402

ORDER = ("split_kv", "split_kv_sm90a", "split_kv_sm90a_pairs", "split_kv_sm90a_one_page",
         "split_kv_sm90a_swap_ab",
         "previous", "baseline", "flashinfer_fa3", "flashmla", "torch_ref")
PREVIOUS = "previous"
# "ours" in the targets: the split path LaunchMlaVerify dispatches to for the shape (the
# record the benchmark marks "dispatched").
OURS = "ours"

# The targets (issue 38; H200, bf16, page 64, graph replay).
TARGETS = "issue 38"
H16_MIN_FRAC = 0.88  # h_q=16, s_q 1/2/4, KV >= 300 MB: fraction of copy
H16_MIN_KV_BYTES = 300e6
H128_MIN_TFLOPS = 640.0  # h_q=128, batch 64 x 16k, s_q 1/2/4/8
LONG_MIN_FRAC = 0.55  # batch 1 x 64k, h_q=16, s_q 1..8: fraction of copy
FI_EXCUSE_FRAC, FI_EXCUSE_RATIO = 0.90, 1.03  # slower than FlashInfer only within this
FLASHMLA_MAX_GEOMEAN = 1.00  # ours / FlashMLA time
PREVIOUS_MAX_RATIO = 1.02  # ours / the previous kernel's time, in the same run
COMMITTED_MAX_RATIO = 1.03  # ours / the committed figure (same GPU model)


def key(r):
    s = r["shape"]
    return (s["h_q"], s["s_q"], s["batch"], s["seqlen"])


def points(records):
    """{point: {impl: record}}, with OURS the dispatched record (split_kv in files without the
    mark)."""
    by_point = defaultdict(dict)
    for r in records:
        by_point[key(r)][r["impl"]] = r
        if r.get("dispatched"):
            by_point[key(r)][OURS] = r
    for d in by_point.values():
        if OURS not in d and "split_kv" in d:
            d[OURS] = d["split_kv"]
    return by_point


def merge(args, ours):
    """The merged record of a run: ours, the peers' and the previous kernel's records."""
    peers = json.load(open(args.peers)) if args.peers and os.path.exists(args.peers) else None
    if peers and peers["git"] != ours["git"]:
        raise SystemExit(f"report: ours {ours['git']} and peers {peers['git']} name different commits")
    if args.command is None:
        raise SystemExit("report: --command is needed for a benchmark's output")
    ceil = ours["ceilings"]
    records = list(ours["records"])
    for r in (peers["records"] if peers else []):
        r = dict(r)
        r["frac_copy"] = round(r["gbps"] / ceil["copy_gbps"], 4)
        r["frac_tflops"] = round(r["tflops"] / ceil["bf16_tflops"], 4)
        records.append(r)
    previous_git = None
    if args.previous and os.path.exists(args.previous):
        prev = json.load(open(args.previous))
        previous_git = prev["git"]
        for r in prev["records"]:
            if r.get("dispatched"):
                r = dict(r, impl=PREVIOUS, dispatched=False, previous_git=previous_git)
                records.append(r)
    merged = {"device": ours["device"], "git": ours["git"], "date": ours["date"],
              "command": args.command, "ceilings": ceil, "records": records,
              "skipped": ours.get("skipped", []) + (peers["skipped"] if peers else []),
              "notes": (peers["notes"] if peers else ["peers not run"]),
              "counting": "bytes = per request len*576*2 (KV) + s_q*h_q*576*2 (q) + "
                          "s_q*h_q*512*2 (out); flops = 2*h_q*(576+512) per visible (query, key) "
                          "pair, s_q*len - s_q*(s_q-1)/2 pairs per request (causal)"}
    if previous_git:
        merged["previous_git"] = previous_git
    return merged


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("peers", nargs="?")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--command")
    ap.add_argument("--previous")
    ap.add_argument("--trace")
    ap.add_argument("--reference")
    args = ap.parse_args(argv)
    ours = json.load(open(args.ours))
    rendered_again = "counting" in ours  # a merged record
    if rendered_again:
        if args.peers or args.previous:
            raise SystemExit("report: a merged record already holds its peers and previous kernel")
        merged = ours
    else:
        merged = merge(args, ours)
    reference = None
    if args.reference and os.path.exists(args.reference):
        reference = json.load(open(args.reference))
        if reference["git"] == merged["git"]:
            reference = None  # a record is not compared with itself
    ceil, records = merged["ceilings"], merged["records"]
    previous_git = merged.get("previous_git")
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "mla_verify.json"), "w") as f:
        json.dump(merged, f, indent=1)

    by_point = points(records)
    impls = [i for i in ORDER if any(i in v for v in by_point.values())]

    lines = [f"# MLA verify on {merged['device']}", "",
             f"- commit `{merged['git']}`, {merged['date']}",
             f"- command: `{merged['command']}`",
             f"- ceilings measured in the same run: copy {ceil['copy_gbps']:.0f} GB/s "
             f"(cudaMemcpy D2D, read + write), cuBLAS bf16 GEMM {ceil['bf16_tflops']:.0f} TFLOP/s",
             f"- counting: {merged['counting']}",
             "- times: median of CUDA-graph replays (µs), inputs rotated so the working set "
             "exceeds 400 MB"]
    if previous_git:
        lines.append(f"- previous: the same benchmark built from `{previous_git}`, its dispatched "
                     "path, in the same run")
    if rendered_again:
        lines.append(f"- rendered again from this record's JSON by report.py at "
                     f"`{receipt.from_checkout() or 'an unknown commit'}`: the figures are the "
                     "run's, the targets' table the script's")
    if reference is not None:
        lines.append(f"- committed figures compared with: `{reference['git']}` "
                     f"({reference.get('date')}, {reference.get('device')})")
    lines.append("")
    table = targets(by_point, ceil, merged["device"], reference)
    lines += table
    lines += ["", "## All points", "",
              "µs per impl; then ours (the dispatched split path, named) GB/s (fraction of copy) "
              "and TFLOP/s (fraction of GEMM); winner = fastest of all, with its margin over the "
              "runner-up; vs FI = FlashInfer time / ours (> 1: ours faster); vs FlashMLA the same for FlashMLA.", ""]
    head = "| h_q | s_q | batch | len | " + " | ".join(f"{i} µs" for i in impls) + \
           " | ours | ours GB/s (frac) | ours TFLOP/s (frac) | winner | vs FI | vs FlashMLA |"
    lines += [head, "|" + "---|" * (head.count("|") - 1)]
    for k in sorted(by_point):
        d = by_point[k]
        cells = [f"{d[i]['graph_us_p50']:.1f}" if i in d else "–" for i in impls]
        sp = d.get(OURS)
        rate = (f"{sp['gbps']:.0f} ({sp['gbps'] / ceil['copy_gbps']:.2f})" if sp else "–")
        tf = (f"{sp['tflops']:.0f} ({sp['tflops'] / ceil['bf16_tflops']:.2f})" if sp else "–")
        ranked = sorted((v for i, v in d.items() if i != OURS), key=lambda r: r["graph_us_p50"])
        win = ranked[0]["impl"]
        if len(ranked) > 1:
            win += f" by {ranked[1]['graph_us_p50'] / ranked[0]['graph_us_p50']:.2f}x"
        vs = [f"{d[peer]['graph_us_p50'] / sp['graph_us_p50']:.2f}" if sp and peer in d else "–"
              for peer in ("flashinfer_fa3", "flashmla")]
        lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | " + " | ".join(cells) +
                     f" | {sp['impl'] if sp else '–'} | {rate} | {tf} | {win} | {vs[0]} | {vs[1]} |")
    if args.trace and os.path.exists(args.trace):
        lines += ["", "## In-kernel trace", "", open(args.trace).read().rstrip()]
    if merged["skipped"]:
        lines += ["", "## Skipped", ""] + [f"- {s}" for s in merged["skipped"]]
    lines += ["", "## Notes from the peers run", ""] + [f"- {n}" for n in merged["notes"]]
    with open(os.path.join(args.out_dir, "mla_verify.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    plot(by_point, impls, os.path.join(args.out_dir, "mla_verify.png"), merged)
    print("\n".join(table))


def time_ratios(by_point, other):
    """{point: ours / `other`'s time} at every point where both ran."""
    return {k: d[OURS]["graph_us_p50"] / d[other]["graph_us_p50"]
            for k, d in by_point.items() if OURS in d and other in d}


def geomean(values):
    values = list(values)
    return math.prod(values) ** (1.0 / len(values)) if values else float("nan")


def _pt(k):
    return f"h{k[0]} s{k[1]} b{k[2]} {k[3]}"


def _yes(ok):
    return "yes" if ok else "no"


def targets(by_point, ceil, device="", reference=None):
    """The targets (TARGETS), each with our value, FlashInfer's and whether it is met."""
    out = [f"## Targets ({TARGETS})", "",
           "| target | ours | flashinfer_fa3 | met |", "|---|---|---|---|"]

    def frac(r):
        return r["gbps"] / ceil["copy_gbps"]

    def fi_cell(k, fn, fmt):
        fi = by_point[k].get("flashinfer_fa3")
        return fmt % fn(fi) if fi else "–"

    # h_q=16, s_q 1/2/4, enough KV: a fraction of copy at the worst such point.
    pts = [k for k in by_point
           if k[0] == 16 and k[1] <= 4 and k[2] * k[3] * 1152 >= H16_MIN_KV_BYTES]
    for s in (1, 2, 4):
        ks = [k for k in pts if k[1] == s and OURS in by_point[k]]
        if not ks:
            continue
        worst = min(ks, key=lambda k: frac(by_point[k][OURS]))
        sp = frac(by_point[worst][OURS])
        out.append(f"| h_q=16 s_q={s}, KV >= {H16_MIN_KV_BYTES / 1e6:.0f} MB (worst of {len(ks)} "
                   f"points: batch {worst[2]} x {worst[3]}): >= {H16_MIN_FRAC:.2f} of copy | "
                   f"{sp:.2f} | {fi_cell(worst, frac, '%.2f')} | {_yes(sp >= H16_MIN_FRAC)} |")
    # h_q=128, batch 64 x 16k, s_q 1/2/4/8: TFLOP/s.
    for s in (1, 2, 4, 8):
        k = (128, s, 64, 16384)
        if k in by_point and OURS in by_point[k]:
            sp = by_point[k][OURS]["tflops"]
            out.append(f"| h_q=128 s_q={s}, batch 64 x 16k: >= {H128_MIN_TFLOPS:.0f} TFLOP/s | "
                       f"{sp:.0f} | {fi_cell(k, lambda r: r['tflops'], '%.0f')} | "
                       f"{_yes(sp >= H128_MIN_TFLOPS)} |")
    # batch 1 x 64k, h_q=16, s_q 1..8: a fraction of copy.
    for s in (1, 2, 4, 8):
        k = (16, s, 1, 65536)
        if k in by_point and OURS in by_point[k]:
            sp = frac(by_point[k][OURS])
            out.append(f"| batch 1 x 64k h_q=16 s_q={s}: >= {LONG_MIN_FRAC:.2f} of copy | "
                       f"{sp:.2f} | {fi_cell(k, frac, '%.2f')} | {_yes(sp >= LONG_MIN_FRAC)} |")
    # Faster than FlashInfer at every point, or within 3% where both are >= 0.90 of copy.
    vs_fi = time_ratios(by_point, "flashinfer_fa3")

    def excused(k):
        o, f = by_point[k][OURS], by_point[k]["flashinfer_fa3"]
        return (frac(o) >= FI_EXCUSE_FRAC and frac(f) >= FI_EXCUSE_FRAC and
                o["graph_us_p50"] <= FI_EXCUSE_RATIO * f["graph_us_p50"])
    lose = [k for k in vs_fi if vs_fi[k] > 1.0]
    lose_unexcused = [k for k in lose if not excused(k)]
    if vs_fi:
        out.append(f"| faster than FlashInfer at every point (or within "
                   f"{(FI_EXCUSE_RATIO - 1) * 100:.0f}% where both >= {FI_EXCUSE_FRAC:.2f} of copy)"
                   f" | slower at {len(lose)} of {len(vs_fi)} points, "
                   f"{len(lose) - len(lose_unexcused)} of them excused (geomean ours / FlashInfer "
                   f"time {geomean(vs_fi.values()):.3f}) | – | {_yes(not lose_unexcused)} |")
    else:
        out.append("| faster than FlashInfer at every point | FlashInfer not run | – | – |")
    vs_mla = time_ratios(by_point, "flashmla")
    if vs_mla:
        gm = geomean(vs_mla.values())
        out.append(f"| geomean ours / FlashMLA time <= {FLASHMLA_MAX_GEOMEAN:.2f} | {gm:.3f} "
                   f"(slower at {sum(r > 1 for r in vs_mla.values())} of {len(vs_mla)} points) | "
                   f"– | {_yes(gm <= FLASHMLA_MAX_GEOMEAN)} |")
    else:
        out.append("| geomean ours / FlashMLA time | FlashMLA not run | – | – |")
    # No point slower than the previous kernel (same run) by more than PREVIOUS_MAX_RATIO.
    ratios = time_ratios(by_point, PREVIOUS)
    if ratios:
        worst = max(ratios, key=lambda k: ratios[k])
        out += bound_rows(f"no point slower than the previous kernel (`"
                          f"{by_point[worst][PREVIOUS].get('previous_git', '')[:7]}`, same run)",
                          ratios, PREVIOUS_MAX_RATIO)
    # No point slower than the committed figures (same GPU model) by more than COMMITTED_MAX_RATIO.
    out += committed_target(by_point, device, reference)
    if lose:
        out += ["", "Points where FlashInfer is faster (ours / FlashInfer time; * = excused): " +
                ", ".join(f"{_pt(k)}: {vs_fi[k]:.2f}{'*' if excused(k) else ''}"
                          for k in sorted(lose))]
    return out


def committed_target(by_point, device, reference):
    """The target row against a committed record's dispatched figures."""
    name = f"by more than {(COMMITTED_MAX_RATIO - 1) * 100:.0f}%"
    if reference is None:
        return [f"| no point slower than the committed figures {name} | no committed record "
                f"given | – | – |"]
    label = f"`{reference['git'][:7]}`"
    if reference.get("device") != device:
        return [f"| no point slower than the committed figures ({label}) {name} | not "
                f"comparable: they were measured on {reference.get('device')}, this run on "
                f"{device} | – | – |"]
    then = points(reference["records"])
    ratios = {k: d[OURS]["graph_us_p50"] / then[k][OURS]["graph_us_p50"]
              for k, d in by_point.items() if OURS in d and OURS in then.get(k, {})}
    if not ratios:
        return [f"| no point slower than the committed figures ({label}) {name} | no point in "
                f"common | – | – |"]
    return bound_rows(f"no point slower than the committed figures ({label})", ratios,
                      COMMITTED_MAX_RATIO)


def bound_rows(name, ratios, bound):
    """A target that no point's time ratio ({point: ours / the other's time}) passes `bound`:
    its row, and the points beyond it where there are any."""
    beyond = sorted(k for k in ratios if ratios[k] > bound)
    worst = max(ratios, key=lambda k: ratios[k])
    out = [f"| {name} by more than {(bound - 1) * 100:.0f}% | {len(beyond)} of {len(ratios)} "
           f"points (slower at {sum(r > 1 for r in ratios.values())}; worst "
           f"{ratios[worst]:.3f}x at {_pt(worst)}; geomean {geomean(ratios.values()):.3f}) | – | "
           f"{_yes(not beyond)} |"]
    if beyond:
        out.append("| (points beyond it: " +
                   ", ".join(f"{_pt(k)}: {ratios[k]:.3f}" for k in beyond) + ") | | | |")
    return out


def plot(by_point, impls, path, merged):
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("report: matplotlib missing, no PNG")
        return
    fig, axes = plt.subplots(2, 2, figsize=(12, 9))
    styles = {"split_kv": "-o", "split_kv_sm90a": "-D", "baseline": "--s", "flashinfer_fa3": "-.^",
              "flashmla": "-.v", "torch_ref": ":x", "previous": ":D"}
    for row, h in enumerate((16, 128)):
        for col, b in enumerate((1, 64)):
            ax = axes[row][col]
            for impl in impls:
                if impl.startswith("split_kv_sm90a_"):  # forced schedules: in the table only
                    continue
                for s, color in ((1, "tab:blue"), (4, "tab:red")):
                    pts = sorted((k[3], v[impl]["graph_us_p50"]) for k, v in by_point.items()
                                 if k[0] == h and k[1] == s and k[2] == b and impl in v)
                    if pts:
                        ax.plot([p[0] for p in pts], [p[1] for p in pts], styles.get(impl, "-"),
                                color=color, label=f"{impl} s_q={s}")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"h_q={h}, batch {b}")
            ax.set_xlabel("sequence length (tokens)")
            ax.set_ylabel("graph replay time (µs)")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=7)
    fig.suptitle(f"MLA verify, {merged['device']}, {merged['git'][:12]}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
