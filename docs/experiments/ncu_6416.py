"""Launch the 6416x4096 kernels compared in docs/perf.md (v11 ncu) three times each, on fresh weights, for ncu (GPU).

Usage, on the H200 with the sm_90a wheel installed and CAND_DIR a sweep build holding these variants
(`python docs/experiments/sweep_cells.py late CAND_DIR` with docs/experiments/late-tokens-v10.patch applied):
  ncu -k regex:skinny --csv --metrics gpu__time_duration.sum,dram__bytes_read.sum,\
lts__t_requests_srcunit_tex_op_read.sum,lts__t_sectors_srcunit_tex_op_read.sum,\
lts__t_sector_op_read_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active \
    python ncu_6416.py CAND_DIR
"""

import sys
from pathlib import Path

import torch

from skinny_gemm.runtime import loader

VARIANTS = [
    (1, "simt_m1_t256_kt256_c1_v8_u2_kdyn_pdl"),
    (1, "mma_m1_t512_kt512_c8_v8_u1_kdyn_pdl_s4"),
    (4, "mma_m4_t512_kt512_c8_v8_u1_kdyn_pdl_s4"),
    (4, "mma_m4_t512_kt512_c8_v8_u1_kdyn_pdl_s4_f128"),
    (4, "mma_m4_t128_kt128_c16_v8_u1_kdyn_pdl_s4_f128_x2"),
]
N, K = 6416, 4096
dev = torch.device("cuda", 0)
lib = loader.load_dir(Path(sys.argv[1]) / "sm_90a", dev)
for m, variant in VARIANTS:
    weights = [torch.randn(N, K, device=dev).bfloat16() for _ in range(3)]
    x = torch.randn(m, K, device=dev).bfloat16()
    out = torch.empty(m, N, device=dev, dtype=torch.bfloat16)
    for w in weights:
        lib.launch(variant, x, w, out, None, N, K)
    torch.cuda.synchronize()
