"""Launch wgmma_v2/v3 cubins a few times each, for ncu (no timing, no graphs): the profile perf.md asks for.

    python docs/experiments/wgmma_profile.py CUBIN_DIR N K M GRID NAME [NAME...]
    ncu --section SpeedOfLight --section WarpStateStats --section MemoryWorkloadAnalysis \\
        --section ComputeWorkloadAnalysis -k regex:'wgmma|nvjet|gemm' -c 12 python docs/experiments/wgmma_profile.py ...

GRID is "full" or a CTA count. The second launch of each name is the warm one (ncu flushes caches per
launch by default, so both are cold-L2).
"""

import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wgmma_v2_run import kernel, launcher  # noqa: E402


def main() -> None:
    folder, n, k, m, grid = Path(sys.argv[1]), *map(int, sys.argv[2:5]), sys.argv[5]
    table = json.loads((folder / "variants.json").read_text())
    torch.zeros(1, device="cuda")
    w = (torch.randn(n, k, device="cuda") * 0.05).bfloat16()
    x = torch.randn(m, k, device="cuda").bfloat16()
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
    for name in sys.argv[6:]:
        info = table[name]
        ctas = n // info["rows"] * info["split"] if grid == "full" else int(grid)
        _, fn = kernel(folder / f"{name}.cubin", info)
        launch = launcher(fn, info, ctas, x, w, out, n, k)
        for _ in range(2):
            launch()
        torch.cuda.synchronize()
        err = (out.double() - x.double() @ w.double().T).abs().max().item()
        print(f"{name} grid {ctas}: max abs error {err:.3g}", flush=True)
    for _ in range(2):  # cuBLAS on the same shape, the baseline in the same profile
        torch.mm(x, w.T, out=out)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
