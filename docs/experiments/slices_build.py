"""v15: compile sliced mma variants (B columns = rows x K slices) next to each cell's plan (CPU).

python docs/experiments/slices_build.py OUT          the first sweep: 8 cells
python docs/experiments/slices_build.py OUT wide     4096x4096 M=1 (and 4096x2048, 2048x4096 M=1) over a wider
                                                     grid: 32-512 threads, 1-4 tiles, 1-16 stages, fetch 0/128/256
"""

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "aot"))
import source_tree  # noqa: E402

source_tree.register(run_init=False)
from skinny_gemm.aot import plans  # noqa: E402
from skinny_gemm.aot.build import build_configs  # noqa: E402
from skinny_gemm.runtime.config import ConfigError, KernelConfig  # noqa: E402

CELLS = [(6416, 4096, 1), (6416, 4096, 2), (6416, 4096, 4), (4096, 4096, 1), (4096, 4096, 4), (3336, 4096, 1),
         (3336, 4096, 4), (4096, 2048, 4)]


WIDE = len(sys.argv) > 2 and sys.argv[2] == "wide"
if WIDE:
    CELLS = [(4096, 4096, 1), (4096, 2048, 1), (2048, 4096, 1)]


def candidates(n, k, m):
    found = []
    for slices in (2, 4, 8):
        rows = 8 // slices
        for cols in (rows, 2 * rows, 4 * rows) if WIDE else (rows, 2 * rows):
            for kt in (32, 64, 128, 256, 512) if WIDE else (64, 128, 256, 512):
                for stages in (1, 2, 4, 8, 16) if WIDE else (1, 2, 4, 8):
                    for fetch in (256, 128, 0) if WIDE else (256, 128):
                        cfg = KernelConfig(m=m, kind="mma", threads=kt, k_threads=kt, cols=cols, unroll=1,
                                           stages=stages, prefetch=False, fetch=fetch, slices=slices)
                        try:
                            cfg.check(n=n, k=k)
                        except ConfigError:
                            continue
                        if k // cfg.k_step <= 4:
                            found.append(cfg)
    return found


out = Path(sys.argv[1])
out.mkdir(parents=True, exist_ok=True)
_, entries = plans.load(plans.plan_path("sm_90a"))
planned = {(e.n, e.k, e.m): e.config for e in entries}
rows, configs = [], {}
for n, k, m in CELLS:
    cands = candidates(n, k, m) + [planned[(n, k, m)]]
    rows.append({"n": n, "k": k, "m": m, "candidates": [c.to_json() for c in cands]})
    configs.update({c.name: c for c in cands})
(out / "cells.json").write_text(json.dumps({"arch": "sm_90a", "cells": rows}, indent=1, sort_keys=True))
build_configs("sm_90a", configs.values(), [], out / "sm_90a", out / "cells.json", jobs=2, progress=False)
print(f"{sum(len(r['candidates']) for r in rows)} timings, {len(configs)} variants -> {out}")
