"""GPU half of tma_param_probe.py (no cutlass): a CUtensorMap encoded by cuda-python, passed by value to the AOT cubin.

    python docs/experiments/tma_param_probe_run.py CUBIN_DIR

The weight is a random bf16 (n, k) tensor; the descriptor is 2-D (k innermost, row pitch k * 2 bytes), boxes of
64 k x 64 rows, no swizzle, as the probe's host code builds it. Each CTA loads its rows' first box by TMA and
copies it out; the output must equal w[:, :64] exactly (a copy, no arithmetic), after poisoning it with NaN.
"""

import ctypes
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as d

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wgmma_v1_run import ok  # noqa: E402

ROWS, KT = 64, 64


def main() -> None:
    cubin = Path(sys.argv[1]) / "tma_probe.cubin"
    torch.zeros(1, device="cuda")  # the primary context, current for the driver calls
    lib = ok(d.cuLibraryLoadData(cubin.read_bytes(), None, None, 0, None, None, 0))
    fn = ok(d.cuKernelGetFunction(ok(d.cuLibraryGetKernel(lib, b"skinny_tma_probe_0"))))
    for n, k in ((4096, 4096), (28672, 4096), (4096, 14336)):
        w = torch.randn(n, k, device="cuda").bfloat16()
        out = torch.full((n // ROWS, ROWS, KT), float("nan"), device="cuda", dtype=torch.bfloat16)
        tmap = ok(d.cuTensorMapEncodeTiled(
            d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, d.cuuint32_t(2), w.data_ptr(),
            [d.cuuint64_t(k), d.cuuint64_t(n)], [d.cuuint64_t(k * 2)], [d.cuuint32_t(KT), d.cuuint32_t(ROWS)],
            [d.cuuint32_t(1), d.cuuint32_t(1)],
            d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_NONE,
            d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_NONE,
            d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
        out_ptr, k_arg = ctypes.c_uint64(out.data_ptr()), ctypes.c_int32(k)
        argv = (ctypes.c_void_p * 3)(tmap.getPtr(), ctypes.addressof(out_ptr), ctypes.addressof(k_arg))
        stream = torch.cuda.current_stream().cuda_stream
        ok(d.cuLaunchKernel(fn, n // ROWS, 1, 1, 128, 1, 1, ROWS * KT * 2 + 128, stream, ctypes.addressof(argv), 0))
        torch.cuda.synchronize()
        want = w[:, :KT].reshape(n // ROWS, ROWS, KT)
        bad = int((out != want).sum())
        print(f"{n}x{k}: {n // ROWS} CTAs, descriptor by value, {bad} of {out.numel()} outputs differ from w[:, :64]")
        assert bad == 0


if __name__ == "__main__":
    main()
