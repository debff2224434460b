#!/usr/bin/env python3
"""Joins probe-score results JSON files into one markdown report.

  python3 bench/report.py bench/results/probe_score_cuda.json \
      bench/results/probe_score_peers.json --out bench/results/probe_score.md \
      --command "bench/run_probe_score.sh build-kernels bench/results" [--dispatch-table FILE]

Receipts (bench/receipt.py): every input must name its full commit (results marked "+dirty" only
with --allow-dirty), and the report records the commit it was rendered from (--git,
$PROBE_SIDECAR_GIT, or the checkout). With --dispatch-table, which labels the dispatch column with
the dispatcher as compiled, every input must come from that same commit.

Plain Python 3 (no numpy): runs here and on the GPU machine.
"""
import argparse
import json
import os

import receipt

OURS = ["fused_cuda", "fused_tc", "gather_gemm", "gather_wgmma"]
# Exact precision on the tensor-core paths (fused_cuda always uses the float32 weights).
EXACT = ["fused_cuda"] + [i + "+exact" for i in OURS[1:]]
SHORT = {"fused_cuda": "cuda", "fused_tc": "tc", "gather_gemm": "gemm", "gather_wgmma": "wgmma"}
PEERS = ["triton", "torch_two_op", "torch_addmm"]


def fmt(v, nd=1):
    return "—" if v is None else f"{v:.{nd}f}"


def load(paths):
    docs, recs = [], {}
    for p in paths:
        with open(p) as f:
            d = json.load(f)
        d["_path"] = p
        docs.append(d)
        for r in d["records"]:
            key = (r["dtype"], r["shape"]["R"], r["shape"]["H"], r["shape"]["P"])
            recs.setdefault(key, {})[r["impl"]] = r
    return docs, recs


def check_receipts(docs, identity, allow_dirty, same_commit):
    """Refuses inputs that do not name their commit, dirty ones unless allowed, and (with a
    dispatch table) inputs from another commit than the report's."""
    for d in docs:
        git = d.get("git") or ""
        try:
            if not git:
                raise SystemExit("names no commit")
            receipt.check(receipt.identify(git), allow_dirty)
        except SystemExit as e:
            raise SystemExit(f"report: {d['_path']}: {e}") from None
        if same_commit and git != identity:
            raise SystemExit(f"report: {d['_path']} was measured at {git}, but the dispatch table "
                             f"comes from {identity}: re-run the benchmark, or leave the table out")


def g(recs, key, impl):
    r = recs.get(key, {}).get(impl)
    return None if r is None else r.get("graph_us_p50")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("files", nargs="+")
    ap.add_argument("--out", required=True)
    ap.add_argument("--command", default=None, help="the command that produced the results")
    ap.add_argument("--dispatch-table", default=None,
                    help="'dtype R H P path' lines (probe-score-bench --dispatch-table): label the "
                         "dispatch column with the dispatcher as compiled now")
    receipt.add_arguments(ap)
    args = ap.parse_args()
    identity = receipt.from_args(args)
    docs, recs = load(args.files)
    check_receipts(docs, identity, args.allow_dirty, same_commit=bool(args.dispatch_table))
    if args.dispatch_table:
        with open(args.dispatch_table) as f:
            for line in f:
                parts = line.split()
                if len(parts) < 5:
                    continue
                key = (parts[0], int(parts[1]), int(parts[2]), int(parts[3]))
                chosen = recs.get(key, {}).get(parts[4])
                if len(parts) > 5:
                    # fused_tc with a plan ("tile=NAME splits=S"): the record (default or
                    # variant) that ran exactly this plan, when the run measured it.
                    plan = " ".join(parts[5:7]) + " "
                    same = [r for i, r in recs.get(key, {}).items()
                            if i.startswith(parts[4]) and r.get("variant", "").startswith(plan)]
                    if same:
                        chosen = min(same, key=lambda r: r["graph_us_p50"])
                    elif chosen is not None:
                        chosen = dict(chosen)
                        chosen["_unmeasured_plan"] = plan.strip()
                if chosen is not None:
                    d = dict(chosen)
                    d["impl"], d["path"] = "dispatch", parts[4]
                    if d.get("_unmeasured_plan"):
                        d["path"] += "*"
                    recs[key]["dispatch"] = d
    ours_doc = next((d for d in docs if any(r["impl"] == "dispatch" for r in d["records"])),
                    docs[0])
    ceil = ours_doc["ceilings"]
    L = []
    L.append("# Probe scoring: fused gather + linear probes on the GPU\n")
    L.append(f"Device: **{ours_doc['device']}**, git `{ours_doc['git']}`, {ours_doc['date']}; "
             f"report rendered from `{identity}`.  ")
    L.append(f"Ceilings measured in the same run: copy **{ceil['copy_gbps']:.0f} GB/s** "
             f"(cudaMemcpy D2D, read + write), bf16 GEMM **{ceil['bf16_tflops']:.0f} TFLOP/s** "
             f"(cuBLAS 8192³).")
    for d in docs:
        if d is not ours_doc:
            c = d["ceilings"]
            L.append(f"Peer run ceilings ({os.path.basename(d['_path'])}, git `{d['git']}`): copy "
                     f"{c['copy_gbps']:.0f} GB/s, bf16 GEMM {c['bf16_tflops']:.0f} TFLOP/s.")
    L.append("")
    L.append("## Commands\n")
    if args.command:
        L.append(f"- `{args.command}`")
    for d in docs:
        L.append(f"- `{d['command']}` → `{os.path.basename(d['_path'])}`")
    L.append("")
    L.append("The dispatch column is the path `ChooseProbeScorePath` picks "
             + ("(as compiled when this report was made: `probe-score-bench --dispatch-table`)"
                if args.dispatch_table else "(as compiled into the benchmark)")
             + ", timed as that path's default launch plan in this run.\n")
    L.append("Times are device time in µs, median of graph replays (each replay between its own "
             "pair of events, the stream held by a spin kernel while the replays are queued), "
             "rotating over 8 request slots whose random rows come from a 2 GiB activation pool. "
             "Minimum bytes = R·H·e + P·H·e + 4·R·P + 4·R; FLOPs = 2·R·H·P. The torch peers "
             "produce a bf16/fp16 [R, P] (what `torch.addmm` returns); ours write fp32.\n")

    L.append("## All sizes (graph replay p50, µs)\n")
    L.append("`*` after the dispatch path: the launch plan the code picks now "
             "(`tile=… splits=…`) was not timed in this run; the time shown is that path's "
             "default plan in the run.\n")
    L.append("Our paths at fast precision (weights rounded to the activations' type on tensor "
             "cores); `dispatch` runs the precision a set of P probes gets by default "
             "(`+exact` in its path when that is exact). Exact-precision times: section "
             "\"Precision\".\n")
    L.append("| dtype | R | H | P | Triton | fused_cuda | fused_tc | gather_gemm | gather_wgmma | "
             "dispatch (path) | torch two-op | torch addmm | dispatch GB/s | frac copy | "
             "frac TFLOP/s | two-op / dispatch |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|")
    keys = sorted(recs, key=lambda k: (["bf16", "fp16", "fp32"].index(k[0]), k[2], k[3], k[1]))
    for key in keys:
        dtype, R, H, P = key
        d = recs[key].get("dispatch")
        cells = [dtype, str(R), str(H), str(P), fmt(g(recs, key, "triton"))]
        cells += [fmt(g(recs, key, i)) for i in OURS]
        cells.append(f"{fmt(d and d['graph_us_p50'])} ({d['path'] if d else '—'})")
        cells += [fmt(g(recs, key, "torch_two_op")), fmt(g(recs, key, "torch_addmm"))]
        if d:
            cells += [f"{d['gbps']:.0f}", f"{d['frac_copy']:.2f}", f"{d['frac_tflops']:.3f}"]
            two = g(recs, key, "torch_two_op")
            cells.append(f"{two / d['graph_us_p50']:.2f}x" if two else "—")
        else:
            cells += ["—"] * 4
        L.append("| " + " | ".join(cells) + " |")
    L.append("")

    L.append("## Eager (no graph) p50, µs\n")
    L.append("| dtype | R | H | P | Triton | fused_cuda | fused_tc | gather_gemm | gather_wgmma | "
             "torch two-op | torch addmm |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in keys:
        row = [key[0], str(key[1]), str(key[2]), str(key[3])]
        for impl in ["triton"] + OURS + ["torch_two_op", "torch_addmm"]:
            r = recs[key].get(impl)
            row.append(fmt(r and r.get("eager_us_p50")))
        L.append("| " + " | ".join(row) + " |")
    L.append("")

    # Targets.
    L.append("## Targets\n")
    L.append("| target | shape | measured | verdict |")
    L.append("|---|---|---|---|")

    def verdict(ok):
        return "met" if ok else "**missed**"

    for H in (4096, 8192):
        for P in (1, 16):
            key = ("bf16", 8192, H, P)
            d = recs.get(key, {}).get("dispatch")
            tri = g(recs, key, "triton")
            if d and tri:
                ok = d["frac_copy"] >= 0.85 and 1.1 * d["graph_us_p50"] <= tri
                L.append(f"| ≥0.85 of copy ceiling and ≥10% faster than Triton | bf16 R=8192 "
                         f"H={H} P={P} | {d['graph_us_p50']:.1f} µs ({d['path']}) = "
                         f"{d['frac_copy']:.2f} of copy; Triton {tri:.1f} µs "
                         f"({tri / d['graph_us_p50']:.2f}x) | {verdict(ok)} |")
    for key in keys:
        dtype, R, H, P = key
        if dtype != "bf16" or R > 64 or H != 4096:
            continue
        d = recs[key].get("dispatch")
        two = g(recs, key, "torch_two_op")
        if d and two:
            ok = d["graph_us_p50"] <= two + 1.0
            L.append(f"| ≤ torch two-op + 1 µs | bf16 R={R} H={H} P={P} | {d['graph_us_p50']:.1f} "
                     f"({d['path']}) vs {two:.1f} µs | {verdict(ok)} |")
    key = ("bf16", 64, 4096, 1024)
    d = recs.get(key, {}).get("dispatch")
    adm = g(recs, key, "torch_addmm")
    if d and adm:
        L.append(f"| within 10% of cuBLAS on pre-gathered rows | bf16 R=64 H=4096 P=1024 | "
                 f"{d['graph_us_p50']:.1f} ({d['path']}) vs {adm:.1f} µs "
                 f"({d['graph_us_p50'] / adm:.2f}x) | {verdict(d['graph_us_p50'] <= 1.1 * adm)} |")
    key = ("bf16", 8192, 4096, 1024)
    d = recs.get(key, {}).get("dispatch")
    two = g(recs, key, "torch_two_op")
    adm = g(recs, key, "torch_addmm")
    if d and two:
        L.append(f"| ≥1.25x faster than torch two-op | bf16 R=8192 H=4096 P=1024 | "
                 f"{d['graph_us_p50']:.1f} ({d['path']}) vs {two:.1f} µs "
                 f"({two / d['graph_us_p50']:.2f}x) | {verdict(two / d['graph_us_p50'] >= 1.25)} |")
    if d and adm:
        L.append(f"| within 5% of cuBLAS on pre-gathered rows | bf16 R=8192 H=4096 P=1024 | "
                 f"{d['graph_us_p50']:.1f} vs {adm:.1f} µs ({d['graph_us_p50'] / adm:.2f}x) | "
                 f"{verdict(d['graph_us_p50'] <= 1.05 * adm)} |")
    L.append("")

    # Roofline of the memory-bound shapes.
    L.append("## Where the time goes at P <= 16 (roofline)\n")
    L.append("A graph replay of the dispatched path costs a fixed part (its time at R = 1: launch, "
             "argument reads, the first row's latency) plus the streaming of the rows. Predicted "
             "= fixed + minimum bytes / copy ceiling; `stream GB/s` = minimum bytes / (measured "
             "− fixed), the bandwidth the kernel reaches once it runs.\n")
    L.append("| dtype | R | H | P | measured µs | fixed µs (R=1) | bytes / copy ceiling µs | "
             "predicted µs | stream GB/s | stream / copy |")
    L.append("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for key in keys:
        dtype, R, H, P = key
        d = recs[key].get("dispatch")
        base = recs.get((dtype, 1, H, P), {}).get("dispatch")
        if dtype == "fp32" or P > 16 or R < 1024 or not d or not base:
            continue
        fixed = base["graph_us_p50"]
        nbytes = d["gbps"] * 1e9 * d["graph_us_p50"] * 1e-6
        ideal = nbytes / (ceil["copy_gbps"] * 1e9) * 1e6
        stream = nbytes / (max(d["graph_us_p50"] - fixed, 1e-3) * 1e-6) / 1e9
        L.append(f"| {dtype} | {R} | {H} | {P} | {d['graph_us_p50']:.1f} | {fixed:.1f} | "
                 f"{ideal:.1f} | {fixed + ideal:.1f} | {stream:.0f} | "
                 f"{stream / ceil['copy_gbps']:.2f} |")
    L.append("")

    # Precision.
    L.append("## Precision: the fastest exact path vs the fastest fast path (graph replay µs)\n")
    L.append("Exact: the file's float32 weights (fused_cuda; the tensor-core paths with three "
             "16-bit weight terms). Fast: weights rounded to the activations' type on tensor "
             "cores. The default (`kExactByDefaultMaxProbes` in "
             "kernels/probe_score/probe_score_precision.h) is exact only for probe counts whose "
             "every measured shape costs under 5% more.\n")
    L.append("| dtype | R | H | P | fast (path) | exact (path) | exact / fast |")
    L.append("|---|---:|---:|---:|---|---|---:|")
    worst_by_p = {}
    for key in keys:
        if key[0] == "fp32":
            continue
        fast = {i: g(recs, key, i) for i in OURS if g(recs, key, i)}
        exact = {i: g(recs, key, i) for i in EXACT if g(recs, key, i)}
        if not fast or not exact:
            continue
        bf, be = min(fast, key=fast.get), min(exact, key=exact.get)
        ratio = exact[be] / fast[bf]
        worst_by_p[key[3]] = max(worst_by_p.get(key[3], 0.0), ratio)
        L.append(f"| {key[0]} | {key[1]} | {key[2]} | {key[3]} | {fast[bf]:.1f} ({bf}) | "
                 f"{exact[be]:.1f} ({be}) | {ratio:.2f}x |")
    L.append("")
    if worst_by_p:
        L.append("Worst exact / fast over the measured shapes, per P: " + ", ".join(
            f"P={p}: {r:.2f}x" for p, r in sorted(worst_by_p.items())) + ".\n")

    # Crossovers.
    L.append("## Crossovers: the dispatcher's pick vs the fastest of our paths, per precision\n")
    L.append("Each cell: the fastest path measured for the shape at that precision, and, when the "
             "dispatcher (`ChooseProbeScorePath`, as compiled into the benchmark) picks another, "
             "what its pick costs. Within 3% counts as the best (run-to-run noise).\n")
    Ps = sorted({k[3] for k in keys})
    total, within = 0, 0

    def short(i):
        return SHORT.get(i.replace("+exact", ""), i)

    for prec, impls in (("fast", OURS), ("exact", EXACT)):
        L.append(f"### {prec}\n")
        L.append("| dtype | H | R \\ P | " + " | ".join(str(p) for p in Ps) + " |")
        L.append("|---|---|---|" + "---|" * len(Ps))
        for dtype in ("bf16", "fp16", "fp32"):
            names = OURS if dtype == "fp32" else impls
            for H in sorted({k[2] for k in keys if k[0] == dtype}):
                for R in sorted({k[1] for k in keys if k[0] == dtype and k[2] == H}):
                    cells = []
                    for P in Ps:
                        key = (dtype, R, H, P)
                        times = {i: g(recs, key, i) for i in names if g(recs, key, i)}
                        d = recs.get(key, {}).get("dispatch:" + prec)
                        if not times or not d:
                            cells.append("")
                            continue
                        best = min(times, key=times.get)
                        loss = d["graph_us_p50"] / times[best]
                        total += 1
                        if loss <= 1.03:
                            within += 1
                            cells.append(short(d["path"]))
                        else:
                            cells.append(f"{short(best)} (picked {short(d['path'])}, {loss:.2f}x)")
                    L.append(f"| {dtype} | {H} | {R} | " + " | ".join(cells) + " |")
        L.append("")
    if total:
        L.append(f"The dispatcher is within 3% of the fastest path at {within} of {total} "
                 f"measured (shape, precision) pairs.\n")

    # Variants (tile configurations, splits, chunking).
    var = [(k, i, r) for k in keys for i, r in recs[k].items() if "[" in i]
    if var:
        L.append("## Variants (tuning overrides, graph replay µs)\n")
        L.append("| dtype | R | H | P | impl | µs | plan |")
        L.append("|---|---:|---:|---:|---|---:|---|")
        for k, i, r in var:
            L.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {i} | {fmt(r['graph_us_p50'])} | "
                     f"{r.get('variant', '')} |")
        L.append("")
    L.append("## Launch plans of the default paths\n")
    L.append("| dtype | R | H | P | impl | plan |")
    L.append("|---|---:|---:|---:|---|---|")
    for k in keys:
        for i in OURS + EXACT[1:]:
            r = recs[k].get(i)
            if r and r.get("variant"):
                L.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | {i} | {r['variant']} |")
    errors = [(k, i, r["error"]) for k in keys for i, r in recs[k].items() if r.get("error")]
    if errors:
        L.append("\n## Errors\n")
        for k, i, e in errors:
            L.append(f"- {k} {i}: {e}")
    with open(args.out, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
