"""Time the same mma variants built from the kernel as it is and from a request-shape scratch build (GPU).

The scratch build (docs/experiments/request-shape-v12.patch applied to a copy of the checkout) has
each warp load cover 4 rows x 128 bytes instead of 8 rows x 64 bytes: the same bytes, the same
instructions, half the L2 requests, and wrong results (its MMAs pair the wrong values), so only
its time means anything. Build both variant sets from the copy and the checkout (the names of
docs/perf.md v12), then on the H200 with the sm_90a wheel installed:
  python request_shape.py NORMAL_DIR SHAPE_DIR OUT.json
"""

import json
import sys
from pathlib import Path

import torch

from skinny_gemm.aot import measure as ms
from skinny_gemm.runtime import loader

M = 4
dev = torch.device("cuda", 0)
libs = {"normal": loader.load_dir(Path(sys.argv[1]) / "sm_90a", dev), "shape": loader.load_dir(Path(sys.argv[2]) / "sm_90a", dev)}
names = sorted(libs["normal"].functions)
results = {}
for n, k in ((6416, 4096), (4096, 4096), (19360, 4096)):
    inputs = ms.make_inputs(n, k, [M], dev)
    x = inputs.tokens[M]
    chain = list(zip(inputs.weights, inputs.outs[M]))
    graphs = {"cublas": ms.capture([(lambda w=w, o=o: torch.mm(x, w.T, out=o)) for w, o in chain])}
    for label, lib in libs.items():
        for v in names:
            graphs[f"{label}/{v}"] = ms.capture([(lambda w=w, o=o, v=v, lib=lib: lib.launch(v, x, w, o, None, n, k)) for w, o in chain])
    times = ms.time_graphs(graphs, {g: len(chain) for g in graphs}, trials=7)
    results[f"{n}x{k}"] = {g: round(us, 3) for g, us in times.items()}
    print(n, k, json.dumps(results[f"{n}x{k}"], indent=0), flush=True)
    del graphs, inputs
    torch.cuda.empty_cache()
Path(sys.argv[3]).write_text(json.dumps(results, indent=1))
