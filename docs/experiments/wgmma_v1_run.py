"""GPU half of wgmma_v1.py (no cutlass): each variant against float64, then timed against cuBLAS.

    python docs/experiments/wgmma_v1_run.py CUBIN_DIR [OUT.json]

Correctness: outputs poisoned (NaN) first, inputs with outliers, bound |ref| 2^-8 + (|x| @ |w|^T) 2^-16.
Timing: cold L2 (the weight rotates over copies of at least 1 GiB), 20 launches per CUDA graph, the graph
replayed 5 times alternating with the same graph of torch.mm, median per launch; the ratio is cuBLAS / ours.
"""

import ctypes
import json
import statistics
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as d

SHAPES = [(4096, 4096), (6144, 4096), (19360, 4096), (28672, 4096), (38720, 4096), (128256, 4096)]
PER_GRAPH = 20


def ok(result):
    err, *rest = result if isinstance(result, tuple) else (result,)
    assert int(err) == 0, err
    return rest[0] if len(rest) == 1 else rest


def kernel(cubin: Path, info: dict):
    lib = ok(d.cuLibraryLoadData(cubin.read_bytes(), None, None, 0, None, None, 0))
    fn = ok(d.cuKernelGetFunction(ok(d.cuLibraryGetKernel(lib, info["symbol"].encode()))))
    attr = d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    ok(d.cuFuncSetAttribute(fn, attr, info["smem"]))
    return lib, fn


def launcher(fn, info, x, w, out, n, k):
    args = [ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(w.data_ptr()), ctypes.c_uint64(out.data_ptr()),
            ctypes.c_uint64(0), ctypes.c_int32(n), ctypes.c_int32(k)]
    argv = (ctypes.c_void_p * 6)(*[ctypes.addressof(a) for a in args])

    def launch():
        stream = torch.cuda.current_stream().cuda_stream
        ok(d.cuLaunchKernel(fn, n // info["rows"], 1, 1, info["threads"], 1, 1, info["smem"], stream,
                            ctypes.addressof(argv), 0))

    launch.keep = (args, argv)
    return launch


def make_graph(fns) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(PER_GRAPH):
            fns[i % len(fns)]()
    return graph


def replay_us(graph) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    graph.replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / PER_GRAPH


def weight_copies(n: int, k: int, gen) -> list[torch.Tensor]:
    """Copies of random (n, k) bf16 weights, over 1 GiB in all (a launch finds none in L2), outliers in copy 0 (the
    one checked)."""
    copies = max(1, (1 << 30) // (n * k * 2) + 1)
    ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16() for _ in range(min(copies, 8))]
    while len(ws) < copies:
        ws.append(ws[len(ws) % 8].clone())
    ws[0][::97, ::31] *= 50  # outliers
    return ws


def tokens(m: int, k: int, w: torch.Tensor, gen):
    """Random (m, k) bf16 tokens with outliers, their float64 product with ``w`` and the bound an output must meet."""
    x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    x[:, ::53] *= 20
    ref = x.double() @ w.double().T
    bound = ref.abs() * 2**-8 + (x.double().abs() @ w.double().abs().T) * 2**-16
    return x, ref, bound


def cublas_graph(x: torch.Tensor, ws: list, outs: list) -> torch.cuda.CUDAGraph:
    return make_graph([lambda x=x, w=w, o=o: torch.mm(x, w.T, out=o) for w, o in zip(ws, outs)])


def measure(launches: list, cublas, out: torch.Tensor, ref, bound) -> tuple[int, float, float]:
    """(outputs outside the bound or NaN after the first launch into the poisoned ``out``, median us per launch of
    ours, of cuBLAS): five replays of each graph, alternating."""
    out.fill_(float("nan"))
    launches[0]()
    torch.cuda.synchronize()
    bad = int((((out.double() - ref).abs() > bound) | out.isnan()).sum())
    ours = make_graph(launches)
    t_ours, t_cublas = [], []
    for _ in range(5):
        t_ours.append(replay_us(ours))
        t_cublas.append(replay_us(cublas))
    return bad, statistics.median(t_ours), statistics.median(t_cublas)


def record(results: list, row: dict) -> None:
    """Add the ratio and the weight's TB/s to ``row`` (variant, n, k, m, bad, us, cublas_us; grid and ctas where the
    grid varies), keep it and print its line."""
    n, k = row["n"], row["k"]
    row["speedup"] = row["cublas_us"] / row["us"]
    row["tb_s"] = n * k * 2 / row["us"] / 1e6
    results.append(row)
    grid = f" {row['grid']}({row['ctas']})" if "grid" in row else ""
    print(f"{n}x{k} M={row['m']} {row['variant']}{grid}: bad {row['bad']}, {row['us']:.1f} us vs cuBLAS "
          f"{row['cublas_us']:.1f} us -> {row['speedup']:.2f}x ({row['tb_s']:.2f} TB/s)", flush=True)


def write(results: list) -> None:
    if len(sys.argv) > 2:
        Path(sys.argv[2]).write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": results}, indent=1))


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
                if info["m"] != m or info["k"] != k:
                    continue
                _, fn = kernel(folder / f"{name}.cubin", info)
                launches = [launcher(fn, info, x, ws[i], outs[i], n, k) for i in range(len(ws))]
                bad, us, cublas_us = measure(launches, cublas, outs[0], ref, bound)
                record(results, {"variant": name, "n": n, "k": k, "m": m, "bad": bad, "us": us, "cublas_us": cublas_us})
        ws = outs = None
        torch.cuda.empty_cache()
    write(results)


if __name__ == "__main__":
    main()
