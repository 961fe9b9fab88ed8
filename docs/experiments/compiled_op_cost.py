"""What the public op costs the host inside a torch.compile'd model (GPU; perf.md Next 0, Ready 6).

  PYTHONPATH=SITE python3 docs/experiments/compiled_op_cost.py --out $OUT/compiled-op [--calls 32] [--reps 30]

One process, no vLLM, no CUDA graphs (Inductor's default mode). A chain of --calls projections x -> linear(x, W_i)
(4096 x 4096 bf16, distinct weights scaled to keep the chain O(1)) compiled three ways: F.linear, the public
``skinny_gemm.linear`` (its op ``skinny_gemm::linear``, a ``torch.library.custom_op`` up to 23ce46e and a
``torch.library.Library`` op since; the header line says which) and the same body (``ops.run``) registered
through ``torch.library.Library`` in this script. For each M (1024: no plan
holds it, every call falls back; and the planned M of 4096 x 4096 among 1, 8, 16), per arm: host microseconds per
call (the compiled function's return, the GPU queue drained before each rep) and wall microseconds per call (return
plus synchronize), medians over --reps with the arms alternating; the counters say what launched. The outputs of
the two skinny arms are checked against F.linear's chain (bf16 chains differ by rounding only).
"""

import argparse
import json
import statistics
import time
from pathlib import Path


def _lib_op():
    import torch

    from skinny_gemm.runtime import ops

    def body(x, weight):
        return ops.run(x, weight, None, None)

    lib = torch.library.Library("skinny_exp", "FRAGMENT")
    lib.define("linear(Tensor x, Tensor weight) -> Tensor")
    lib.impl("linear", body, "CUDA")
    torch.library.register_fake("skinny_exp::linear", lambda x, w: x.new_empty(x.shape[:-1] + (w.shape[0],)), lib=lib)
    return torch.ops.skinny_exp.linear, lib


def _chains(weights, lib_op):
    import torch.nn.functional as F

    import skinny_gemm

    def f_linear(x):
        for w in weights:
            x = F.linear(x, w)
        return x

    def f_skinny(x):
        for w in weights:
            x = skinny_gemm.linear(x, w)
        return x

    def f_library(x):
        for w in weights:
            x = lib_op(x, w)
        return x

    return {"F.linear": f_linear, "skinny_gemm.linear": f_skinny, "Library op": f_library}


def _time(fn, x, reps_out: dict, name: str):
    import torch

    torch.cuda.synchronize()
    t0 = time.perf_counter()
    y = fn(x)
    t1 = time.perf_counter()
    torch.cuda.synchronize()
    t2 = time.perf_counter()
    reps_out.setdefault(name, {"host": [], "wall": []})
    reps_out[name]["host"].append(t1 - t0)
    reps_out[name]["wall"].append(t2 - t0)
    return y


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--calls", type=int, default=32)
    ap.add_argument("--reps", type=int, default=30)
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)

    import torch

    import skinny_gemm
    from skinny_gemm.runtime import ops

    torch.manual_seed(0)
    n = k = 4096
    weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(args.calls)]
    lib_op, lib = _lib_op()
    planned = skinny_gemm.planned_ms(n, k)
    ms = [1024] + [m for m in (1, 8, 16) if m in planned]
    report = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "calls": args.calls, "planned": planned}
    report["public_op"] = "Library" if hasattr(ops, "_LIB") else "custom_op"
    lines = [
        f"{report['gpu']}, torch {torch.__version__}, {args.calls} chained {n}x{k} calls, planned M {planned}, "
        f"skinny_gemm::linear as a {report['public_op']} op"
    ]
    with torch.inference_mode():
        for m in ms:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            fns = {name: torch.compile(f, dynamic=False) for name, f in _chains(weights, lib_op).items()}
            outs = {}
            for name, fn in fns.items():  # compile and warm up
                for _ in range(3):
                    outs[name] = fn(x)
            torch.cuda.synchronize()
            skinny_gemm.counters(reset=True)
            reps: dict = {}
            for r in range(args.reps):
                names = list(fns) if r % 2 == 0 else list(fns)[::-1]
                for name in names:
                    _time(fns[name], x, reps, name)
            counts = skinny_gemm.counters(reset=True)
            ref = outs["F.linear"].float()
            row = {"m": m, "counters": counts, "arms": {}}
            for name in fns:
                host = statistics.median(reps[name]["host"]) / args.calls * 1e6
                wall = statistics.median(reps[name]["wall"]) / args.calls * 1e6
                err = (outs[name].float() - ref).abs().max().item()
                row["arms"][name] = {"host_us_per_call": host, "wall_us_per_call": wall, "max_abs_diff": err}
                lines.append(
                    f"M={m:5d} {name:32s} host {host:7.2f} us/call  wall {wall:7.2f} us/call  |diff| {err:.3g}"
                )
            launched = sum(c for *_, c in counts["launches"])
            fell = sum(c for *_, c in counts["fallbacks"])
            lines.append(f"M={m:5d} counters: {launched} launches, {fell} fallbacks {counts['fallbacks'][:3]}")
            report.setdefault("rows", []).append(row)
    del lib
    (args.out / "compiled-op.json").write_text(json.dumps(report, indent=1, sort_keys=True))
    (args.out / "compiled-op.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
