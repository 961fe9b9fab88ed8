"""One checked launch of every bulk variant in a `sweep_cells.py bulk` directory (H200): float64 reference, poisoned output.

Usage: python docs/experiments/bulk_smoke.py DIR   (run it under `timeout`: a kernel that never completes its mbarrier would hang)
"""
import json
import sys


import torch
from skinny_gemm.aot import measure as ms
from skinny_gemm.runtime import loader
from skinny_gemm.runtime.config import KernelConfig
dev = torch.device("cuda")
lib = loader.load_dir(f"{sys.argv[1]}/sm_90a", dev)
spec = json.load(open(f"{sys.argv[1]}/cells.json"))
bad_total = 0
for row in spec["cells"]:
    n, k, m = row["n"], row["k"], row["m"]
    x, w, r = ms.random_case(m, n, k, dev, residual=True)
    for cj in row["candidates"]:
        cfg = KernelConfig.from_json(cj)
        if cfg.kind != "bulk":
            continue
        y = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
        lib.launch(cfg.name, x, w, y, r, n, k)
        torch.cuda.synchronize()
        bad = ms.check_bf16_result(y, x, w, r)
        bad_total += bad
        if bad:
            print("BAD", n, k, m, cfg.name, bad, flush=True)
    print("ok", n, k, m, flush=True)
print("smoke bad_total", bad_total)
