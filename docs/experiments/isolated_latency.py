"""Alone in a chain vs isolated: does the tuner's chain of back-to-back launches hide our kernels' ramp and tail?

    PYTHONPATH=SITE python docs/experiments/isolated_latency.py ARTIFACTS_ROOT_A ARTIFACTS_ROOT_B OUT.json   (GPU)

Per cell (Llama-3.1-8B TP1 shapes at M = 8 and 16), the planned record of each artifact root (two plan arms,
e.g. the mma and the wgmma probe plans) and cuBLAS, timed two ways in CUDA graphs, cold L2 (weight copies
over 1 GiB), median of 7 interleaved trials:
- chain: 20 launches back to back on independent weights (the tuner's "alone": a PDL launch's weight
  prologue overlaps the previous launch's tail);
- isolated: 20 x (a tiny elementwise op writing the GEMM's tokens, then the GEMM), minus 20 x the op alone:
  the GEMM starts only after the op that produces its input, as between a norm and a projection in a step.
Outputs are checked against float64 once per record first (bound of helpers/reference: 2^-8 |ref| + 2^-16 |x||w|).
"""

import json
import statistics
import sys
from pathlib import Path

import torch

from skinny_gemm.runtime import loader

CELLS = [(4096, 4096), (6144, 4096), (4096, 14336), (28672, 4096)]
PER = 20


def graph(fn):
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g


def time_all(graphs: dict, trials=7) -> dict:
    out = {k: [] for k in graphs}
    for t in range(trials):
        names = list(graphs)
        names = names[t % len(names):] + names[: t % len(names)]
        for k in names:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            graphs[k].replay()
            b.record()
            b.synchronize()
            out[k].append(a.elapsed_time(b) * 1e3 / PER)
    return {k: statistics.median(v) for k, v in out.items()}


def main():
    roots, dest = sys.argv[1:3], Path(sys.argv[3])
    tables = {Path(r).name: loader.load_dir(Path(r) / "sm_90a", 0) for r in roots}
    gen = torch.Generator(device="cuda").manual_seed(3)
    rows = []
    for n, k in CELLS:
        copies = max(2, (1 << 30) // (n * k * 2) + 1)
        ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16() for _ in range(min(copies, 4))]
        ws += [ws[i % 4].clone() for i in range(len(ws), copies)]
        for m in (8, 16):
            src = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
            x = src.clone()
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(PER)]
            ref = x.double() @ ws[0].double().T
            bound = ref.abs() * 2**-8 + (x.double().abs() @ ws[0].double().abs().T) * 2**-16
            calls = {"cublas": lambda w, o: torch.mm(x, w.T, out=o)}
            for name, table in tables.items():
                rec = table.table.get((n, k, m))
                if rec is None:
                    continue
                vid = rec.variant.id
                calls[f"{name}:{vid}"] = lambda w, o, t=table, v=vid: t.launch(v, x, w, o, None, n, k)
            graphs = {}
            for label, call in calls.items():
                outs[0].fill_(float("nan"))
                call(ws[0], outs[0])
                torch.cuda.synchronize()
                bad = int((((outs[0].double() - ref).abs() > bound) | outs[0].isnan()).sum())
                rows.append({"n": n, "k": k, "m": m, "what": label, "bad": bad})
                graphs[("chain", label)] = graph(lambda c=call: [c(ws[i % len(ws)], outs[i]) for i in range(PER)])
                graphs[("isolated", label)] = graph(
                    lambda c=call: [(torch.add(src, 0, out=x), c(ws[i % len(ws)], outs[i])) for i in range(PER)]
                )
            graphs[("op", "")] = graph(lambda: [torch.add(src, 0, out=x) for _ in range(PER)])
            us = time_all(graphs)
            for (mode, label), v in us.items():
                if mode == "op":
                    continue
                rows.append({"n": n, "k": k, "m": m, "what": label, "mode": mode,
                             "us": v - (us[("op", "")] if mode == "isolated" else 0.0)})
            for label in calls:
                c, i = us[("chain", label)], us[("isolated", label)] - us[("op", "")]
                print(f"{n}x{k} M={m} {label}: chain {c:.1f} us, isolated {i:.1f} us", flush=True)
        ws = None
        torch.cuda.empty_cache()
        dest.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
