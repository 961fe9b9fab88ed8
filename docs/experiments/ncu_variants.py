"""Launch chosen variants (and cuBLAS) of one weight shape eagerly, for ncu's kernel replay (GPU).

    PYTHONPATH=SITE ncu --cache-control all --clock-control none --kernel-name regex:'skinny|gemm|nvjet|xmma' \
        --section SpeedOfLight ... python docs/experiments/ncu_variants.py N K SPEC [SPEC ...]

SPEC: ``DIR:VARIANT:M`` (a variant of an arch's artifact folder: a `tune prepare` dir's ``sm_90a``, or the
installed wheel's ``skinny_gemm/artifacts/sm_90a``) or ``cublas:M``. Each spec runs twice, on two of the weight's
copies, in the order given, then its output is checked against float64 (a wrong kernel is not worth
profiling); ncu's kernel replay (cache control all) starts each pass with a cold L2.
"""

import sys

import torch

from skinny_gemm.runtime import loader


def main():
    n, k = int(sys.argv[1]), int(sys.argv[2])
    gen = torch.Generator(device="cuda").manual_seed(5)
    ws = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16() for _ in range(2)]
    tables = {}
    for spec in sys.argv[3:]:
        parts = spec.split(":")
        m = int(parts[-1])
        x = torch.randn(m, k, device="cuda", generator=gen).bfloat16()
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        for i in range(2):
            if parts[0] == "cublas":
                torch.mm(x, ws[i].T, out=out)
            else:
                table = tables.get(parts[0]) or loader.load_dir(parts[0])
                tables[parts[0]] = table
                out.fill_(float("nan"))
                table.launch(parts[1], x, ws[i], out, None, n, k)
        torch.cuda.synchronize()
        ref = x.double() @ ws[1].double().T
        err = ((out.double() - ref).abs() / (ref.abs() + 1e-2)).max().item()
        print(f"{spec}: max relative error {err:.2e}", flush=True)


if __name__ == "__main__":
    main()
