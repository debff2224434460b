#!/usr/bin/env python3
"""Google Benchmark JSON of metrics_bench -> bench/results/metrics_observe.{json,md}.

  report_metrics.py --run RAW.json LABEL "machine description" [--run ...] \
      --command "metrics_bench ..." --json OUT.json --md OUT.md

One --run per machine (e.g. the 2-vCPU build machine and the 16-core GPU host). Plain Python 3.
"""
import argparse
import datetime
import json
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import receipt  # noqa: E402

RPC_RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "results",
                           "rpc_score.json")

IMPL = {"Sharded": "sharded", "PrometheusCpp": "prometheus_cpp",
        "PrometheusCppCached": "prometheus_cpp_cached"}
OP = {"ScoreRpc": "score_rpc", "Observe": "observe", "Scrape": "scrape"}


def small_rpc_ns(path):
    """The floor of any Score RPC: the bare gRPC unary echo p50 over a Unix socket, one client,
    from the committed RPC benchmark. 1% of it is the recording budget per RPC."""
    with open(path) as f:
        doc = json.load(f)
    for r in doc["records"]:
        s = r["shape"]
        if (r["impl"] == "echo" and s.get("transport") == "uds" and s.get("concurrency") == 1
                and s.get("R") == 1):
            return r["latency_us"]["p50"] * 1e3, doc["git"]
    raise SystemExit(f"{path}: no single-client UDS echo record")


def to_ns(value, unit):
    return value * {"ns": 1, "us": 1e3, "ms": 1e6, "s": 1e9}[unit]


def records_of(raw, label, floor_ns):
    out = []
    for b in raw["benchmarks"]:
        if b.get("aggregate_name", "median") != "median":
            continue
        m = re.match(r"BM_([A-Za-z]+?)(?:_(\w+?))?(?:/threads:(\d+))?(?:_median)?$", b["name"])
        op, impl, threads = m.group(1), m.group(2), int(m.group(3) or 1)
        cpu_ns = to_ns(b["cpu_time"], b["time_unit"])
        wall_ns = to_ns(b["real_time"], b["time_unit"])
        rec = {"bench": "metrics_observe", "impl": IMPL.get(impl, "sharded"), "op": OP[op],
               "machine": label, "dtype": None, "shape": {"threads": threads},
               "graph_us_p50": None, "eager_us_p50": None,
               "cpu_ns_per_op": round(cpu_ns, 1), "wall_ns_per_op": round(wall_ns, 1),
               "ops_per_second": round(1e9 / wall_ns) if wall_ns else None}
        if op == "ScoreRpc":
            rec["frac_small_rpc"] = round(cpu_ns / floor_ns, 5)
        if "exposition_bytes" in b:
            rec["exposition_bytes"] = int(b["exposition_bytes"])
        out.append(rec)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--run", nargs=3, action="append", required=True,
                    metavar=("RAW", "LABEL", "DESCRIPTION"))
    ap.add_argument("--command", required=True)
    ap.add_argument("--json", required=True)
    ap.add_argument("--md", required=True)
    ap.add_argument("--rpc-results", default=RPC_RESULTS,
                    help="the RPC benchmark results whose echo p50 is the budget's base")
    receipt.add_arguments(ap)
    args = ap.parse_args()
    git = receipt.from_args(args)
    floor_ns, floor_git = small_rpc_ns(args.rpc_results)
    machines, records = [], []
    for path, label, description in args.run:
        with open(path) as f:
            raw = json.load(f)
        ctx = raw["context"]
        machines.append({"label": label, "description": description,
                         "logical_cpus": ctx["num_cpus"], "mhz_per_cpu": ctx.get("mhz_per_cpu"),
                         "load_avg_at_start": ctx.get("load_avg"), "date": ctx.get("date"),
                         "benchmark_library_build_type": ctx.get("library_build_type")})
        records.extend(records_of(raw, label, floor_ns))
    doc = {
        "device": "; ".join(f"{m['label']}: {m['description']}" for m in machines),
        "git": git,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "command": args.command,
        "ceilings": {"copy_gbps": None, "bf16_tflops": None},  # a CPU benchmark: not applicable
        "machines": machines,
        "small_rpc_ns": round(floor_ns),
        "small_rpc_source": f"bench/results/rpc_score.json (git {floor_git}): echo, uds, 1 client, p50",
        "records": records,
    }
    with open(args.json, "w") as f:
        json.dump(doc, f, indent=2)
        f.write("\n")

    L = ["# Metrics recording cost (`metrics_bench`)\n",
         f"git `{doc['git']}`, {doc['date']}. Command (medians of 3 repetitions; "
         f"`bench/metrics/run.sh` runs it and this report):\n",
         f"    {doc['command']}\n",
         "Machines:\n"]
    for m in machines:
        L.append(f"- **{m['label']}**: {m['description']}, {m['logical_cpus']} logical CPUs, "
                 f"load average at start {m['load_avg_at_start']}.")
    L.append("")
    for m in machines:
        if m["logical_cpus"] < 16:
            L.append(f"**{m['label']} has only {m['logical_cpus']} logical CPUs**: with 4, 8 and "
                     f"16 threads the threads oversubscribe the cores, so at most "
                     f"{m['logical_cpus']} record at the same instant; contention among 16 truly "
                     "parallel threads is not reproduced there. The 16-thread numbers of a "
                     "16-core machine are in the other table.\n")
    L.append("`score_rpc` = everything one Score records: `RpcStarted`, `ScoreStages` with all of "
             "queue/staging/kernel/total (the CUDA backend's case), `RpcFinished` — 1 counter, 2 "
             "gauge updates, 5 histogram observations and their label lookups. `observe` = one "
             "histogram observation with its label lookup. **cpu ns/op** = CPU time of all "
             "threads / operations of all threads (what one operation costs); **wall ns/op** = "
             "wall time / operations of all threads (inverse throughput). Budget: 1% of a small "
             "Score RPC, whose floor is the bare gRPC unary p50 over a Unix socket, "
             f"{floor_ns / 1000:.0f} µs (bench/results/rpc_score.json, git {floor_git}) → "
             f"{floor_ns / 100 / 1000:.2f} µs of recording per RPC.\n")
    L.append("impls: `sharded` = server/observability/metrics.cc (per-thread shards of relaxed atomics, summed at "
             "scrape time; lock-free label lookup); `prometheus_cpp` = the first implementation "
             "(prometheus-cpp `Family::Add(labels)` + `Observe` per observation); "
             "`prometheus_cpp_cached` = prometheus-cpp with the histogram handle looked up once "
             "(all threads then update the same atomics).\n")
    for m in machines:
        L.append(f"## {m['label']}\n")
        L.append("| op | impl | threads | cpu ns/op | wall ns/op | ops/s (all threads) "
                 "| % of a small RPC |")
        L.append("|---|---|---:|---:|---:|---:|---:|")
        for r in records:
            if r["machine"] != m["label"] or r["op"] == "scrape":
                continue
            frac = f"{100 * r['frac_small_rpc']:.2f}%" if "frac_small_rpc" in r else "—"
            L.append(f"| {r['op']} | {r['impl']} | {r['shape']['threads']} "
                     f"| {r['cpu_ns_per_op']:.1f} | {r['wall_ns_per_op']:.1f} "
                     f"| {r['ops_per_second']:,} | {frac} |")
        for r in records:
            if r["machine"] == m["label"] and r["op"] == "scrape":
                L.append(f"\nA scrape (Collect + text serialisation, on the exposer's thread, not "
                         f"on requests) with 8 probe sets × 2 kernel paths recorded: "
                         f"{r['cpu_ns_per_op'] / 1e3:.0f} µs CPU for "
                         f"{r['exposition_bytes'] / 1024:.0f} KiB of text.")
        L.append("")
    L.append("Google Benchmark is Debian's libbenchmark 1.7.1 (it reports itself as a debug "
             "build; the code measured is the project's Release build).")
    with open(args.md, "w") as f:
        f.write("\n".join(L) + "\n")


if __name__ == "__main__":
    main()
