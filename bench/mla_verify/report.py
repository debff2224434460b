"""Merges the MLA verify benchmark (ours) and the peers' results into bench/results/mla_verify.json,
and renders mla_verify.md (table, targets, who wins each point) and mla_verify.png (time vs
length per h_q).

  python3 report.py OURS.json [PEERS.json] --out-dir DIR --command "..." [--previous PREV.json]
                   [--trace TRACE.md]

Both inputs must name the same commit. Peers' fractions are computed against the ceilings the
CUDA benchmark measured in the same run. PREV.json: the same benchmark built from an earlier
commit and run in the same call (its dispatched records become impl "previous", the kernel the
"never slower than" target compares with). TRACE.md: trace_report.py's table, appended.
"""
from __future__ import annotations

import argparse
import json
import math
import os
from collections import defaultdict

ORDER = ("split_kv", "split_kv_sm90a", "split_kv_sm90a_pairs", "split_kv_sm90a_one_page",
         "split_kv_sm90a_swap_ab",
         "previous", "baseline", "flashinfer_fa3", "flashmla", "torch_ref")
PREVIOUS = "previous"
# "ours" in the targets: the split path LaunchMlaVerify dispatches to for the shape (the
# record the benchmark marks "dispatched").
OURS = "ours"


def key(r):
    s = r["shape"]
    return (s["h_q"], s["s_q"], s["batch"], s["seqlen"])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("ours")
    ap.add_argument("peers", nargs="?")
    ap.add_argument("--out-dir", required=True)
    ap.add_argument("--command", required=True)
    ap.add_argument("--previous")
    ap.add_argument("--trace")
    args = ap.parse_args()
    ours = json.load(open(args.ours))
    peers = json.load(open(args.peers)) if args.peers and os.path.exists(args.peers) else None
    if peers and peers["git"] != ours["git"]:
        raise SystemExit(f"report: ours {ours['git']} and peers {peers['git']} name different commits")
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
    os.makedirs(args.out_dir, exist_ok=True)
    with open(os.path.join(args.out_dir, "mla_verify.json"), "w") as f:
        json.dump(merged, f, indent=1)

    by_point = defaultdict(dict)
    for r in records:
        by_point[key(r)][r["impl"]] = r
        if r.get("dispatched"):
            by_point[key(r)][OURS] = r
    impls = [i for i in ORDER if any(i in v for v in by_point.values())]
    for d in by_point.values():  # "ours" falls back to split_kv in files without the mark
        if OURS not in d and "split_kv" in d:
            d[OURS] = d["split_kv"]

    lines = [f"# MLA verify on {merged['device']}", "",
             f"- commit `{merged['git']}`, {merged['date']}",
             f"- command: `{args.command}`",
             f"- ceilings measured in the same run: copy {ceil['copy_gbps']:.0f} GB/s "
             f"(cudaMemcpy D2D, read + write), cuBLAS bf16 GEMM {ceil['bf16_tflops']:.0f} TFLOP/s",
             f"- counting: {merged['counting']}",
             "- times: median of CUDA-graph replays (µs), inputs rotated so the working set "
             "exceeds 400 MB"]
    if previous_git:
        lines.append(f"- previous: the same benchmark built from `{previous_git}`, its dispatched "
                     "path, in the same run")
    lines.append("")
    lines += targets(by_point, ceil)
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
    print("\n".join(targets(by_point, ceil)))


def time_ratios(by_point, other):
    """{point: ours / `other`'s time} at every point where both ran."""
    return {k: d[OURS]["graph_us_p50"] / d[other]["graph_us_p50"]
            for k, d in by_point.items() if OURS in d and other in d}


def geomean(values):
    values = list(values)
    return math.prod(values) ** (1.0 / len(values)) if values else float("nan")


def targets(by_point, ceil):
    """The targets of issue 28, each with our value, FlashInfer's and whether it is met."""
    out = ["## Targets (issue 28)", "",
           "| target | ours | flashinfer_fa3 | met |", "|---|---|---|---|"]

    def frac(r):
        return r["gbps"] / ceil["copy_gbps"]

    def fi_cell(k, fn, fmt):
        fi = by_point[k].get("flashinfer_fa3")
        return fmt % fn(fi) if fi else "–"

    # 1. h_q=16, s_q 1/2/4, KV >= 300 MB: >= 0.88 of copy at the worst such point.
    pts = [k for k in by_point if k[0] == 16 and k[1] <= 4 and k[2] * k[3] * 1152 >= 300e6]
    for s in (1, 2, 4):
        ks = [k for k in pts if k[1] == s and OURS in by_point[k]]
        if not ks:
            continue
        worst = min(ks, key=lambda k: frac(by_point[k][OURS]))
        sp = frac(by_point[worst][OURS])
        out.append(f"| h_q=16 s_q={s}, KV >= 300 MB (worst of {len(ks)} points: batch {worst[2]} x "
                   f"{worst[3]}): >= 0.88 of copy | {sp:.2f} | {fi_cell(worst, frac, '%.2f')} | "
                   f"{'yes' if sp >= 0.88 else 'no'} |")
    # 2. h_q=128, batch 64 x 16k, s_q 1/2/4/8: >= 620 TFLOP/s.
    for s in (1, 2, 4, 8):
        k = (128, s, 64, 16384)
        if k in by_point and OURS in by_point[k]:
            sp = by_point[k][OURS]["tflops"]
            out.append(f"| h_q=128 s_q={s}, batch 64 x 16k: >= 620 TFLOP/s | {sp:.0f} | "
                       f"{fi_cell(k, lambda r: r['tflops'], '%.0f')} | {'yes' if sp >= 620 else 'no'} |")
    # 3. batch 1 x 64k, h_q=16, s_q 1..8: >= 0.55 of copy.
    for s in (1, 2, 4, 8):
        k = (16, s, 1, 65536)
        if k in by_point and OURS in by_point[k]:
            sp = frac(by_point[k][OURS])
            out.append(f"| batch 1 x 64k h_q=16 s_q={s}: >= 0.55 of copy | {sp:.2f} | "
                       f"{fi_cell(k, frac, '%.2f')} | {'yes' if sp >= 0.55 else 'no'} |")
    # 4. Never slower than the baseline, nor than the previous kernel (where it was run).
    both = [k for k in by_point if OURS in by_point[k] and "baseline" in by_point[k]]
    slower = [k for k in both if by_point[k][OURS]["graph_us_p50"] >
              by_point[k]["baseline"]["graph_us_p50"]]
    if both:
        out.append(f"| never slower than baseline | slower at {len(slower)} of {len(both)} points | – "
                   f"| {'yes' if not slower else 'no'} |")
    else:
        out.append("| never slower than baseline | not run in this sweep | – | – |")
    ratios = time_ratios(by_point, PREVIOUS)
    prev = list(ratios)
    if prev:
        worse = sorted(k for k in prev if ratios[k] > 1.0)
        beyond = sorted(k for k in prev if ratios[k] > 1.02)
        worst = max(prev, key=lambda k: ratios[k])
        gm = geomean(ratios.values())
        out.append(f"| never slower than the previous kernel (`{by_point[worst][PREVIOUS].get('previous_git', '')[:7]}`) | "
                   f"slower at {len(worse)} of {len(prev)} points, {len(beyond)} of them by more "
                   f"than 2% (worst {ratios[worst]:.3f}x its time at h{worst[0]} s{worst[1]} "
                   f"b{worst[2]} {worst[3]}; geomean {gm:.3f}) | – | "
                   f"{'yes' if not worse else 'no'} |")
        if beyond:
            out_beyond = ", ".join(f"h{k[0]} s{k[1]} b{k[2]} {k[3]}: {ratios[k]:.3f}" for k in beyond)
            out.append(f"| (points more than 2% slower than the previous kernel: {out_beyond}) | | | |")
    # 5. Faster than FlashInfer at every point, or within 3% where both are >= 0.90 of copy.
    vs_fi = time_ratios(by_point, "flashinfer_fa3")
    vs = list(vs_fi)

    def excused(k):
        o, f = by_point[k][OURS], by_point[k]["flashinfer_fa3"]
        return (frac(o) >= 0.90 and frac(f) >= 0.90 and
                o["graph_us_p50"] <= 1.03 * f["graph_us_p50"])
    lose = [k for k in vs if vs_fi[k] > 1.0]
    lose_unexcused = [k for k in lose if not excused(k)]
    gm = geomean(vs_fi.values())
    out.append(f"| faster than FlashInfer at every point (or within 3% where both >= 0.90 of copy) | "
               f"slower at {len(lose)} of {len(vs)} points, {len(lose) - len(lose_unexcused)} of them "
               f"within the 3% (geomean ours / FlashInfer time {gm:.3f}) | – | "
               f"{'yes' if vs and not lose_unexcused else 'no'} |")
    # FlashMLA, where it ran: not a target of its own, its standing beside ours.
    vs_mla = time_ratios(by_point, "flashmla")
    if vs_mla:
        out.append(f"| (beside FlashMLA's sm90 dense decode) | slower at "
                   f"{sum(r > 1 for r in vs_mla.values())} of {len(vs_mla)} points (geomean ours / "
                   f"FlashMLA time {geomean(vs_mla.values()):.3f}) | – | – |")
    if slower:
        out += ["", "Points where ours is slower than the baseline (ours / baseline time): " +
                ", ".join(f"h{k[0]} s{k[1]} b{k[2]} {k[3]}: "
                          f"{by_point[k][OURS]['graph_us_p50'] / by_point[k]['baseline']['graph_us_p50']:.2f}"
                          for k in sorted(slower))]
    if lose:
        out += ["", "Points where FlashInfer is faster (ours / FlashInfer time; * = within 3% with both "
                ">= 0.90 of copy): " +
                ", ".join(f"h{k[0]} s{k[1]} b{k[2]} {k[3]}: "
                          f"{by_point[k][OURS]['graph_us_p50'] / by_point[k]['flashinfer_fa3']['graph_us_p50']:.2f}"
                          f"{'*' if excused(k) else ''}"
                          for k in sorted(lose))]
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
