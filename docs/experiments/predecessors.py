"""Which predecessor slows our down_proj kernel in the served step: the DRAM stream before it, or the kind of kernel
(cuBLAS's 220 KB shared-memory kernels set the SM's L1 / shared-memory split), and does our kernel's carveout
preference undo it?

    SKINNY_GEMM_ARTIFACTS=ROOT PYTHONPATH=SITE python docs/experiments/predecessors.py OUT.json [N K M [C,C,..]] (GPU)

One cell (default Llama-3.1-8B's down_proj, 4096x14336, M = 16): the planned record (skinny_gemm.linear) and
cuBLAS, in CUDA graphs of 20 iterations, weights cycling over 16 GiB of copies, each GEMM after:
  add         a small add that writes its tokens (the isolated bench);
  gate_up     the step's own: cuBLAS gate_up (28672x4096, its weights over 16 GiB), silu, mul writing the tokens;
  read        a 235 MB torch.sum (a DRAM stream by a kernel with no shared memory), then the add;
  hot_cublas  a cuBLAS GEMM whose 32 MB weight stays in L2 (its kernel, little DRAM traffic), then the add.
Then the same with our kernel's CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT at each percentage C (default
0, the most L1, and 100, the most shared memory). Per condition the median CUPTI duration of each kernel name (torch.profiler, 3 replays).
"""

import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from cuda.bindings import driver as cu
from gpu_timing import copies, kernels

import skinny_gemm
from skinny_gemm.aot import measure as ms
from skinny_gemm.runtime import loader

PER = 20


def main():
    dest = Path(sys.argv[1])
    n, k, m = (int(a) for a in sys.argv[2:5]) if len(sys.argv) > 4 else (4096, 14336, 16)
    carves = [None] + ([int(c) for c in sys.argv[5].split(",")] if len(sys.argv) > 5 else [0, 100])
    gen = torch.Generator(device="cuda").manual_seed(11)
    ws = copies(n, k, 16 << 30, gen)
    gate = copies(28672, 4096, 16 << 30, gen)
    hot_w = (torch.randn(4096, 4096, device="cuda", generator=gen) * 0.05).bfloat16()
    big = torch.zeros(235 << 20 >> 1, device="cuda", dtype=torch.bfloat16).view(-1, 4096)
    acc = torch.empty(4096, device="cuda", dtype=torch.bfloat16)
    xg = torch.randn(m, 4096, device="cuda", generator=gen).bfloat16()
    g_out = torch.empty(m, 28672, device="cuda", dtype=torch.bfloat16)
    h_out = torch.empty(m, 4096, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    x = src.clone()
    outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(PER)]
    ref = x.double() @ ws[0].double().T
    bound = ref.abs() * 2**-8 + (x.double().abs() @ ws[0].double().abs().T) * 2**-16

    def ours(w, o):
        o.copy_(skinny_gemm.linear(x, w))

    impls = {"cublas": lambda w, o: torch.mm(x, w.T, out=o), "ours": ours}
    before = {
        "add": lambda: torch.add(src, 0, out=x),
        "gate_up": lambda i: (
            torch.mm(xg, gate[i % len(gate)].T, out=g_out),
            torch.mul(F.silu(g_out[:, : g_out.shape[1] // 2]), g_out[:, g_out.shape[1] // 2 :], out=x[:, :14336])
            if k == 14336
            else torch.add(src, 0, out=x),
        ),
        "read": lambda: (torch.sum(big, dim=0, out=acc), torch.add(src, 0, out=x)),
        "hot_cublas": lambda: (torch.mm(xg, hot_w.T, out=h_out), torch.add(src, 0, out=x)),
    }
    result = {"gpu": torch.cuda.get_device_name(), "n": n, "k": k, "m": m, "bad": {}, "runs": {}}
    for name, fn in impls.items():
        outs[0].fill_(float("nan"))
        fn(ws[0], outs[0])
        torch.cuda.synchronize()
        result["bad"][name] = int((((outs[0].double() - ref).abs() > bound) | outs[0].isnan()).sum())
    rec = loader.DEVICES[0].table.bound[(n, k, m)]
    attr = cu.CUfunction_attribute
    result["ours"] = {
        "variant": rec.variant.id,
        "static_smem": int(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, rec.function)[1]),
        "dynamic_smem": rec.smem,
        "registers": int(cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_NUM_REGS, rec.function)[1]),
        "carveout_at_bind": int(
            cu.cuFuncGetAttribute(attr.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, rec.function)[1]
        ),
    }
    print(json.dumps(result["ours"]), json.dumps(result["bad"]), flush=True)
    for carve in carves:
        if carve is not None:
            err = cu.cuFuncSetAttribute(rec.function, attr.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, carve)
            assert int(err[0]) == 0, err
        for name, fn in impls.items():
            if carve is not None and name == "cublas":
                continue
            for cond, pre in before.items():

                def body(fn=fn, pre=pre, cond=cond):
                    for i in range(PER):
                        pre(i) if cond == "gate_up" else pre()
                        fn(ws[i % len(ws)], outs[i])

                label = f"{name}:{cond}" + ("" if carve is None else f":carveout{carve}")
                result["runs"][label] = kernels(ms.capture([body]))
                print(label, json.dumps(result["runs"][label]), flush=True)
                dest.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
