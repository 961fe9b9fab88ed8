"""One-off A/B behind docs/perf.md "Next weight warmed from the kernel's tail" (not product code).

Needs the patch docs/experiments/warm-next-weight.patch applied to the commit it was recorded in (1dbc6c8,
commit 382933c) and, under .device/warm/, the builds `skinny-gemm build --arch sm_90a --plan P --out D` of the
main plan (base) and of it with every mma entry's `warm` set to 2, 4 and 8 (w2, w4, w8). Run on the H200 from
the repository root: `python docs/experiments/warm_ab.py 1 2 4 8 16` (results: docs/results/warm-ab-h200.*).
"""
import json, os, sys, time
sys.path.insert(0, os.getcwd())
from aot.source_tree import register
register()
import torch
from skinny_gemm.runtime import loader
from skinny_gemm.aot import measure as ms, served
from skinny_gemm.aot.measure import check_bf16_result

out_dir = os.environ.get("OUT", "/tmp")
dev = torch.device("cuda", 0)
libs = {name: loader.load_dir(f".device/warm/{name}/sm_90a", dev) for name in ("base", "w2", "w4", "w8")}
plans = {name: lib.plans() for name, lib in libs.items()}

# correctness of every warm variant once, next weight set: float64 reference, poisoned output
bad = 0; checked = 0
for name in ("w2", "w4", "w8"):
    lib = libs[name]
    for (n, k, m), v in sorted(plans[name].items()):
        if not v.config.warm:
            continue
        x, w, _ = ms.random_case(m, n, k, dev)
        nxt = torch.randn(8 << 20, device=dev).to(torch.bfloat16)
        y = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
        lib.launch(v.id, x, w, y, nxt, n, k)
        torch.cuda.synchronize()
        bad += check_bf16_result(y, x, w); checked += 1
print(f"warm variants checked: {checked}, bad elements: {bad}", flush=True)

model, built = served.build_served("kernels/models/glm-5.3-flash.json", [int(a) for a in sys.argv[1:]] or [1, 2, 4, 8, 16])
rows = []
for tp, m, ops in built:
    data = ms.step_data(ops, m, dev)
    gidx = [i for i, op in enumerate(ops) if op.is_gemm]
    nxt_w = {i: data.gemms[gidx[(j + 1) % len(gidx)]][1] for j, i in enumerate(gidx)}

    def provider(name, warm=True):
        lib, pl = libs[name], plans[name]
        def calls(with_ops=True):
            out = []
            for i, op in enumerate(ops):
                if op.is_gemm:
                    x, w, o = data.gemms[i]
                    v = pl.get((op.n, op.k, m))
                    if v is None:
                        out.append(lambda x=x, w=w, o=o: torch.mm(x, w.T, out=o))
                    else:
                        extra = nxt_w[i] if (v.config.warm and warm) else None
                        out.append(lambda v=v, x=x, w=w, o=o, e=extra, n=op.n, k=op.k: lib.launch(v.id, x, w, o, e, n, k))
                elif with_ops:
                    out.append(data.calls[i])
            return out
        return calls

    graphs = {"ops": ms.capture(ms.step_calls(data, None))}
    graphs["cublas"] = ms.capture(ms.step_calls(data, lambda x, w, o, n, k: torch.mm(x, w.T, out=o)))
    for name in ("base", "w2", "w4", "w8"):
        graphs[name] = ms.capture(provider(name)())
    graphs["w4_nonext"] = ms.capture(provider("w4", warm=False)())
    graphs["base_bare"] = ms.capture(provider("base")(with_ops=False))
    graphs["w4_bare"] = ms.capture(provider("w4")(with_ops=False))
    graphs["cublas_bare"] = ms.capture(ms.step_calls(data, lambda x, w, o, n, k: torch.mm(x, w.T, out=o), with_ops=False))
    t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=11)
    share = {g: t[g] - t["ops"] for g in graphs if g not in ("ops",) and not g.endswith("_bare")}
    row = {"tp": tp, "m": m, "us": t, "share_over_cublas": {g: share["cublas"] / share[g] for g in share}}
    rows.append(row)
    print(tp, m, {g: round(v, 1) for g, v in t.items()}, {g: round(v, 3) for g, v in row["share_over_cublas"].items()}, flush=True)
    del graphs, data
    torch.cuda.empty_cache()
json.dump({"gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M"), "rows": rows,
           "checked": checked, "bad": bad}, open(f"{out_dir}/warm_ab.json", "w"), indent=1)
