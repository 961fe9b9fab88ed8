"""Compile the bulk-copy kernel's first sweep (8 cells) next to each cell's planned config (CPU).

Usage, from the checkout: python docs/experiments/bulk_cells.py OUT_DIR
Then on the H200: python docs/experiments/bulk_smoke.py OUT_DIR (one checked launch of
every bulk variant) and skinny-gemm tune measure OUT_DIR --results R.json --decode-top 0 --trials 7.
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
from skinny_gemm.runtime.config import ConfigError, KernelConfig  # noqa: E402

CELLS = [(6416, 4096, 1), (6416, 4096, 4), (4096, 4096, 4), (4096, 2048, 4), (4096, 1536, 4), (38720, 4096, 4),
         (2048, 128, 4), (3336, 4096, 4)]


def bulk(n, k, m):
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


out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
_, entries = plans.load(plans.plan_path("sm_90a"))
planned = {(e.n, e.k, e.m): e.config for e in entries}
rows, configs = [], {}
for n, k, m in CELLS:
    cands = bulk(n, k, m) + [planned[(n, k, m)]]
    rows.append({"n": n, "k": k, "m": m, "candidates": [c.to_json() for c in cands]})
    configs.update({c.name: c for c in cands})
(out / "cells.json").write_text(json.dumps({"arch": "sm_90a", "cells": rows}, indent=1, sort_keys=True))
build_configs("sm_90a", configs.values(), [], out / "sm_90a", out / "cells.json", jobs=2, progress=False)
print(f"{len(configs)} variants -> {out}")
