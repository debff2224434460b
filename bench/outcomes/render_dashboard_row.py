#!/usr/bin/env python3
"""The dashboard's "Probe outcomes" row as a PNG, drawn from a real Prometheus' answers to the
row's own queries (dashboards/probe-sidecar.json, variables at their All value): Grafana cannot be
installed here, so each panel's PromQL is sent to Prometheus' HTTP API (query_range for time
series, an instant query for the bar gauge) and drawn with matplotlib in the panels' grid.

    # a real run: a CPU-backend probe-sidecar, Debian's Prometheus scraping it every second, and
    # a client scoring under two labelled sessions, with a fire-rate spike half-way
    python3 bench/outcomes/render_dashboard_row.py --run --seconds 150 \
        --png dashboards/probe-outcomes-row.png

    # or against a Prometheus that already scrapes a sidecar
    python3 bench/outcomes/render_dashboard_row.py --prometheus http://127.0.0.1:9090 \
        --instance 127.0.0.1:9464 --minutes 15 --png row.png

Needs matplotlib (not a CI requirement); --run needs the build (build/bin/probe-sidecar), the
Python client and `prometheus` on PATH.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re
import sys
import time

import requests

ROOT = pathlib.Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "dashboards" / "probe-sidecar.json"
ROW = "Probe outcomes"
RATE_INTERVAL = "30s"  # what $__rate_interval is at a 1 s scrape (>= 4 scrape intervals)


def row_panels(dashboard: dict) -> list[dict]:
    """The panels between the row's header and the next row."""
    panels, inside = [], False
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            if inside:
                break
            inside = panel["title"] == ROW
            continue
        if inside:
            panels.append(panel)
    if not panels:
        raise SystemExit(f"no row {ROW!r} in {DASHBOARD}")
    return panels


def render(expr: str, instance: str) -> str:
    """What Grafana sends with every selector at All."""
    expr = expr.replace("$__rate_interval", RATE_INTERVAL)
    expr = expr.replace("$instance", re.escape(instance).replace("\\", "\\\\"))
    for name in ("device", "probe_set", "model", "replica"):
        expr = expr.replace(f"${name}", ".*")
    return expr


def legend(fmt: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), fmt)


def query_range(url: str, expr: str, start: float, end: float, step: float) -> list[dict]:
    r = requests.get(f"{url}/api/v1/query_range",
                     params={"query": expr, "start": start, "end": end, "step": step}, timeout=30)
    body = r.json()
    if body.get("status") != "success":
        raise SystemExit(f"{expr}: {body}")
    return body["data"]["result"]


def query(url: str, expr: str, at: float) -> list[dict]:
    r = requests.get(f"{url}/api/v1/query", params={"query": expr, "time": at}, timeout=30)
    body = r.json()
    if body.get("status") != "success":
        raise SystemExit(f"{expr}: {body}")
    return body["data"]["result"]


def draw(url: str, instance: str, start: float, end: float, png: pathlib.Path,
         note: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.dates as mdates
    import matplotlib.pyplot as plt
    from datetime import datetime

    panels = row_panels(json.loads(DASHBOARD.read_text()))
    top = min(p["gridPos"]["y"] for p in panels)
    rows = max(p["gridPos"]["y"] + p["gridPos"]["h"] for p in panels) - top
    plt.rcParams.update({"font.size": 7, "axes.titlesize": 9})
    fig = plt.figure(figsize=(18, 0.62 * rows + 1.2), facecolor="#111217")
    fig.suptitle(f"Probe Sidecar — {ROW}   ({instance}; {note})", color="#d8d9da",
                 fontsize=11, x=0.01, y=0.995, ha="left", va="top")
    step = max(1.0, (end - start) / 300)
    header = 0.05  # of the figure's height, for the title
    for panel in panels:
        g = panel["gridPos"]
        # Grafana's grid: 24 columns; the row's height split by grid units under the title,
        # with room for each panel's title and tick labels.
        unit = (1 - header) / rows
        bottom = 1 - header - (g["y"] - top + g["h"]) * unit
        left = 0.075 if panel["type"] == "bargauge" else 0.035  # its names sit left of it
        ax = fig.add_axes([g["x"] / 24 + left, bottom + 0.045, g["w"] / 24 - left - 0.01,
                           g["h"] * unit - 0.085], facecolor="#181b1f")
        ax.set_title(panel["title"], color="#d8d9da", loc="left")
        ax.tick_params(colors="#9fa7b3")
        for spine in ax.spines.values():
            spine.set_color("#2c3235")
        panel_unit = panel.get("fieldConfig", {}).get("defaults", {}).get("unit", "")
        if panel["type"] == "bargauge":
            (target,) = panel["targets"]
            result = query(url, render(target["expr"], instance), end)
            result.sort(key=lambda r: float(r["value"][1]))
            names = [legend(target["legendFormat"], r["metric"]) for r in result]
            values = [float(r["value"][1]) for r in result]
            bars = ax.barh(names, values, color=plt.cm.RdYlGn_r([min(v / 0.5, 1) for v in values]))
            ax.set_xlim(0, 1 if panel_unit == "percentunit" else None)
            for bar, v in zip(bars, values):
                ax.text(bar.get_width() + 0.01, bar.get_y() + bar.get_height() / 2,
                        f"{100 * v:.1f}%" if panel_unit == "percentunit" else f"{v:.3g}",
                        va="center", color="#d8d9da")
            ax.tick_params(axis="y", labelsize=7)
            continue
        for target in panel["targets"]:
            for r in query_range(url, render(target["expr"], instance), start, end, step):
                points = [(float(t), float(v)) for t, v in r["values"]]
                xs = [datetime.fromtimestamp(t) for t, _ in points]
                ys = [v for _, v in points]
                ax.plot(xs, ys, linewidth=1.1, label=legend(target["legendFormat"], r["metric"]))
        ax.xaxis.set_major_formatter(mdates.DateFormatter("%H:%M:%S"))
        if panel_unit == "percentunit":
            ax.yaxis.set_major_formatter(matplotlib.ticker.PercentFormatter(1.0))
        ax.grid(color="#2c3235", linewidth=0.5)
        ax.legend(loc="upper left", fontsize=6, facecolor="#181b1f", edgecolor="#2c3235",
                  labelcolor="#d8d9da", ncol=2 if len(ax.lines) > 6 else 1)
    fig.savefig(png, dpi=110, facecolor=fig.get_facecolor())
    print(f"wrote {png}")


def run(seconds: float, png: pathlib.Path) -> None:
    """A real CPU-backend sidecar and Prometheus, and traffic with a spike; then draws the row."""
    sys.path.insert(0, str(ROOT / "tests" / "python"))
    import shutil
    import tempfile

    import numpy as np

    from conftest import Sidecar
    from probe_files import ProbeFile
    from test_prometheus import Prometheus

    workdir = pathlib.Path(tempfile.mkdtemp(prefix="probe-outcomes-row-"))
    sidecar = Sidecar(["--backend=cpu"]).start()
    prometheus = None
    try:
        hidden = 256
        safety = ProbeFile(4, hidden, seed=7, activation="sigmoid",
                           names=["deception", "refusal", "pii", "jailbreak"],
                           thresholds=[0.8, 0.7, 0.9, 0.85])
        with sidecar.client() as c:
            c.load_probe_set("safety", data=safety.data)
        prometheus = Prometheus(sidecar.metrics_address, workdir)
        rng = np.random.default_rng(0)
        # The "deception" direction: activations along it push that probe's score up.
        direction = safety.weight[0] / np.linalg.norm(safety.weight[0])
        start = time.time()
        with sidecar.client() as c:
            sessions = {(m, r): c.open_session({"model": m, "replica": r})
                        for m, r in (("llama-3-8b", "0"), ("llama-3-8b", "1"), ("qwen-7b", "0"))}
            while time.time() - start < seconds:
                t = (time.time() - start) / seconds
                for (model, replica), session in sessions.items():
                    x = rng.standard_normal((64, hidden)).astype(np.float32)
                    # Replica 1 of llama drifts toward deception in the middle third.
                    push = 6.0 if (model, replica) == ("llama-3-8b", "1") and 0.4 < t < 0.75 else 0
                    x += push * direction[None, :] * (rng.random((64, 1)) < 0.5)
                    c.score(x, list(range(64)), "safety", session=session)
                    c.score(rng.standard_normal((8, 4096)).astype(np.float32), list(range(8)),
                            "demo", session=session)
                time.sleep(0.05)
            for session in sessions.values():
                session.close()
        time.sleep(3)  # the last scrapes
        end = time.time()
        draw(prometheus.url, sidecar.metrics_address, start, end, png,
             f"CPU backend, {seconds:.0f} s of traffic, rendered from Prometheus' answers")
    finally:
        if prometheus is not None:
            prometheus.stop()
        sidecar.close()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--png", type=pathlib.Path, required=True)
    ap.add_argument("--run", action="store_true", help="start a sidecar and Prometheus here")
    ap.add_argument("--seconds", type=float, default=150, help="--run: traffic duration")
    ap.add_argument("--prometheus", help="a Prometheus URL (without --run)")
    ap.add_argument("--instance", help="the sidecar's instance label (without --run)")
    ap.add_argument("--minutes", type=float, default=15, help="the range drawn (without --run)")
    args = ap.parse_args()
    if args.run:
        run(args.seconds, args.png)
    elif args.prometheus and args.instance:
        end = time.time()
        draw(args.prometheus, args.instance, end - 60 * args.minutes, end, args.png,
             f"last {args.minutes:g} minutes")
    else:
        ap.error("--run, or --prometheus and --instance")


if __name__ == "__main__":
    main()
