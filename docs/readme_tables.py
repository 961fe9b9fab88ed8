"""Print the README's headline tables from `skinny-gemm bench` JSON files (the numbers in README.md come from here).

Usage: python docs/readme_tables.py BENCH.json [BENCH.json ...]
  an `entries` bench (docs/results/bench-h200.json): the per-cell table, GLM seed shapes, every M present;
  a `decode` bench (docs/results/served-h200.json, served-<model>-h200.json): the served-step table.
"""

import json
import math
import sys
from pathlib import Path

# The GLM-5.3-Flash seed set's shapes (kernels/models/glm-5.3-flash.json, sm_90a): the headline cells.
GLM_SHAPES = {
    (160, 4096),
    (1024, 128),
    (2048, 128),
    (2048, 1536),
    (4096, 1024),
    (4096, 1536),
    (4096, 2048),
    (2048, 4096),
    (3336, 4096),
    (4096, 4096),
    (6416, 4096),
    (19360, 4096),
    (38720, 4096),
}


def geomean(values):
    """Geometric mean of positive numbers."""
    return math.exp(sum(map(math.log, values)) / len(values))


def entries_table(rows):
    """Per GLM shape: speedup over cuBLAS at every M, and % of 4.8 TB/s at M=1 and the largest M."""
    rows = [r for r in rows if (r["n"], r["k"]) in GLM_SHAPES]
    ms = sorted({r["m"] for r in rows})
    shapes = sorted({(r["n"], r["k"]) for r in rows}, key=lambda s: s[0] * s[1])
    print("| weight (N, K) | MB | " + " | ".join(f"M={m}" for m in ms) + f" | % of 4.8 TB/s at M=1 / M={ms[-1]} |")
    print("|---|---:|" + "---:|" * len(ms) + "---:|")
    for n, k in shapes:
        cell = {r["m"]: r for r in rows if (r["n"], r["k"]) == (n, k)}
        speeds = " | ".join(f"{cell[m]['speedup']:.2f}x" if m in cell else "-" for m in ms)
        bw = " / ".join(f"{cell[m]['plan_bw_pct']:.0f}%" if m in cell else "-" for m in (1, ms[-1]))
        print(f"| ({n}, {k}) | {n * k * 2 / 1e6:.1f} | {speeds} | {bw} |")
    per_m = [geomean([r["speedup"] for r in rows if r["m"] == m]) for m in ms]
    print("| **geomean** | | " + " | ".join(f"**{x:.2f}x**" for x in per_m) + " | |")
    low = min(rows, key=lambda r: r["speedup"])
    print(f"\n{len(rows)} cells; lowest {low['speedup']:.2f}x ({low['n']}x{low['k']} M={low['m']})\n")


def served_table(rows):
    """Per TP and M: the projections' share of the served step (step - ops alone) over cuBLAS's, ours and the peer's."""
    peer = any("peer" in r["speedup"]["share"] for r in rows if "speedup" in r)
    head = "| TP | M | cuBLAS share | ours share | speedup |" + (" peer (PDL off / on) |" if peer else "")
    print(head + " whole step | bare chain |")
    print("|---:|---:|---:|---:|---:|" + ("---:|" if peer else "") + "---:|---:|")
    for r in rows:
        if "speedup" not in r or "ours" not in r.get("share_us", {}):
            print(f"| {r['tp']} | {r['m']} | no plan | | |" + (" |" if peer else "") + " | |")
            continue
        sp, share = r["speedup"], r["share_us"]
        peer_cell = (
            f" {sp['share']['peer']:.2f}x / {sp['share']['peer_pdl']:.2f}x |"
            if peer and "peer" in sp["share"]
            else (" |" if peer else "")
        )
        print(
            f"| {r['tp']} | {r['m']} | {share['cublas']:.0f} us | {share['ours']:.0f} us | "
            f"**{sp['share']['ours']:.2f}x** |{peer_cell} {sp['step']['ours']:.2f}x | {sp['bare']['ours']:.2f}x |"
        )
    print()


def main(paths):
    """Print each file's table, and the startup record where there is one."""
    for path in paths:
        data = json.loads(Path(path).read_text())
        print(f"<!-- {path}: {data.get('gpu')}, {data.get('date')} -->")
        if "entries" in data:
            entries_table(data["entries"])
        if "served" in data:
            served_table(data["served"])
        if "startup" in data:
            print(f"startup: {data['startup']}\n")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python docs/readme_tables.py BENCH.json [BENCH.json ...]")
    main(sys.argv[1:])
