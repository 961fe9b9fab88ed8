"""Compile a first sweep of a new kernel option over 8 cells, next to each cell's planned config (CPU).

Usage, from the checkout: python docs/experiments/sweep_cells.py bulk|split|persist OUT_DIR
  bulk:    the bulk-copy kernel (v5), every ring of at least 12 KB (or all of K)
  split:   the cluster-split mma kernel (v6), splits 2/4/8, K splits 64-512 threads
  persist: the persistent SIMT kernel (v7), M=1 cells
Then on the H200: skinny-gemm tune measure OUT_DIR --results R.json --decode-top 0 --trials 7
(every candidate is checked against the float64 reference before it is timed).
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "aot"))
import source_tree  # noqa: E402

source_tree.register()
from skinny_gemm.aot import plans  # noqa: E402
from skinny_gemm.aot.build import build_configs  # noqa: E402
from skinny_gemm.aot.tune import persist_candidates, split_candidates  # noqa: E402
from skinny_gemm.runtime.config import ConfigError, KernelConfig  # noqa: E402


def bulk_candidates(n, k, m):
    """Every bulk config with a ring of at least 12 KB (or all of K) for this cell."""
    found = []
    for cols in (8, 16):
        for kt in (64, 128, 256, 512):
            for unroll in (1, 2, 4):
                for stages in (2, 4, 8):
                    cfg = KernelConfig(m=m, kind="bulk", threads=kt, k_threads=kt, cols=cols, unroll=unroll,
                                       stages=stages, prefetch=False)
                    try:
                        cfg.check(n=n, k=k)
                    except ConfigError:
                        continue
                    if cfg.bulk_smem >= 12 * 1024 or k // cfg.k_step <= stages:
                        found.append(cfg)
    return found


SWEEPS = {
    "bulk": (
        [(6416, 4096, 1), (6416, 4096, 4), (4096, 4096, 4), (4096, 2048, 4), (4096, 1536, 4), (38720, 4096, 4),
         (2048, 128, 4), (3336, 4096, 4)],
        bulk_candidates,
    ),
    "split": (
        [(6416, 4096, 1), (6416, 4096, 4), (4096, 4096, 1), (4096, 4096, 4), (3336, 4096, 1), (3336, 4096, 4),
         (4096, 2048, 4), (38720, 4096, 4)],
        lambda n, k, m: split_candidates(n, k, m, splits=(2, 4, 8), k_threads_set=(64, 128, 256, 512)),
    ),
    "persist": (
        [(6416, 4096, 1), (4096, 4096, 1), (3336, 4096, 1), (38720, 4096, 1), (19360, 4096, 1), (4096, 2048, 1),
         (2048, 4096, 1), (4096, 1536, 1)],
        persist_candidates,
    ),
}

def write_sweep(out: Path, cells, generate) -> None:
    """Compile each cell's generated configs next to its planned one into ``out`` (cells.json + sm_90a/), as `tune prepare` lays out."""
    out.mkdir(parents=True, exist_ok=True)
    _, entries = plans.load(plans.plan_path("sm_90a"))
    planned = {(e.n, e.k, e.m): e.config for e in entries}
    rows, configs = [], {}
    for n, k, m in cells:
        cands = generate(n, k, m) + [planned[(n, k, m)]]
        rows.append({"n": n, "k": k, "m": m, "candidates": [c.to_json() for c in cands]})
        configs.update({c.name: c for c in cands})
    (out / "cells.json").write_text(json.dumps({"arch": "sm_90a", "cells": rows}, indent=1, sort_keys=True))
    build_configs("sm_90a", configs.values(), [], out / "sm_90a", out / "cells.json", jobs=2, progress=False)
    print(f"{sum(len(r['candidates']) for r in rows)} timings, {len(configs)} variants -> {out}")


if __name__ == "__main__":
    write_sweep(Path(sys.argv[2]), *SWEEPS[sys.argv[1]])
