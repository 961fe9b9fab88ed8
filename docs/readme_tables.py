"""Print the README's headline tables from a `skinny-gemm bench` JSON (the numbers in README.md come from here).

Usage: python docs/readme_tables.py docs/results/bench-h200.json
"""

import json
import math
import sys
from pathlib import Path


def geomean(values):
    """Geometric mean of positive numbers."""
    return math.exp(sum(map(math.log, values)) / len(values))


def main(path):
    """Print the per-shape speedup table, the decode-step table and the startup record."""
    data = json.loads(Path(path).read_text())
    rows = data["entries"]
    shapes = sorted({(r["n"], r["k"]) for r in rows}, key=lambda s: s[0] * s[1])
    print("| weight (N, K) | MB | M=1 | M=2 | M=3 | M=4 | % of 4.8 TB/s at M=1 / M=4 |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n, k in shapes:
        cell = {r["m"]: r for r in rows if (r["n"], r["k"]) == (n, k)}
        print(f"| ({n}, {k}) | {n * k * 2 / 1e6:.1f} | " + " | ".join(f"{cell[m]['speedup']:.2f}x" for m in (1, 2, 3, 4))
              + f" | {cell[1]['plan_bw_pct']:.0f}% / {cell[4]['plan_bw_pct']:.0f}% |")
    per_m = [geomean([r["speedup"] for r in rows if r["m"] == m]) for m in (1, 2, 3, 4)]
    print("| **geomean** | | " + " | ".join(f"**{x:.2f}x**" for x in per_m)
          + f" | **all {len(rows)} cells: {geomean([r['speedup'] for r in rows]):.2f}x** |")
    print(f"\nlowest speedup {min(r['speedup'] for r in rows):.2f}x\n")
    print("| rank | M | cuBLAS | skinny-gemm | speedup | cuBLAS +ew | skinny-gemm +ew | speedup |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in data["decode"]:
        rank = f"TP={r['tp']} ({r['weight_gb']:.2f} GB)" if r["m"] == 1 else f"TP={r['tp']}"
        print(f"| {rank} | {r['m']} | {r['cublas_us']:.0f} us | {r['plan_us']:.0f} us | {r['cublas_us'] / r['plan_us']:.2f}x | "
              f"{r['cublas+ew_us']:.0f} us | {r['plan+ew_us']:.0f} us | {r['cublas+ew_us'] / r['plan+ew_us']:.2f}x |")
    print(f"\nstartup: {data['startup']}")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python docs/readme_tables.py docs/results/bench-h200.json")
    main(sys.argv[1])
