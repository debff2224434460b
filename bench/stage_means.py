#!/usr/bin/env python3
"""Mean server-side time per Score stage, from a probe-sidecar's /metrics (sum / count of each
probesidecar_score_stage_duration_seconds series). With --since FILE, only what was observed after
FILE was saved (a previous --save) counts.

    python3 bench/stage_means.py 127.0.0.1:9464 --save before.txt
    ... traffic ...
    python3 bench/stage_means.py 127.0.0.1:9464 --since before.txt
"""

from __future__ import annotations

import argparse
import re
import urllib.request

PATTERN = re.compile(r"probesidecar_score_stage_duration_seconds_(sum|count)\{(.*)\} (\S+)")


def read(text: str) -> dict[tuple[str, str], float]:
    values = {}
    for line in text.splitlines():
        m = PATTERN.match(line)
        if m:
            values[(m.group(1), m.group(2))] = float(m.group(3))
    return values


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("address")
    parser.add_argument("--save")
    parser.add_argument("--since")
    parser.add_argument("--title", default="server-side stage means")
    args = parser.parse_args()
    text = urllib.request.urlopen(f"http://{args.address}/metrics", timeout=10).read().decode()
    if args.save:
        open(args.save, "w").write(text)
        return 0
    now = read(text)
    before = read(open(args.since).read()) if args.since else {}
    print(f"== {args.title} (µs)")
    for (kind, labels), count in sorted(now.items()):
        if kind != "count":
            continue
        n = count - before.get(("count", labels), 0.0)
        if n > 0:
            total = now[("sum", labels)] - before.get(("sum", labels), 0.0)
            print(f"{labels}: {1e6 * total / n:.1f} µs over {n:.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
