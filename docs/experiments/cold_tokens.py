"""Cold tokens: do our kernels lose in the served step because the step's tokens come from DRAM?

    SKINNY_GEMM_ARTIFACTS=ROOT PYTHONPATH=SITE python docs/experiments/cold_tokens.py OUT.json [MODEL:M ...]   (GPU)

The served step's stand-ins (aot/measure.step_data) give every GEMM its own token buffer that no op writes, so
after the step's other traffic the tokens sit in DRAM when the GEMM starts; in vLLM the op before a projection
has just written them (in L2). cuBLAS stages tokens through TMA into shared memory once per tile; the mma kinds
load token fragments from global memory in every k step, so a miss there is on their critical path.

1. Isolated (Llama-3.1-8B TP1 cells, M = 8 and 16; the artifact root's planned record and cuBLAS; CUDA graphs of
   20 launches over weight copies of at least 1 GiB, median of 7 interleaved trials, minus the op alone):
   hot  = an add writes the GEMM's tokens, then the GEMM;
   cold = the add writes a scratch buffer, the GEMM reads one of 20 token copies last touched a replay ago.
2. The served step (TP1) of each MODEL:M, four graphs timed interleaved (wall per replay, median of 7 x 3):
   cublas / ours with the step as the tuner builds it (cold), and with an add that writes each GEMM's tokens just
   before it (hot; the cold arms get the same add into a scratch buffer, so both have the same kernels).
Outputs are checked against float64 once per record first (bound of helpers/reference).
"""

import json
import os
import sys
from pathlib import Path

import torch

import skinny_gemm
from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import served
from skinny_gemm.runtime import loader

CELLS = [(4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096)]
PER = 20


def isolated(table, rows):
    gen = torch.Generator(device="cuda").manual_seed(5)
    for n, k in CELLS:
        copies = max(2, (1 << 30) // (n * k * 2) + 1)
        ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16() for _ in range(min(copies, 4))]
        ws += [ws[i % 4].clone() for i in range(len(ws), copies)]
        for m in (8, 16):
            src = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            hot, scratch = src.clone(), src.clone()
            colds = [src.clone() for _ in range(PER)]
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(PER)]
            ref = src.double() @ ws[0].double().T
            bound = ref.abs() * 2**-8 + (src.double().abs() @ ws[0].double().abs().T) * 2**-16
            calls = {"cublas": lambda x, w, o: torch.mm(x, w.T, out=o)}
            rec = table.table.get((n, k, m))
            if rec is not None:
                calls[rec.variant.id] = lambda x, w, o, v=rec.variant.id: table.launch(v, x, w, o, None, n, k)
            graphs = {("op", ""): ms.capture([lambda: [torch.add(src, 0, out=scratch) for _ in range(PER)]])}
            for label, call in calls.items():
                outs[0].fill_(float("nan"))
                call(hot, ws[0], outs[0])
                torch.cuda.synchronize()
                bad = int((((outs[0].double() - ref).abs() > bound) | outs[0].isnan()).sum())
                rows.append({"n": n, "k": k, "m": m, "what": label, "bad": bad})
                graphs[("hot", label)] = ms.capture(
                    [
                        lambda c=call: [
                            (torch.add(src, 0, out=hot), c(hot, ws[i % len(ws)], outs[i])) for i in range(PER)
                        ]
                    ]
                )
                graphs[("cold", label)] = ms.capture(
                    [
                        lambda c=call: [
                            (torch.add(src, 0, out=scratch), c(colds[i], ws[i % len(ws)], outs[i])) for i in range(PER)
                        ]
                    ]
                )
            us = ms.time_graphs(graphs, dict.fromkeys(graphs, 1), reps=1)
            for label in calls:
                h, c = (us[(mode, label)] / PER - us[("op", "")] / PER for mode in ("hot", "cold"))
                rows.append({"n": n, "k": k, "m": m, "what": label, "hot_us": h, "cold_us": c})
                print(f"{n}x{k} M={m} {label}: hot {h:.1f} us, cold {c:.1f} us", flush=True)
        ws = None
        torch.cuda.empty_cache()


def step(model_slug: str, m: int) -> dict:
    root = Path(skinny_gemm.__file__).resolve().parent / "kernels" / "models" / f"{model_slug}.json"
    _, built = served.build_served(root, [m])
    _, m, ops = next(b for b in built if b[0] == 1)
    data = ms.step_data(ops, m, torch.device("cuda"))
    srcs = {i: x.clone() for i, (x, _, _) in data.gemms.items()}
    scratch = {i: x.clone() for i, (x, _, _) in data.gemms.items()}

    def calls(gemm, hot: bool):
        out = []
        for i, op in enumerate(data.ops):
            if op.is_gemm:
                x, w, o = data.gemms[i]
                out.append(lambda s=srcs[i], d=(x if hot else scratch[i]): torch.add(s, 0, out=d))
                out.append(lambda x=x, w=w, o=o, n=op.n, k=op.k: gemm(x, w, o, n, k))
            else:
                out.append(data.calls[i])
        return out

    gemms = {
        "cublas": lambda x, w, o, n, k: torch.mm(x, w.T, out=o),
        "ours": lambda x, w, o, n, k: skinny_gemm.linear(x, w),
    }
    graphs = {
        f"{g}-{'hot' if hot else 'cold'}": ms.capture(calls(fn, hot))
        for g, fn in gemms.items()
        for hot in (False, True)
    }
    us = ms.time_graphs(graphs, dict.fromkeys(graphs, 1), trials=7, reps=3)
    res = {
        "model": model_slug,
        "m": m,
        "wall_us": us,
        "share_cold": us["cublas-cold"] / us["ours-cold"],
        "share_hot": us["cublas-hot"] / us["ours-hot"],
    }
    print(json.dumps(res), flush=True)
    graphs = None
    data = None
    torch.cuda.empty_cache()
    return res


def main():
    dest = Path(sys.argv[1])
    steps = [a.split(":") for a in sys.argv[2:]] or [["llama-3.1-8b", "16"]]
    result = {"gpu": torch.cuda.get_device_name(), "steps": [], "isolated": []}
    for slug, m in steps:
        result["steps"].append(step(slug, int(m)))
        dest.write_text(json.dumps(result, indent=1))
    table = loader.load_dir(Path(os.environ["SKINNY_GEMM_ARTIFACTS"]) / "sm_90a", 0)
    isolated(table, result["isolated"])
    dest.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
