"""Summarize per-CTA timelines from trace_time.py (CPU): steady rate, tail, start, PDL wait release per variant.

python docs/experiments/trace_summary.py docs/results/history/trace-v14-h200.json

Per launch (the middle five of each chain): the rate is 40% of the weight over the time between the 50% and
90% CTA ends; the tail is the 90% end to the last; the start is the first wait release to the 10% end; the
release is the previous launch's last CTA end to this launch's first wait release. Medians over launches.
The timer ticks in 256 ns steps on the H200. Rates of one-wave grids mean nothing (all CTAs end together).
"""

import json
import statistics
import sys


def summarize(n: int, k: int, launches: list) -> dict:
    """Median rate (TB/s), tail, start and release (us) over a chain's traced launches."""
    rates, tails, starts, releases, prev = [], [], [], [], None
    for rows in launches:
        ends = sorted(r[2] for r in rows)
        g = len(ends)
        w0 = min(r[1] for r in rows)
        t50, t90 = ends[int(0.5 * g)], ends[int(0.9 * g)]
        rates.append(0.4 * n * k * 2 / max(t90 - t50, 1) / 1e3)
        tails.append((ends[-1] - t90) / 1e3)
        starts.append((ends[int(0.1 * g)] - w0) / 1e3)
        if prev is not None:
            releases.append((w0 - prev) / 1e3)
        prev = ends[-1]
    return {"rate": statistics.median(rates), "tail": statistics.median(tails), "start": statistics.median(starts),
            "release": (min(releases), max(releases))}


data = json.loads(open(sys.argv[1]).read())
print("| cell / variant | us | CTAs | 50-90% rate | 90-100% tail | wait -> 10% ends | prev end -> wait |")
print("|---|---:|---:|---:|---:|---:|---:|")
for key, v in data.items():
    n, k, m = (int(x) for x in key.split("/")[0].split("x"))
    s = summarize(n, k, v["launches"])
    print(f"| {key} | {v['us']:.2f} | {len(v['launches'][0])} | {s['rate']:.2f} TB/s | {s['tail']:.2f} us | "
          f"{s['start']:.2f} us | {s['release'][0]:.2f}-{s['release'][1]:.2f} us |")
