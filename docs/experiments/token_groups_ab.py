"""One-off A/B behind docs/perf.md "Token groups at M=16" (not product code): GLM served step at M=16 and its cells alone.

Needs docs/experiments/token-groups.patch (recorded against d1a6244, in commit 6e085df) and, under .device/g/, the
builds of the main plan (base) and of it with the M=16 entries of docs/experiments/m16-token-groups-plan.json (G).
Results: docs/results/token-groups-m16-*.
"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
from aot.source_tree import register
register()
import torch
from skinny_gemm.runtime import loader
from skinny_gemm.aot import bench, measure as ms

out_dir = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda", 0)
NAMES = ["base", "G"]
libs = {name: loader.load_dir(f".device/g/{name}/sm_90a", dev) for name in NAMES}
plans = {name: lib.plans() for name, lib in libs.items()}
result = {"gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
          "served": [], "alone": []}

def run_gemm(name, m, nxt_w, guard=True):
    lib, pl = libs[name], plans[name]
    def gemm(i, x, w, o, n, k):
        v = pl.get((n, k, m))
        if v is None:
            return lambda: torch.mm(x, w.T, out=o)
        e = None
        if getattr(v.config, 'warm', 0) and nxt_w is not None:
            nw = nxt_w[i]
            if not guard or nw.numel() * 2 >= v.config.warm << 20:
                e = nw
        return lambda: lib.launch(v.id, x, w, o, e, n, k)
    return gemm

def calls(data, ops, gemm, with_ops=True):
    out = []
    for i, op in enumerate(ops):
        if op.is_gemm:
            x, w, o = data.gemms[i]
            out.append(gemm(i, x, w, o, op.n, op.k))
        elif with_ops:
            out.append(data.calls[i])
    return out

cub = lambda i, x, w, o, n, k: (lambda: torch.mm(x, w.T, out=o))
model, built = bench.build_served("kernels/models/glm-5.3-flash.json", [16])
for tp, m, ops in built:
    names = ["base", "G"]
    data = ms.step_data(ops, m, dev)
    gidx = [i for i, op in enumerate(ops) if op.is_gemm]
    nxt_w = {i: data.gemms[gidx[(j + 1) % len(gidx)]][1] for j, i in enumerate(gidx)}
    graphs = {"ops": ms.capture([data.calls[i] for i, op in enumerate(ops) if not op.is_gemm])}
    graphs["cublas"] = ms.capture(calls(data, ops, cub))
    graphs["cublas_bare"] = ms.capture(calls(data, ops, cub, with_ops=False))
    for name in names:
        graphs[name] = ms.capture(calls(data, ops, run_gemm(name, m, nxt_w)))
        graphs[name + "_bare"] = ms.capture(calls(data, ops, run_gemm(name, m, nxt_w), with_ops=False))
    t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=15)
    share = {g: t[g] - t["ops"] for g in graphs if g != "ops" and not g.endswith("_bare")}
    row = {"tp": tp, "m": m, "us": t, "share_over_cublas": {g: share["cublas"] / share[g] for g in share},
           "bare_over_cublas": {g: t["cublas_bare"] / t[g + "_bare"] for g in names}}
    result["served"].append(row)
    print("served", tp, m, {g: round(v, 3) for g, v in row["share_over_cublas"].items()},
          "bare", {g: round(v, 3) for g, v in row["bare_over_cublas"].items()}, flush=True)
    del graphs, data
    torch.cuda.empty_cache()

# cells alone (cold L2: a chain over >= 1 GiB of weight copies), M = 8 and 16, base / pdlon / iso vs cuBLAS
for (n, k) in sorted({(n, k) for (n, k, m) in plans["G"] if m == 16 and plans["G"][(n, k, m)].config.token_groups > 1}):
    inp = ms.make_inputs(n, k, [16], dev)
    for m in (16,):
        if (n, k, m) not in plans["base"]:
            continue
        x = inp.tokens[m]
        graphs = {"cublas": ms.capture([(lambda w=w, o=o: torch.mm(x, w.T, out=o)) for w, o in zip(inp.weights, inp.outs[m])])}
        for name in ("base", "G"):
            v = plans[name][(n, k, m)]
            graphs[name] = ms.capture([(lambda w=w, o=o, v=v, lib=libs[name]: lib.launch(v.id, x, w, o, None, n, k))
                                       for w, o in zip(inp.weights, inp.outs[m])])
        t = ms.time_graphs(graphs, {g: len(inp.weights) for g in graphs}, trials=7)
        result["alone"].append({"n": n, "k": k, "m": m, "us": t})
        print("alone", n, k, m, {g: round(t["cublas"] / t[g], 3) for g in t}, flush=True)
    del inp, graphs
    torch.cuda.empty_cache()
json.dump(result, open(f"{out_dir}/ab_g.json", "w"), indent=1)
