"""The warpgroup-MMA mapping, fourth reading: TMA boxes into a deep ring, a producer warp, SS wgmma consumers.

What v1-v3 lacked (perf.md: the profile, the halves and the occupancy runs): cuBLAS's pipeline. Here the
weight comes in one TMA box per stage (64 k x 64 C rows, 128-byte swizzle, the canonical K-major layout that
wgmma reads from shared memory directly), the tokens in a second box per stage (64 k x NT tokens; rows past
the real M are the box's out-of-bounds zeros), both through descriptors passed by value
(``GridConstant[TensorMap]``; tma_param_probe.py settled that ABI). Warpgroup 0 is the producer (one thread
issues; it waits only for a stage's release), warpgroups 1..C consume (64 weight rows each, A and B both from
shared memory: four m64nNTk16 per stage, one wait, then one arrive per warpgroup on the stage's empty barrier).
One tile of 64 C rows per cluster of ``split`` CTAs, each CTA a contiguous K slice; ranks 1.. add their
accumulators into rank 0's shared memory (distributed shared memory, as v2), rank 0 stores. No bias, no
residual: a measurement, not a plan kind.

    python docs/experiments/wgmma_v4.py compile OUT_DIR     (CPU: cubins + OUT_DIR/variants.json)
    python docs/experiments/wgmma_v4_run.py OUT_DIR         (GPU, no cutlass: float64 check and timing)
"""

import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wgmma_v1 as v1  # noqa: E402

KB = 64  # k per stage: 128 bytes, the 128-byte swizzle's row
SW_SBO = 1024  # 8 rows x 128 B: the swizzle atom, the stride between 8-row groups


@dataclass(frozen=True)
class V4Config:
    nt: int  # tokens per MMA (8 or 16): the box's rows; M <= nt
    consumers: int = 1
    stages: int = 8
    split: int = 1  # CTAs per cluster, each a K slice

    @property
    def rows(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return 128 * (1 + self.consumers)

    @property
    def w_bytes(self) -> int:
        return self.rows * 128

    @property
    def stage_bytes(self) -> int:
        return self.w_bytes + 2048  # the token box padded to the 1024-byte alignment the swizzle needs

    @property
    def red_bytes(self) -> int:
        return (self.split - 1) * 128 * self.consumers * (self.nt // 2) * 4  # ranks 1..: every accumulator

    @property
    def smem(self) -> int:
        return self.stages * self.stage_bytes + 16 * self.stages + self.red_bytes + 1024  # + alignment slack

    def check(self):
        assert self.nt in (8, 16) and self.consumers in (1, 2) and self.stages >= 2, self
        assert self.split in (1, 2, 4, 8), self
        assert self.smem <= 227 * 1024, self

    @property
    def name(self) -> str:
        return f"wgmma_v4_n{self.nt}_c{self.consumers}_s{self.stages}" + (f"_x{self.split}" if self.split > 1 else "")


def variants() -> list[V4Config]:
    out = []
    for nt in (8, 16):
        for consumers, stages in ((1, 2), (1, 3), (1, 4), (1, 5), (1, 6), (1, 8), (1, 16), (2, 3), (2, 4), (2, 8), (2, 11)):
            cfg = V4Config(nt, consumers, stages)
            cfg.check()
            out.append(cfg)
        for stages, split in ((4, 2), (8, 2), (4, 4), (8, 4), (6, 8)):
            cfg = V4Config(nt, 1, stages, split)
            cfg.check()
            out.append(cfg)
    return out


def sw128_desc(addr_bytes: int) -> int:
    """The wgmma shared-memory descriptor of a 128-byte-swizzled K-major tile at ``addr`` (1024-aligned)."""
    return (addr_bytes >> 4) | (1 << 16) | ((SW_SBO >> 4) << 32) | (1 << 62)


def build(out_dir: Path, only: str = "") -> None:
    v1._source_tree()
    import cutlass
    import cutlass.cute as cute
    from cutlass import GridConstant
    from cutlass.cute.runtime import make_ptr
    from cutlass.cute.typing import AddressSpace
    from cutlass.experimental.cuda import TensorMap, TensorMapSwizzle, create_tensor_map_tiled_from_view
    from cutlass.experimental.primitives import nvvm_wrapper as nv

    from skinny_gemm.kernels.common import compile_options
    from skinny_gemm.kernels.skinny_mma import CLUSTER_SYNC_PTX, MAPA_PTX, ST_CLUSTER_PTX

    def wgmma_ptx(nt: int) -> str:
        """Inputs: A descriptors of the stage's four k16 steps ($r0-$r3), B descriptors ($r4-$r7), then the
        accumulators; outputs: the accumulators (copied in first: the DSL's asm has no tied operands)."""
        na = nt // 2
        body = "".join(f"mov.f32 {{$w{e}}}, {{$r{8 + e}}};\n\t" for e in range(na))
        body += "wgmma.fence.sync.aligned;\n\t"
        d = ", ".join(f"{{$w{e}}}" for e in range(na))
        for u in range(4):
            body += (f"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.bf16.bf16 {{{d}}}, {{$r{u}}}, {{$r{4 + u}}}, "
                     "p, 1, 1, 0, 0;\n\t")
        body += "wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;"
        return "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, 1, 1;\n\t" + body + "\n}"

    class WgmmaV4:
        def __init__(self, cfg: V4Config):
            cfg.check()
            self.cfg = cfg

        @cute.kernel
        def kernel(self, wdesc: GridConstant[TensorMap], xdesc: GridConstant[TensorMap], out: cute.Pointer,
                   n: cutlass.Int32, k: cutlass.Int32):
            cfg = self.cfg
            S, NT, NA, X = cfg.stages, cfg.nt, cfg.nt // 2, cfg.split
            STAGE, WB = cfg.stage_bytes, cfg.w_bytes
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            wg = tidx // 128
            t = tidx % 128
            warp = t // 32
            lane = t % 32
            g = lane // 4
            q = lane % 4
            rank = bidx % X
            tile = bidx // X
            chunks = k // KB // X
            k0 = rank * chunks
            smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=1024)
            ring = smem  # (stage): [weight box rows x 128 B | token box NT x 128 B, padded to 2 KB]
            full = cute.recast_ptr(smem + S * STAGE, dtype=cutlass.Int64)
            empty = full + S
            red = cute.recast_ptr(smem + S * STAGE + 16 * S, dtype=cutlass.Float32)  # (rank - 1, thread, e)
            if tidx == 0:
                nv.prefetch_tensormap(wdesc.get_ptr())
                nv.prefetch_tensormap(xdesc.get_ptr())
                for s in cutlass.range_constexpr(S):
                    cute.arch.mbarrier_init(full + s, 1)
                    cute.arch.mbarrier_init(empty + s, cfg.consumers)
                cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()
            if cutlass.const_expr(X > 1):
                cute.arch.inline_ptx("barrier.cluster.arrive.relaxed.aligned;")
            if wg == 0:
                if t == 0:
                    for c in cutlass.range(chunks, unroll=1):
                        s = c % S
                        if c >= S:
                            cute.arch.mbarrier_wait(empty + s, ((c // S) - 1) & 1)
                        cute.arch.mbarrier_arrive_and_expect_tx(full + s, WB + NT * 128)
                        nv.cp_async_bulk_tensor_shared_cta_global(ring + s * STAGE, wdesc.get_ptr(),
                                                                  [(k0 + c) * KB, tile * cfg.rows], full + s)
                        nv.cp_async_bulk_tensor_shared_cta_global(ring + s * STAGE + WB, xdesc.get_ptr(),
                                                                  [(k0 + c) * KB, 0], full + s)
                cute.arch.sync_warp()
                if cutlass.const_expr(X > 1):
                    cute.arch.inline_ptx("barrier.cluster.wait.aligned;")
                    cute.arch.inline_ptx(CLUSTER_SYNC_PTX)
            else:
                acc = cute.make_rmem_tensor(NA, cutlass.Float32)
                acc.fill(0.0)
                base = ring.toint() & 0x3FFFF
                for c in cutlass.range(chunks, unroll=1):
                    s = c % S
                    cute.arch.mbarrier_wait(full + s, (c // S) & 1)
                    a0 = cutlass.Int64(sw128_desc(0)) + cutlass.Int64((base + s * STAGE + (wg - 1) * 8192) >> 4)
                    b0 = cutlass.Int64(sw128_desc(0)) + cutlass.Int64((base + s * STAGE + WB) >> 4)
                    descs = [a0 + cutlass.Int64(2 * u) for u in range(4)] + [b0 + cutlass.Int64(2 * u) for u in range(4)]
                    res = cute.arch.inline_ptx(wgmma_ptx(NT), write_only_types=[cutlass.Float32] * NA,
                                               read_only_args=descs + [acc[e] for e in range(NA)])
                    for e in cutlass.range_constexpr(NA):
                        acc[e] = res[e]
                    if t == 0:
                        cute.arch.mbarrier_arrive(empty + s)
                ct = tidx - 128  # consumer thread
                CT = 128 * cfg.consumers
                if cutlass.const_expr(X > 1):
                    cute.arch.inline_ptx("barrier.cluster.wait.aligned;")
                    if rank != 0:
                        for e in cutlass.range_constexpr(NA):
                            local = (red + ((rank - 1) * CT + ct) * NA + e).toint()
                            remote = cute.arch.inline_ptx(MAPA_PTX, write_only_types=[cutlass.Int32],
                                                          read_only_args=[local, cutlass.Int32(0)])
                            cute.arch.inline_ptx(ST_CLUSTER_PTX, read_only_args=[remote, acc[e]])
                    cute.arch.inline_ptx(CLUSTER_SYNC_PTX)
                if rank == 0:
                    if cutlass.const_expr(X > 1):
                        for r in cutlass.range_constexpr(X - 1):
                            part = cute.make_tensor(red + (r * CT + ct) * NA, cute.make_layout(NA))
                            for e in cutlass.range_constexpr(NA):
                                acc[e] = acc[e] + part[e]
                    out_t = cute.make_tensor(out, cute.make_layout(NT * n))
                    row0 = tile * cfg.rows + (wg - 1) * 64 + warp * 16
                    for e in cutlass.range_constexpr(NA):
                        tok = 8 * (e // 4) + 2 * q + e % 2
                        row = row0 + g + 8 * ((e % 4) // 2)
                        out_t[tok * n + row] = acc[e].to(cutlass.BFloat16)

        @cute.jit
        def __call__(self, w: cute.Pointer, x: cute.Pointer, out: cute.Pointer, n: cutlass.Int32, k: cutlass.Int32):
            cfg = self.cfg
            self.kernel.set_name_prefix(f"skinny_{cfg.name}", remove_cutlass_symbol=True, keep_mangled_name=False)
            wt = cute.make_tensor(w, cute.make_layout((n, k), stride=(k, 1)))
            xt = cute.make_tensor(x, cute.make_layout((cfg.nt, k), stride=(k, 1)))
            wdesc = create_tensor_map_tiled_from_view(wt, box_dims=(cfg.rows, KB), stride_order=(1, 0),
                                                      swizzle=TensorMapSwizzle.s128b)
            xdesc = create_tensor_map_tiled_from_view(xt, box_dims=(cfg.nt, KB), stride_order=(1, 0),
                                                      swizzle=TensorMapSwizzle.s128b)
            cluster = {"cluster": (cfg.split, 1, 1)} if cfg.split > 1 else {}
            self.kernel(wdesc, xdesc, out, n, k).launch(grid=(n // cfg.rows * cfg.split, 1, 1),
                                                         block=(cfg.threads, 1, 1), smem=cfg.smem, **cluster)

    out_dir.mkdir(parents=True, exist_ok=True)
    table = {}
    ptr = lambda: make_ptr(cutlass.BFloat16, 0, AddressSpace.gmem, assumed_align=16)  # noqa: E731
    for cfg in variants():
        if only and only not in cfg.name:
            continue
        compiled = cute.compile(WgmmaV4(cfg), ptr(), ptr(), ptr(), cutlass.Int32(0), cutlass.Int32(0),
                                options=compile_options("sm_90a", str(out_dir)))
        cubin = bytes(compiled.artifacts.CUBIN)
        (out_dir / f"{cfg.name}.cubin").write_bytes(cubin)
        table[cfg.name] = {"nt": cfg.nt, "rows": cfg.rows, "threads": cfg.threads, "smem": cfg.smem,
                           "split": cfg.split, "symbol": f"skinny_{cfg.name}_0"}
        print(cfg.name, len(cubin), "bytes", flush=True)
    (out_dir / "variants.json").write_text(json.dumps(table, indent=1, sort_keys=True))


if __name__ == "__main__":
    if len(sys.argv) >= 3 and sys.argv[1] == "compile":
        build(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        print(__doc__)
        sys.exit(2)
