"""Is it output reuse? Whole decode steps with outputs distinct, shared, or from linear() with and without reuse (H200).

python outreuse.py SHAPES OUT.json  (the sm_90a wheel installed)
"""
import json
import sys
from pathlib import Path

import torch

import skinny_gemm
from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import plans
from skinny_gemm.runtime import loader

dev = torch.device("cuda", 0)
bf16 = torch.bfloat16
shapes = json.loads(Path(sys.argv[1]).read_text())
torch.zeros(1, device=dev)
loader.ensure_loaded()
table = loader.DEVICES[0].bind()
res = {}
for tp, m in ((4, 4), (8, 4), (4, 2), (4, 1)):
    order = plans.decode_order(shapes, tp)
    data = [(torch.randn(m, k, device=dev).to(bf16), (torch.randn(n, k, device=dev) * 0.05).to(bf16)) for _, n, k in order]
    distinct = [torch.empty(m, n, device=dev, dtype=bf16) for _, n, _ in order]
    big = torch.empty(m * max(n for _, n, _ in order), device=dev, dtype=bf16)
    shared = [big[: m * n].view(m, n) for _, n, _ in order]
    kept = []

    def launch_step(outs):
        def run():
            s = torch.cuda.current_stream().cuda_stream
            for (x, w), o, (_, n, k) in zip(data, outs, order):
                loader.launch(table[(n, k, m)], x.data_ptr(), w.data_ptr(), o.data_ptr(), 0, s)
        return run

    def linear_step(keep):
        def run():
            for x, w in data:
                y = skinny_gemm.linear(x, w)
                if keep:
                    kept.append(y)
        return run

    graphs = {"launch/distinct": ms.capture([launch_step(distinct)]), "launch/shared": ms.capture([launch_step(shared)]),
              "linear/reused": ms.capture([linear_step(False)]), "linear/kept": ms.capture([linear_step(True)])}
    ptrs = sorted({y.data_ptr() for y in kept})
    t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=11)
    res[f"tp{tp}_m{m}"] = {**t, "kept_distinct_ptrs": len(ptrs)}
    print(f"tp{tp} m{m}", {g: round(u, 1) for g, u in t.items()}, "kept ptrs", len(ptrs), flush=True)
    del graphs, data, distinct, big, shared
    kept.clear()
    torch.cuda.empty_cache()
Path(sys.argv[2]).write_text(json.dumps(res, indent=1))
