"""The tensor-core skinny GEMM: weight rows are the MMA's 16-wide side, tokens its 8-wide side.

Order: config (imported: ``skinny_gemm.runtime.config``, kind "mma"), kernel
class (host launcher, device body), compile entry.

Why: the SIMT kernel pays scalar FMAs and conversions for every token, so its
cost grows with M (docs/perf.md). ``mma.sync.m16n8k16`` (bf16 in, fp32
accumulate) takes 16 weight rows x 8 tokens per instruction: M = 1..8 cost the
same, and no bf16->fp32 conversion is issued at all.

K permutation trick: the MMA only needs A and B to agree on which k each
register slot holds. Each thread loads 16 contiguous bytes (8 k) of a weight
row and 16 bytes of its token's row at the same k, and feeds the first half to
one MMA and the second half to the next, so every global load is 16 bytes wide.

Same kernel-parameter ABI as kernels/skinny_gemm.py.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ..runtime.config import KernelConfig
from .common import compile_kernel, prologue, store_output

WARP = 32
# Placeholders are written {$r0}; the outer braces are PTX's vector operands.
MMA_PTX = (
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
    "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, {{$r6}, {$r7}, {$r8}, {$r9}};"
)


class SkinnyMma:
    """One compiled variant per KernelConfig of kind "mma".

    Warps of a CTA: ``k_threads // 32`` split K into contiguous ranges, and
    ``threads // k_threads`` groups each own ``cols`` weight rows (``cols / 16``
    MMA row tiles).
    """

    def __init__(self, cfg: KernelConfig):
        cfg.check()
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        a: cute.Pointer,
        w: cute.Pointer,
        out: cute.Pointer,
        residual: cute.Pointer,
        n: cutlass.Int32,
        k: cutlass.Int32,
    ):
        """Host launcher: grid = n / columns per CTA, one block of cfg.threads."""
        self.kernel.set_name_prefix(f"skinny_{self.cfg.name}", remove_cutlass_symbol=True, keep_mangled_name=False)
        self.kernel(a, w, out, residual, n, k).launch(
            grid=(n // self.cfg.cols_per_cta, 1, 1), block=(self.cfg.threads, 1, 1)
        )

    @cute.kernel
    def kernel(
        self,
        a: cute.Pointer,
        w: cute.Pointer,
        out: cute.Pointer,
        residual: cute.Pointer,
        n: cutlass.Int32,
        k: cutlass.Int32,
    ):
        """Device body: MMA over this warp's K range, reduce the K-split warps in smem, store."""
        cfg = self.cfg
        M, UNROLL = cfg.m, cfg.unroll
        TILES = cfg.cols // 16
        WK = cfg.k_threads // WARP
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        wk = warp % WK  # this warp's K range
        grp = warp // WK  # this warp's row group
        r = lane // 4  # MMA row within a tile, and the token this lane feeds
        q = lane % 4  # which 8-k slice of a 32-k step this lane loads
        row0 = bidx * cfg.cols_per_cta + grp * cfg.cols
        if cutlass.const_expr(cfg.static_k > 0):
            kk = cfg.static_k
        else:
            kk = cute.assume(k, divby=cfg.k_step)
        prologue(cfg, w, tidx, bidx * cfg.cols_per_cta, kk)

        # Lanes whose token is padding (r >= M) read token 0 and zero it: all-ones
        # mask for real tokens, zero for padding, without a branch.
        keep = ((cutlass.Int32(M - 1) - r) >> 31) ^ cutlass.Int32(-1)
        tok = r & keep
        a32 = cute.recast_ptr(a, dtype=cutlass.Int32)
        w32 = cute.recast_ptr(w, dtype=cutlass.Int32)
        v4 = cute.make_layout(4)

        acc = cute.make_rmem_tensor((TILES, 4), cutlass.Float32)  # (tile, c0..c3) MMA accumulators
        acc.fill(0.0)
        span = kk // WK  # contiguous K range of one warp
        kstart = wk * span + q * 8
        if cutlass.const_expr(cfg.static_k > 0):
            for trip in cutlass.range_constexpr(cfg.static_k // cfg.k_step):
                self.mma_trip(a32, w32, acc, kk, row0, tok, keep, kstart + trip * (UNROLL * 32), v4)
        else:
            for trip in cutlass.range(kk // cfg.k_step):
                self.mma_trip(a32, w32, acc, kk, row0, tok, keep, kstart + trip * (UNROLL * 32), v4)

        has_res = residual.toint() != 0
        if cutlass.const_expr(WK > 1):
            # (groups, WK, TILES * 4, 32) fp32: each K-split warp's accumulators.
            sRed = cute.make_tensor(
                cute.arch.alloc_smem(cutlass.Float32, cfg.groups * WK * TILES * 4 * WARP, alignment=16),
                cute.make_layout((cfg.groups, WK, TILES * 4, WARP), stride=(WK * TILES * 4 * WARP, TILES * 4 * WARP, WARP, 1)),
            )
            for i in cutlass.range_constexpr(TILES * 4):
                sRed[grp, wk, i, lane] = acc[i // 4, i % 4]
            cute.arch.sync_threads()
            if wk == 0:
                for i in cutlass.range_constexpr(TILES * 4):
                    total = acc[i // 4, i % 4]
                    for j in cutlass.range_constexpr(1, WK):
                        total = total + sRed[grp, j, i, lane]
                    acc[i // 4, i % 4] = total
        if wk == 0:
            for i in cutlass.range_constexpr(TILES * 4):
                token = q * 2 + (i % 2)
                if token < M:
                    row = row0 + (i // 4) * 16 + r + ((i % 4) // 2) * 8
                    store_output(out, residual, has_res, acc[i // 4, i % 4], token, row, n)

    @cute.jit
    def mma_trip(self, a32, w32, acc, kk, row0, tok, keep, kpos, v4):
        """UNROLL 32-k steps: issue every 16-byte load first, then two MMAs per tile and step."""
        cfg = self.cfg
        TILES = cfg.cols // 16
        r_half = kk // 2  # a weight or token row, in 32-bit words
        xs = []  # [UNROLL] (4,) i32: this lane's token row, 8 k
        ws = []  # [UNROLL][TILES][2] (4,) i32: weight rows r and r+8 of each tile, 8 k
        lane_row = cute.arch.lane_idx() // 4
        for u in cutlass.range_constexpr(cfg.unroll):
            kw = (kpos + u * 32) // 2
            xs.append(cute.make_tensor(a32 + cute.assume(tok * r_half + kw, divby=4), v4).load())
            ws.append(
                [
                    [
                        cute.make_tensor(
                            w32 + cute.assume((row0 + t * 16 + h * 8 + lane_row) * r_half + kw, divby=4), v4
                        ).load()
                        for h in range(2)
                    ]
                    for t in range(TILES)
                ]
            )
        for u in cutlass.range_constexpr(cfg.unroll):
            b = [xs[u][e] & keep for e in range(4)]
            for t in cutlass.range_constexpr(TILES):
                lo, hi = ws[u][t]
                for half in cutlass.range_constexpr(2):
                    c = cute.arch.inline_ptx(
                        MMA_PTX,
                        write_only_types=[cutlass.Float32] * 4,
                        read_only_args=[
                            lo[2 * half], hi[2 * half], lo[2 * half + 1], hi[2 * half + 1],
                            b[2 * half], b[2 * half + 1],
                            acc[t, 0], acc[t, 1], acc[t, 2], acc[t, 3],
                        ],
                    )
                    for e in cutlass.range_constexpr(4):
                        acc[t, e] = c[e]


def compile_variant(cfg: KernelConfig, arch: str, dump_dir: str) -> bytes:
    """Compile entry: AOT-compile one "mma" variant for ``arch`` and return the cubin bytes."""
    return compile_kernel(SkinnyMma(cfg), arch, dump_dir, cfg.name)
