"""Can an ahead-of-time cubin take a TMA descriptor by value? (issue: batch 8 and 16; perf.md Next 0)

The wgmma designs that stream the weight like cuBLAS need a tensor map (CUtensorMap, 128 bytes) per weight.
The CuTe DSL (4.8.1) has ``GridConstant[TensorMap]`` kernel parameters (``cutlass.experimental.cuda``): the
descriptor is a ``__grid_constant__`` parameter, built on the host. This probe compiles, on the CPU, a kernel
that takes one (plus the output pointer and K) and issues one TMA tile load (64 rows x 64 k of bf16) into shared
memory, then copies the box to the output (out[cta] = w[64 cta : 64 cta + 64, 0:64]); it prints the cubin's parameter records, which say what the runtime
would have to pass (offset, size) next to the raw pointers it passes today.

    python docs/experiments/tma_param_probe.py OUT_DIR        (CPU: OUT_DIR/tma_probe.cubin, prints the records)
    python docs/experiments/tma_param_probe_run.py OUT_DIR    (GPU, no cutlass: descriptor by cuda-python, launch, check)
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wgmma_v1 as v1  # noqa: E402

ROWS, KT = 64, 64


def build(out_dir: Path) -> bytes:
    v1._source_tree()
    import cutlass
    import cutlass.cute as cute
    from cutlass import GridConstant
    from cutlass.cute.runtime import make_ptr
    from cutlass.cute.typing import AddressSpace
    from cutlass.experimental.cuda import TensorMap, create_tensor_map_tiled_from_view
    from cutlass.experimental.primitives import nvvm_wrapper as nv

    from skinny_gemm.kernels.common import compile_options

    class Probe:
        @cute.kernel
        def kernel(self, desc: GridConstant[TensorMap], out: cute.Pointer, k: cutlass.Int32):
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            tile = cute.arch.alloc_smem(cutlass.BFloat16, ROWS * KT, alignment=128)  # (row, k) one TMA box
            bar = cute.arch.alloc_smem(cutlass.Int64, 1, alignment=8)
            if tidx == 0:
                nv.prefetch_tensormap(desc.get_ptr())
                cute.arch.mbarrier_init(bar, 1)
                cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()
            if tidx == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(bar, ROWS * KT * 2)
                nv.cp_async_bulk_tensor_shared_cta_global(tile, desc.get_ptr(), [0, bidx * ROWS], bar)
            cute.arch.mbarrier_wait(bar, 0)
            t = cute.make_tensor(tile, cute.make_layout(ROWS * KT))
            o = cute.make_tensor(out + bidx * ROWS * KT, cute.make_layout(ROWS * KT))  # this CTA's (row, k) box
            for i in cutlass.range_constexpr(ROWS * KT // 128):
                o[i * 128 + tidx] = t[i * 128 + tidx]

        @cute.jit
        def __call__(self, w: cute.Pointer, out: cute.Pointer, n: cutlass.Int32, k: cutlass.Int32):
            self.kernel.set_name_prefix("skinny_tma_probe", remove_cutlass_symbol=True, keep_mangled_name=False)
            wt = cute.make_tensor(w, cute.make_layout((n, k), stride=(k, 1)))  # (n, k) row-major weight
            desc = create_tensor_map_tiled_from_view(wt, box_dims=(ROWS, KT), stride_order=(1, 0))
            self.kernel(desc, out, k).launch(grid=(n // ROWS, 1, 1), block=(128, 1, 1))

    out_dir.mkdir(parents=True, exist_ok=True)
    ptr = lambda: make_ptr(cutlass.BFloat16, 0, AddressSpace.gmem, assumed_align=16)  # noqa: E731
    compiled = cute.compile(Probe(), ptr(), ptr(), cutlass.Int32(0), cutlass.Int32(0),
                            options=compile_options("sm_90a", str(out_dir)))
    cubin = bytes(compiled.artifacts.CUBIN)
    (out_dir / "tma_probe.cubin").write_bytes(cubin)
    return cubin


if __name__ == "__main__":
    if len(sys.argv) != 2:
        print(__doc__)
        sys.exit(2)
    data = build(Path(sys.argv[1]))
    from skinny_gemm.runtime import elf

    for symbol, info in elf.inspect(data).kernels.items():
        print(symbol, "params (ordinal, offset, size):", info.params, "block", info.reqntid)
