"""Does the bulk kernel's step-wide cost follow its ring size? One decode step at M=4, the plan against the plan with one cell on each bulk ring (GPU).

Build the plan's M=4 variants and the four bulk configs of docs/perf.md v12 into CAND_DIR, then on the H200 with the wheel installed:
  python bulk_ring_ab.py CAND_DIR SHAPES PLAN OUT.json
"""
import json
import sys
from pathlib import Path

import torch

from skinny_gemm.runtime import loader
from skinny_gemm.runtime.config import KernelConfig
from skinny_gemm.aot import measure as ms, plans
dev = torch.device("cuda", 0)
cand, shapes_f, plan_f, out = map(Path, sys.argv[1:5])
lib = loader.load_dir(cand / "sm_90a", dev)
shapes = json.loads(shapes_f.read_text())
plan = {(e["n"], e["k"]): KernelConfig.from_json(e["config"]).name for e in json.loads(plan_f.read_text())["entries"] if e["m"] == 4}
bulks = sorted(v for v in lib.functions if v.startswith("bulk"))
res = {}
for tp in (8, 4):
    order = plans.decode_order(shapes, tp)
    bufs = [((torch.randn(4, k, device=dev)).to(torch.bfloat16), (torch.randn(n, k, device=dev) * 0.05).to(torch.bfloat16),
             torch.empty(4, n, device=dev, dtype=torch.bfloat16), n, k) for _, n, k in order]
    cell = (3336, 4096) if tp == 8 else (6416, 4096)
    variants = {"plan": plan}
    if tp == 8:
        for b in bulks:
            variants[b] = {**plan, cell: b}
    else:
        for b in bulks:
            if int(b.split("_t")[1].split("_")[0]) <= 256:
                variants[b + "@6416"] = {**plan, cell: b}
    graphs = {lab: ms.capture([(lambda x=x, w=w, o=o, n=n, k=k, v=pk[(n, k)]: lib.launch(v, x, w, o, None, n, k)) for x, w, o, n, k in bufs])
              for lab, pk in variants.items()}
    t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=9)
    res[f"tp{tp}_m4"] = {g: round(u, 1) for g, u in t.items()}
    print(tp, json.dumps(res[f"tp{tp}_m4"], indent=0), flush=True)
    del graphs, bufs
    torch.cuda.empty_cache()
out.write_text(json.dumps(res, indent=1))
