"""Our down_proj kernel under ncu after two predecessors, eagerly, so that application replay keeps the context.

    SKINNY_GEMM_ARTIFACTS=ROOT PYTHONPATH=SITE ncu --replay-mode application --cache-control none \
        --clock-control none --kernel-name regex:skinny_ --launch-skip 6 --launch-count 3 --metrics ... \
        python docs/experiments/predecessor_ncu.py MODE   (GPU; MODE add | read)

Twelve iterations of (predecessor, down_proj 4096x14336 at M = 16 through skinny_gemm.linear, weights cycling
over 8 copies): "add" = a small add writing the tokens (the isolated bench: 30 us), "read" = a 246 MB torch.sum,
then that add (36 us; docs/results/predecessors-down-m16-h200.json). Same seed, same order every run.
"""

import sys

import torch

import skinny_gemm


def main():
    mode = sys.argv[1]
    gen = torch.Generator(device="cuda").manual_seed(13)
    n, k, m = 4096, 14336, 16
    ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16() for _ in range(8)]
    big = torch.zeros(246 << 20 >> 1, device="cuda", dtype=torch.bfloat16).view(-1, 4096)
    acc = torch.empty(4096, device="cuda", dtype=torch.bfloat16)
    src = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
    x = src.clone()
    for i in range(12):
        if mode == "read":
            torch.sum(big, dim=0, out=acc)
        torch.add(src, 0, out=x)
        skinny_gemm.linear(x, ws[i % len(ws)])
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
