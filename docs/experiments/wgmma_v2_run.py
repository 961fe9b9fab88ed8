"""GPU half of wgmma_v2.py (no cutlass): each variant against float64, then timed against cuBLAS.

    python docs/experiments/wgmma_v2_run.py CUBIN_DIR [OUT.json]

Correctness: outputs poisoned (NaN) first, inputs with outliers, bound |ref| 2^-8 + (|x| @ |w|^T) 2^-16, at
every grid tried. Timing: cold L2 (the weight rotates over copies of at least 1 GiB), 20 launches per CUDA
graph, the graph replayed 5 times alternating with the same graph of torch.mm, median per launch; the ratio
is cuBLAS / ours. Each cubin runs at its full grid (one tile per cluster) and at persistent grids of 1-4 CTAs
per SM (the kernel reads its grid size and walks the tiles).
"""

import ctypes
import json
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as d

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wgmma_v1_run import cublas_graph, measure, ok, record, tokens, weight_copies, write  # noqa: E402

SHAPES = [(4096, 4096), (6144, 4096), (24576, 4096), (28672, 4096), (128256, 4096), (4096, 14336)]
SMS = 132


def kernel(cubin: Path, info: dict):
    lib = ok(d.cuLibraryLoadData(cubin.read_bytes(), None, None, 0, None, None, 0))
    fn = ok(d.cuKernelGetFunction(ok(d.cuLibraryGetKernel(lib, info["symbol"].encode()))))
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    ok(d.cuFuncSetAttribute(fn, attr, info["smem"]))
    return lib, fn


def launcher(fn, info, grid, x, w, out, n, k):
    args = [ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(w.data_ptr()), ctypes.c_uint64(out.data_ptr()),
            ctypes.c_uint64(0), ctypes.c_int32(n), ctypes.c_int32(k)]
    argv = (ctypes.c_void_p * 6)(*[ctypes.addressof(a) for a in args])
    cfg = d.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid, 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = info["threads"], 1, 1
    cfg.sharedMemBytes = info["smem"]
    attr = d.CUlaunchAttribute()
    attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = info["split"], 1, 1
    cfg.attrs = [attr]
    cfg.numAttrs = 1

    def launch():
        cfg.hStream = torch.cuda.current_stream().cuda_stream
        ok(d.cuLaunchKernelEx(cfg, fn, ctypes.addressof(argv), 0))

    launch.keep = (args, argv, cfg)
    return launch


def grids(info: dict, n: int) -> list[tuple[str, int]]:
    clusters = n // info["rows"]
    out = [("full", clusters * info["split"])]
    for per_sm in (1, 2, 3, 4):
        cap = SMS * per_sm // info["split"]
        if cap < clusters:
            out.append((f"p{per_sm}", cap * info["split"]))
    return out


def main() -> None:
    folder = Path(sys.argv[1])
    table = json.loads((folder / "variants.json").read_text())
    torch.zeros(1, device="cuda")  # the primary context, current for the driver calls
    gen = torch.Generator(device="cuda").manual_seed(0)
    results = []
    for n, k in SHAPES:
        ws = weight_copies(n, k, gen)
        for m in (8, 16):
            x, ref, bound = tokens(m, k, ws[0], gen)
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in ws]
            cublas = cublas_graph(x, ws, outs)
            for name, info in sorted(table.items()):
                if info["m"] != m or info["k"] != k or n % info["rows"]:
                    continue
                _, fn = kernel(folder / f"{name}.cubin", info)
                for label, grid in grids(info, n):
                    launches = [launcher(fn, info, grid, x, ws[i], outs[i], n, k) for i in range(len(ws))]
                    bad, us, cublas_us = measure(launches, cublas, outs[0], ref, bound)
                    record(results, {"variant": name, "grid": label, "ctas": grid, "n": n, "k": k, "m": m,
                                     "bad": bad, "us": us, "cublas_us": cublas_us})
        ws = outs = None
        torch.cuda.empty_cache()
    write(results)


if __name__ == "__main__":
    main()
