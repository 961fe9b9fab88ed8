"""What in the served step slows our kernels that the isolated bench does not: the weights' footprint (TLB reach)
or the kernels before them?

    SKINNY_GEMM_ARTIFACTS=ROOT PYTHONPATH=SITE python docs/experiments/step_context.py OUT.json [MODEL M]   (GPU)

1. The served step (TP1, aot/measure.step_data) with cuBLAS and with skinny_gemm.linear, each with the step's
   distinct weights (16 GB for an 8B model) and "pooled": every GEMM of a shape reads one of two weights of that
   shape (a few hundred MB in all), the same kernels in the same order. Wall per replay (median of 7 x 3,
   interleaved) and per kernel name the median CUPTI duration (torch.profiler over 3 replays).
2. Llama-3.1-8B's down_proj cell (4096x14336) at M, the planned record and cuBLAS, CUDA graphs of 20 launches:
   after a small add, its weights cycling over 1 GiB or 16 GiB of copies; and after the step's own predecessors
   (cuBLAS gate_up 28672x4096 over 16 GiB, silu, mul). Per kernel name the median CUPTI duration.
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from gpu_timing import copies, kernels

import skinny_gemm
from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import served

PER = 20


def step(model_slug: str, m: int) -> dict:
    root = Path(skinny_gemm.__file__).resolve().parent / "kernels" / "models" / f"{model_slug}.json"
    _, built = served.build_served(root, [m])
    _, m, ops = next(b for b in built if b[0] == 1)
    data = ms.step_data(ops, m, torch.device("cuda"))
    firsts: dict = {}
    pooled = {}
    for i, (_, w, _) in data.gemms.items():
        seen = firsts.setdefault(tuple(w.shape), [])
        pooled[i] = seen[len(pooled) % 2] if len(seen) == 2 else w
        if len(seen) < 2:
            seen.append(w)

    def calls(gemm, pool: bool):
        out = []
        for i, op in enumerate(data.ops):
            if op.is_gemm:
                x, w, o = data.gemms[i]
                w = pooled[i] if pool else w
                out.append(lambda x=x, w=w, o=o, n=op.n, k=op.k: gemm(x, w, o, n, k))
            else:
                out.append(data.calls[i])
        return out

    gemms = {
        "cublas": lambda x, w, o, n, k: torch.mm(x, w.T, out=o),
        "ours": lambda x, w, o, n, k: skinny_gemm.linear(x, w),
    }
    graphs = {
        f"{g}-{'pooled' if pool else 'distinct'}": ms.capture(calls(fn, pool))
        for g, fn in gemms.items()
        for pool in (False, True)
    }
    wall = {k: round(v, 1) for k, v in ms.time_graphs(graphs, dict.fromkeys(graphs, 1)).items()}
    res = {"model": model_slug, "m": m, "wall_us": wall, "kernels": {k: kernels(g) for k, g in graphs.items()}}
    print(json.dumps({"model": model_slug, "m": m, "wall_us": wall}), flush=True)
    return res


def down_cell(m: int) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(7)
    n, k = 4096, 14336
    small, large = copies(n, k, 1 << 30, gen), copies(n, k, 16 << 30, gen)
    gate = copies(28672, 4096, 16 << 30, gen)
    xg = torch.randn(m, 4096, device="cuda", generator=gen).bfloat16()
    g_out = torch.empty(m, 28672, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    x = src.clone()
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(PER)]
    ref = x.double() @ small[0].double().T
    bound = ref.abs() * 2**-8 + (x.double().abs() @ small[0].double().abs().T) * 2**-16

    def ours(w, o):
        o.copy_(skinny_gemm.linear(x, w))

    impls = {"cublas": lambda w, o: torch.mm(x, w.T, out=o), "ours": ours}
    res = {"m": m, "bad": {}, "kernels": {}}
    for name, fn in impls.items():
        outs[0].fill_(float("nan"))
        fn(small[0], outs[0])
        torch.cuda.synchronize()
        res["bad"][name] = int((((outs[0].double() - ref).abs() > bound) | outs[0].isnan()).sum())

        def add_then(ws, fn=fn):
            for i in range(PER):
                torch.add(src, 0, out=x)
                fn(ws[i % len(ws)], outs[i])

        def step_like(fn=fn):
            for i in range(PER):
                torch.mm(xg, gate[i % len(gate)].T, out=g_out)
                torch.mul(F.silu(g_out[:, :14336]), g_out[:, 14336:], out=x)
                fn(large[i % len(large)], outs[i])

        for cond, body in (("add-1GiB", lambda: add_then(small)), ("add-16GiB", lambda: add_then(large))):
            res["kernels"][f"{name}:{cond}"] = kernels(ms.capture([body]))
        res["kernels"][f"{name}:gate_up-silu-16GiB"] = kernels(ms.capture([step_like]))
        print(name, json.dumps({c: v for c, v in res["kernels"].items() if c.startswith(name)}), flush=True)
    return res


def main():
    dest = Path(sys.argv[1])
    model, m = (sys.argv[2], int(sys.argv[3])) if len(sys.argv) > 3 else ("llama-3.1-8b", 16)
    result = {"gpu": torch.cuda.get_device_name(), "step": step(model, m)}
    dest.write_text(json.dumps(result, indent=1))
    torch.cuda.empty_cache()
    result["down_cell"] = down_cell(m)
    dest.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
