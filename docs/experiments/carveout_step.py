"""The served step with our kernels' carveout as the runtime sets it (the least shared memory that keeps their
occupancy, the rest L1) against "no preference" (the driver's choice, which follows the kernels before).

    SKINNY_GEMM_ARTIFACTS=ROOT PYTHONPATH=SITE python docs/experiments/carveout_step.py MODEL M MODE OUT.json   (GPU)

MODE "runtime" leaves the carveouts the runtime set at bind; "default" sets every bound function back to -1
before capturing. Run the two modes in alternating processes: each process times cuBLAS and ours in the same
step (TP1, aot/measure.step_data), interleaved, median of 7 x 3 replays, and per kernel name the median CUPTI
duration (torch.profiler, 3 replays).
"""

import json
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as cu
from gpu_timing import kernels

import skinny_gemm
from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import served
from skinny_gemm.runtime import loader


def main():
    slug, m, mode, dest = sys.argv[1], int(sys.argv[2]), sys.argv[3], Path(sys.argv[4])
    root = Path(skinny_gemm.__file__).resolve().parent / "kernels" / "models" / f"{slug}.json"
    _, built = served.build_served(root, [m])
    _, m, ops = next(b for b in built if b[0] == 1)
    data = ms.step_data(ops, m, torch.device("cuda"))
    ours = ms.step_calls(data, lambda x, w, o, n, k: skinny_gemm.linear(x, w))
    for call in ours:  # binds every planned variant of the step
        call()
    torch.cuda.synchronize()
    carve = cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    bound = loader.DEVICES[0].table.bound
    if mode == "default":
        for rec in bound.values():
            assert int(cu.cuFuncSetAttribute(rec.function, carve, -1)[0]) == 0
    graphs = {
        "cublas": ms.capture(ms.step_calls(data, lambda x, w, o, n, k: torch.mm(x, w.T, out=o))),
        "ours": ms.capture(ours),
    }
    wall = {k: round(v, 1) for k, v in ms.time_graphs(graphs, dict.fromkeys(graphs, 1)).items()}
    result = {
        "gpu": torch.cuda.get_device_name(),
        "model": slug,
        "m": m,
        "mode": mode,
        "wall_us": wall,
        "share": round(wall["cublas"] / wall["ours"], 4),
        "variants": sorted({rec.variant.id for rec in bound.values()}),
        "kernels": {k: kernels(g) for k, g in graphs.items()},
    }
    dest.write_text(json.dumps(result, indent=1))
    print(json.dumps({k: result[k] for k in ("model", "m", "mode", "wall_us", "share")}), flush=True)


if __name__ == "__main__":
    main()
