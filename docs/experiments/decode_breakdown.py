"""Diagnostics for perf.md v4 (H200): what PDL saves per kernel, and each linear's cost inside the decode step.

Usage, on the GPU machine with the sm_90a wheel installed, from the checkout:
  python docs/experiments/decode_breakdown.py DIAG_DIR SHAPES PLAN OUT.json
DIAG_DIR from pdl_variants_build.py, SHAPES the model's shapes file, PLAN
kernels/plans/sm_90a.json (for the isolated plan_us). Leave-one-out: the step
graph is timed whole and without each linear; the difference over its calls
is that linear's cost inside the step.
"""
import json, sys
import torch
import skinny_gemm
from skinny_gemm.aot import measure as ms, plans
from skinny_gemm.runtime import loader

dev = torch.device("cuda")
out = {"pdl": [], "leave_one_out": []}
DIAG, SHAPES, PLAN, OUT = sys.argv[1:5]
lib = loader.load_dir(f"{DIAG}/sm_90a", dev)
for row in json.load(open(f"{DIAG}/cells.json")):
    n, k, m = row["n"], row["k"], row["m"]
    inp = ms.make_inputs(n, k, [m], dev)
    x = inp.tokens[m]
    graphs = {"cublas": ms.capture([(lambda w=w, o=o: torch.mm(x, w.T, out=o)) for w, o in zip(inp.weights, inp.outs[m])])}
    for v in row["variants"]:
        graphs[v] = ms.capture([(lambda w=w, o=o, v=v: lib.launch(v, x, w, o, None, n, k)) for w, o in zip(inp.weights, inp.outs[m])])
    t = ms.time_graphs(graphs, {g: len(inp.weights) for g in graphs}, trials=7)
    out["pdl"].append({"n": n, "k": k, "m": m, "us": t})
    print(n, k, m, {g: round(v, 2) for g, v in t.items()}, flush=True)
    del graphs, inp
    torch.cuda.empty_cache()

shapes = json.load(open(SHAPES))
iso = {(e["n"], e["k"], e["m"]): e["provenance"]["plan_us"] for e in json.load(open(PLAN))["entries"]}
for tp in (4, 8):
    order = plans.decode_order(shapes, tp)
    for m in (1, 4):
        ws = [(torch.randn(n, k, device=dev) * 0.05).to(torch.bfloat16) for _, n, k in order]
        xs = [torch.randn(m, k, device=dev).to(torch.bfloat16) for _, _, k in order]
        names = sorted({name for name, _, _ in order})
        def step(skip):
            def run():
                for (name, n, k), x, w in zip(order, xs, ws):
                    if name not in skip:
                        skinny_gemm.linear(x, w)
            return run
        graphs = {"all": ms.capture([step(())])}
        for name in names:
            graphs[name] = ms.capture([step((name,))])
        t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=7)
        for name in names:
            calls = [(n, k) for nm, n, k in order if nm == name]
            n, k = calls[0]
            rec = {"tp": tp, "m": m, "linear": name, "n": n, "k": k, "calls": len(calls),
                   "step_us": t["all"], "without_us": t[name], "per_call_in_step_us": (t["all"] - t[name]) / len(calls),
                   "isolated_plan_us": iso.get((n, k, m))}
            out["leave_one_out"].append(rec)
            print(tp, m, name, n, k, len(calls), round(rec["per_call_in_step_us"], 2), rec["isolated_plan_us"], flush=True)
        print(tp, m, "step", round(t["all"], 1), flush=True)
        del graphs, ws, xs
        torch.cuda.empty_cache()
json.dump(out, open(OUT, "w"), indent=1)
