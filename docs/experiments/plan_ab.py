"""One-off A/B (not product code): the GLM served step and cells alone, several plan builds, one process.

ROOT holds builds `skinny-gemm build --arch sm_90a --plan P --out ROOT/NAME`. Served: per "MS=NAMES" group,
each M's step (TP 4 and 8) with each named build beside cuBLAS (share and bare chain). Alone: at --alone-ms,
every cell where a named build's config differs from the first's, cold L2, beside cuBLAS. Run on the H200 from
the repository root. The 2026-12-02 runs (docs/perf.md):

  # docs/results/plan-ab-h200.*: base = the plan of 1dbc6c8, pdlon = its M=8/16 no-PDL entries with PDL on,
  # iso = its M=8/16 entries on their alone-fastest candidates, w1 / w2 = every mma entry warm
  # (docs/experiments/warm-next-weight.patch applied, which this script's warm branch serves)
  python docs/experiments/plan_ab.py .device/warm --served 1,2,4=base,w1,w2 8,16=base,pdlon,iso \
      --alone base,pdlon,iso --alone-ms 8 16 --out $OUT/ab2.json
  # docs/results/token-groups-m16-ab-h200.*: G = the M=16 entries of docs/experiments/m16-token-groups-plan.json
  # (built when token_groups was still a patch; the field is on main since 2026-12-03)
  python docs/experiments/plan_ab.py .device/g --served 16=base,G --alone base,G --alone-ms 16 --out $OUT/ab_g.json

The token-groups run used a copy of the first run's script with its names and M set in place; this one takes them
as arguments (its alone cells then are those where the builds differ).
"""
import argparse
import json
import os
import sys
import time


def parse():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("root", help="folder of the builds (ROOT/NAME/sm_90a)")
    p.add_argument("--served", nargs="+", default=[], metavar="MS=NAMES",
                   help="token counts and the builds timed at them in the served step, e.g. 8,16=base,pdlon")
    p.add_argument("--alone", default="", metavar="NAMES", help="builds timed alone, the first the baseline")
    p.add_argument("--alone-ms", type=int, nargs="*", default=[])
    p.add_argument("--out", default=os.path.join(os.environ.get("OUT", "/tmp"), "plan_ab.json"))
    args = p.parse_args()
    served = {}
    for group in args.served:
        ms, names = group.split("=")
        for m in ms.split(","):
            served[int(m)] = names.split(",")
    return args, served, [n for n in args.alone.split(",") if n]


def main():
    args, served, alone_names = parse()
    sys.path.insert(0, os.getcwd())
    from aot.source_tree import register

    register()
    import torch

    from skinny_gemm.aot.served import build_served
    from skinny_gemm.aot import measure as ms
    from skinny_gemm.runtime import loader

    dev = torch.device("cuda", 0)
    names = sorted({n for v in served.values() for n in v} | set(alone_names))
    libs = {name: loader.load_dir(os.path.join(args.root, name, "sm_90a"), dev) for name in names}
    plans = {name: lib.plans() for name, lib in libs.items()}
    result = {"gpu": torch.cuda.get_device_name(0), "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
              "command": " ".join(sys.argv), "served": [], "alone": []}

    def run_gemm(name, m, nxt_w):
        lib, pl = libs[name], plans[name]

        def gemm(i, x, w, o, n, k):
            v = pl.get((n, k, m))
            if v is None:
                return lambda: torch.mm(x, w.T, out=o)
            e = None
            warm = getattr(v.config, "warm", 0)  # only with warm-next-weight.patch
            if warm and nxt_w[i].numel() * 2 >= warm << 20:
                e = nxt_w[i]
            return lambda: lib.launch(v.id, x, w, o, e, n, k)
        return gemm

    def calls(data, ops, gemm, with_ops=True):
        out = []
        for i, op in enumerate(ops):
            if op.is_gemm:
                x, w, o = data.gemms[i]
                out.append(gemm(i, x, w, o, op.n, op.k))
            elif with_ops:
                out.append(data.calls[i])
        return out

    def cub(i, x, w, o, n, k):
        return lambda: torch.mm(x, w.T, out=o)

    _, built = build_served("kernels/models/glm-5.3-flash.json", sorted(served))
    for tp, m, ops in built:
        data = ms.step_data(ops, m, dev)
        gidx = [i for i, op in enumerate(ops) if op.is_gemm]
        nxt_w = {i: data.gemms[gidx[(j + 1) % len(gidx)]][1] for j, i in enumerate(gidx)}
        graphs = {"ops": ms.capture([data.calls[i] for i, op in enumerate(ops) if not op.is_gemm])}
        graphs["cublas"] = ms.capture(calls(data, ops, cub))
        graphs["cublas_bare"] = ms.capture(calls(data, ops, cub, with_ops=False))
        for name in served[m]:
            graphs[name] = ms.capture(calls(data, ops, run_gemm(name, m, nxt_w)))
            graphs[name + "_bare"] = ms.capture(calls(data, ops, run_gemm(name, m, nxt_w), with_ops=False))
        t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=15)
        share = {g: t[g] - t["ops"] for g in graphs if g != "ops" and not g.endswith("_bare")}
        row = {"tp": tp, "m": m, "us": t, "share_over_cublas": {g: share["cublas"] / share[g] for g in share},
               "bare_over_cublas": {g: t["cublas_bare"] / t[g + "_bare"] for g in served[m]}}
        result["served"].append(row)
        print("served", tp, m, {g: round(v, 3) for g, v in row["share_over_cublas"].items()},
              "bare", {g: round(v, 3) for g, v in row["bare_over_cublas"].items()}, flush=True)
        del graphs, data
        torch.cuda.empty_cache()

    # cells alone (cold L2: a chain over >= 1 GiB of weight copies) where the builds differ, beside cuBLAS
    first = alone_names[0] if alone_names else None
    differ = sorted({key for key, v in plans.get(first, {}).items() if key[2] in args.alone_ms
                     and any(plans[nm].get(key) is not None and plans[nm][key].config != v.config
                             for nm in alone_names[1:])})
    for n, k in sorted({(n, k) for n, k, _ in differ}):
        at = [m for nn, kk, m in differ if (nn, kk) == (n, k)]
        inp = ms.make_inputs(n, k, at, dev)
        for m in at:
            x = inp.tokens[m]
            graphs = {"cublas": ms.capture([(lambda w=w, o=o: torch.mm(x, w.T, out=o))
                                            for w, o in zip(inp.weights, inp.outs[m])])}
            for name in alone_names:
                v = plans[name].get((n, k, m))
                if v is None:
                    continue  # that build leaves the cell on cuBLAS
                graphs[name] = ms.capture([(lambda w=w, o=o, v=v, lib=libs[name]: lib.launch(v.id, x, w, o, None, n, k))
                                           for w, o in zip(inp.weights, inp.outs[m])])
            t = ms.time_graphs(graphs, {g: len(inp.weights) for g in graphs}, trials=7)
            result["alone"].append({"n": n, "k": k, "m": m, "us": t})
            print("alone", n, k, m, {g: round(t["cublas"] / t[g], 3) for g in t}, flush=True)
        del inp, graphs
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
