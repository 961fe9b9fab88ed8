"""v15: compile sliced mma variants (B columns = rows x K slices) next to each cell's plan (CPU).

python docs/experiments/slices_build.py OUT          the first sweep: 8 cells
python docs/experiments/slices_build.py OUT wide     4096x4096 M=1 (and 4096x2048, 2048x4096 M=1) over a wider
                                                     grid: 32-512 threads, 1-4 tiles, 1-16 stages, fetch 0/128/256
"""

import sys
from pathlib import Path

from sweep_cells import write_sweep  # this directory; it also makes the checkout importable as skinny_gemm
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


write_sweep(Path(sys.argv[1]), CELLS, candidates)
