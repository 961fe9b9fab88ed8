"""Whole decode steps built the bench's way and the tuner's way, timed in one process (H200, installed wheel).

python construct_ab.py SHAPES OUT.json
"""
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

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
for tp, m in ((4, 4), (8, 1), (4, 1), (8, 4)):
    order = plans.decode_order(shapes, tp)
    data = {
        "randn": [(torch.randn(m, k, device=dev).to(bf16), (torch.randn(n, k, device=dev) * 0.05).to(bf16)) for _, n, k in order],
        "outliers": [(ms.random_tensor((m, k), dev), ms.random_tensor((n, k), dev, 0.05)) for _, n, k in order],
    }
    outs = [torch.empty(m, n, device=dev, dtype=bf16) for _, n, _ in order]

    def linear_step(d):
        return lambda: [skinny_gemm.linear(x, w) for x, w in d]

    def launch_step(d):
        def run():
            s = torch.cuda.current_stream().cuda_stream
            for (x, w), o, (_, n, k) in zip(d, outs, order):
                loader.launch(table[(n, k, m)], x.data_ptr(), w.data_ptr(), o.data_ptr(), 0, s)
        return run

    graphs = {}
    for dname, d in data.items():
        graphs[f"linear/{dname}"] = ms.capture([linear_step(d)])
        graphs[f"launch/{dname}"] = ms.capture([launch_step(d)])
    graphs["cublas/randn"] = ms.capture([lambda: [F.linear(x, w) for x, w in data["randn"]]])
    with_cublas = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=9)
    alone = ms.time_graphs({g: v for g, v in graphs.items() if not g.startswith("cublas")}, {g: 1 for g in graphs}, trials=9)
    pair = {}
    for g in ("linear/randn", "launch/outliers"):
        pair[g] = ms.time_graphs({g: graphs[g], "cublas/randn": graphs["cublas/randn"]}, {g: 1, "cublas/randn": 1}, trials=9)[g]
    res[f"tp{tp}_m{m}"] = {"with_cublas": with_cublas, "plans_only": alone, "each_with_cublas_only": pair}
    print(f"tp{tp} m{m}", json.dumps({k: {g: round(u, 1) for g, u in v.items()} for k, v in res[f"tp{tp}_m{m}"].items()}), flush=True)
    del graphs, data, outs
    torch.cuda.empty_cache()
Path(sys.argv[2]).write_text(json.dumps(res, indent=1))
