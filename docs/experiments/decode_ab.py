"""Time whole decode steps (bench construction, one CUDA graph each) for two plans' picks at one M (GPU).

Usage, on the H200 with the sm_90a wheel installed (docs/perf.md v9):
  python decode_ab.py CAND_DIR OLD_PLAN NEW_PLAN SHAPES OUT.json [--m 4]
      old plan, new plan, and for every cell where they differ the old plan with that
      cell's new pick and the new plan with that cell's old pick (plus cuBLAS)
  python decode_ab.py CAND_DIR OLD_PLAN NEW_PLAN SHAPES OUT.json --carveout
      both plans with the driver's shared-memory carveout (-1) and with every kernel's
      preferred carveout fixed at 0, 25, 50 and 100 %: one loaded copy of the kernels each
CAND_DIR is a `tune prepare` directory (or the installed artifacts' parent) holding every
variant both plans name for that M.
"""

import argparse
import json
from pathlib import Path

import torch
from cuda.bindings import driver

from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import plans
from skinny_gemm.runtime import loader
from skinny_gemm.runtime.config import KernelConfig

CARVEOUTS = (-1, 0, 25, 50, 100)

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("cand", type=Path)
ap.add_argument("old", type=Path)
ap.add_argument("new", type=Path)
ap.add_argument("shapes", type=Path)
ap.add_argument("out", type=Path)
ap.add_argument("--m", type=int, default=4)
ap.add_argument("--carveout", action="store_true")
args = ap.parse_args()
dev = torch.device("cuda", 0)
shapes = json.loads(args.shapes.read_text())


def picks(path):
    """(n, k) -> variant name of a plan table's entries at M."""
    entries = json.loads(path.read_text())["entries"]
    return {(e["n"], e["k"]): KernelConfig.from_json(e["config"]).name for e in entries if e["m"] == args.m}


def load(carveout):
    """One loaded copy of the candidate kernels, each preferring ``carveout`` % shared memory (-1: driver's choice)."""
    table = loader.load_dir(args.cand / "sm_90a", dev)
    if carveout != -1:
        attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
        for fn in table.functions.values():
            (err,) = driver.cuFuncSetAttribute(fn, attr, carveout)
            assert err == driver.CUresult.CUDA_SUCCESS, err
    return table


old, new = picks(args.old), picks(args.new)
libs = {c: load(c) for c in (CARVEOUTS if args.carveout else (-1,))}
results = {}
for tp in (4, 8):
    order = plans.decode_order(shapes, tp)
    bufs = [
        (torch.randn(args.m, k, device=dev).to(torch.bfloat16), (torch.randn(n, k, device=dev) * 0.05).to(torch.bfloat16),
         torch.empty(args.m, n, device=dev, dtype=torch.bfloat16), n, k)
        for _, n, k in order
    ]
    variants = {"old": old, "new": new}
    if not args.carveout:
        for key in sorted({(n, k) for _, n, k in order}):
            if old[key] != new[key]:
                variants[f"old+new{key}"] = {**old, key: new[key]}
                variants[f"new+old{key}"] = {**new, key: old[key]}
    graphs = {}
    for carve, lib in libs.items():
        for name, pick in variants.items():
            label = f"{name}/carveout{carve}" if args.carveout else name
            graphs[label] = ms.capture([
                (lambda x=x, w=w, o=o, n=n, k=k, v=pick[(n, k)], lib=lib: lib.launch(v, x, w, o, None, n, k))
                for x, w, o, n, k in bufs
            ])
    graphs["cublas"] = ms.capture([(lambda x=x, w=w, o=o: torch.mm(x, w.T, out=o)) for x, w, o, _, _ in bufs])
    times = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=9)
    results[f"tp{tp}_m{args.m}"] = {g: round(us, 1) for g, us in times.items()}
    print(tp, json.dumps(results[f"tp{tp}_m{args.m}"], indent=1), flush=True)
    del graphs, bufs
    torch.cuda.empty_cache()
args.out.write_text(json.dumps(results, indent=1))
