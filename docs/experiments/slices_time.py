"""v15 on the H200: check (float64, residual, 1e3 scale) and time sliced mma variants against each cell's
plan and cuBLAS, then swap the best into whole decode steps.

python slices_time.py CAND_DIR SHAPES OUT.json  (the sm_90a wheel installed)
"""

import json
import sys
from pathlib import Path

import torch

import skinny_gemm
from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import plans
from skinny_gemm.runtime import loader
from skinny_gemm.runtime.config import KernelConfig

dev = torch.device("cuda", 0)
cand = Path(sys.argv[1])
lib = loader.load_dir(cand / "sm_90a", dev)
cells = json.loads((cand / "cells.json").read_text())["cells"]
results = {"cells": {}, "steps": {}}
best = {}
for cell in cells:
    n, k, m = cell["n"], cell["k"], cell["m"]
    names = [KernelConfig.from_json(c).name for c in cell["candidates"]]
    bad = {}
    for v in names:
        b = 0
        for scale, res, seed in ((1.0, False, 1), (1e3, True, 2), (1.0, True, 3)):
            gen = torch.Generator(device=dev).manual_seed(seed * 7919 + n + m)
            x, w, r = ms.random_case(m, n, k, dev, scale=scale, residual=res, generator=gen)
            y = torch.full((m, n), float("nan"), device=dev, dtype=torch.bfloat16)
            lib.launch(v, x, w, y, r, n, k)
            torch.cuda.synchronize()
            b += ms.check_bf16_result(y, x, w, r)
        bad[v] = b
    inputs = ms.make_inputs(n, k, [m], dev)
    x = inputs.tokens[m]
    chain = list(zip(inputs.weights, inputs.outs[m]))
    graphs = {"cublas": ms.capture([(lambda w=w, o=o: torch.mm(x, w.T, out=o)) for w, o in chain])}
    for v in names:
        graphs[v] = ms.capture([(lambda w=w, o=o, v=v: lib.launch(v, x, w, o, None, n, k)) for w, o in chain])
    t = ms.time_graphs(graphs, {g: len(chain) for g in graphs}, trials=7)
    planned = names[-1]
    ranked = sorted((us, g) for g, us in t.items() if g not in ("cublas", planned) and bad[g] == 0)
    results["cells"][f"{n}x{k}x{m}"] = {"cublas": t["cublas"], "planned": [planned, t[planned], bad[planned]],
                                        "slices": {g: [round(t[g], 3), bad[g]] for g in names[:-1]}}
    top = ", ".join(f"{g} {us:.2f}" for us, g in ranked[:4])
    print(f"{n}x{k} m={m}: cublas {t['cublas']:.2f} planned {t[planned]:.2f}; bad total {sum(bad.values())}; {top}",
          flush=True)
    if ranked:
        best[(n, k, m)] = ranked[0][1]
    del graphs, inputs
    torch.cuda.empty_cache()

shapes = json.loads(Path(sys.argv[2]).read_text())
STEPS = [(4, 1, [(6416, 4096)]), (4, 1, [(6416, 4096), (4096, 4096)]), (8, 1, [(3336, 4096)]),
         (4, 2, [(6416, 4096)]), (4, 4, [(6416, 4096)]), (4, 4, [(6416, 4096), (4096, 4096), (4096, 2048)]),
         (8, 4, [(3336, 4096)])]
for tp, m, swaps in STEPS:
    swaps = [s for s in swaps if (s[0], s[1], m) in best]
    if not swaps:
        continue
    order = plans.decode_order(shapes, tp)
    ws_ = [(torch.randn(n, k, device=dev) * 0.05).to(torch.bfloat16) for _, n, k in order]
    xs = [torch.randn(m, k, device=dev).to(torch.bfloat16) for _, _, k in order]
    outs = [torch.empty(m, n, device=dev, dtype=torch.bfloat16) for _, n, _ in order]

    def step(swap):
        def run():
            for (_, n, k), x, w, o in zip(order, xs, ws_, outs):
                if (n, k) in swap:
                    lib.launch(best[(n, k, m)], x, w, o, None, n, k)
                else:
                    skinny_gemm.linear(x, w)
        return run

    graphs = {"plan": ms.capture([step(set())]), "swap": ms.capture([step(set(swaps))]),
              "cublas": ms.capture([lambda: [torch.nn.functional.linear(x, w) for x, w in zip(xs, ws_)]])}
    t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=9)
    key = f"tp{tp}_m{m}_" + "+".join(f"{n}x{k}" for n, k in swaps)
    results["steps"][key] = {**t, "variants": [best[(n, k, m)] for n, k in swaps]}
    print(key, {g: round(v, 1) for g, v in t.items()}, results["steps"][key]["variants"], flush=True)
    del graphs, ws_, xs, outs
    torch.cuda.empty_cache()
Path(sys.argv[3]).write_text(json.dumps(results, indent=1))
