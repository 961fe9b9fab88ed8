"""The skinny GEMM: C[M, N] = A[M, K] @ W[N, K]^T (+ residual), BF16 in/out, fp32 accumulate.

Order: config (imported: ``skinny_gemm.runtime.config``), kernel class (host
launcher, device body), compile entry.

Kernel-parameter ABI (DESIGN.md): raw pointers and Int32 only, so every
variant takes the same 40 bytes: ``a, w, out, residual`` (u64 each; residual
may be 0 for none) then ``n, k`` (i32). ``k`` is ignored by static-K variants
but kept so one launch record format serves every variant.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from ..runtime.config import KernelConfig
from .common import Launcher, compile_kernel, prologue, store_output

WARP = 32


class SkinnyGemm(Launcher):
    """One compiled variant per KernelConfig; M, the split and the loop shape are baked in."""

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
        """Device body: stream W once, FMA against every token, reduce, store."""
        cfg = self.cfg
        M, COLS, VEC, UNROLL, KT = cfg.m, cfg.cols, cfg.vec, cfg.unroll, cfg.k_threads
        NWARP_K = max(KT // WARP, 1)
        OUTS = M * COLS
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        kt = tidx % KT  # this thread's slot along K inside its group
        grp = tidx // KT  # column group
        col0 = bidx * cfg.cols_per_cta + grp * COLS
        if cutlass.const_expr(cfg.static_k > 0):
            kk = cfg.static_k
        else:
            kk = cute.assume(k, divby=cfg.k_step)

        prologue(cfg, w, tidx, bidx * cfg.cols_per_cta, kk)

        acc = cute.make_rmem_tensor((M, COLS), cutlass.Float32)  # (M, COLS) fp32 partial sums
        acc.fill(0.0)
        step = KT * VEC * UNROLL
        if cutlass.const_expr(cfg.static_k > 0):
            for trip in cutlass.range_constexpr(cfg.static_k // step):
                self.mac(a, w, acc, kk, col0, kt * VEC + trip * step)
        else:
            for trip in cutlass.range(kk // step):
                self.mac(a, w, acc, kk, col0, kt * VEC + trip * step)

        # Butterfly over the group's lanes: afterwards every lane holds its warp's sum.
        lanes = min(KT, WARP)
        for i in cutlass.range_constexpr(OUTS):
            acc[i // COLS, i % COLS] = cute.arch.warp_reduction(
                acc[i // COLS, i % COLS], lambda x, y: x + y, threads_in_group=lanes
            )
        has_res = residual.toint() != 0
        if cutlass.const_expr(NWARP_K > 1):
            # (groups, NWARP_K, OUTS) fp32: one partial per warp of a group.
            sRed = cute.make_tensor(
                cute.arch.alloc_smem(cutlass.Float32, cfg.groups * NWARP_K * OUTS, alignment=16),
                cute.make_layout((cfg.groups, NWARP_K, OUTS), stride=(NWARP_K * OUTS, OUTS, 1)),
            )
            lane = kt % WARP
            wk = kt // WARP
            for i in cutlass.range_constexpr(OUTS):
                if lane == i % WARP:
                    sRed[grp, wk, i] = acc[i // COLS, i % COLS]
            cute.arch.sync_threads()
            for i in cutlass.range_constexpr(OUTS):
                if kt == i % KT:
                    total = cutlass.Float32(0.0)
                    for q in cutlass.range_constexpr(NWARP_K):
                        total = total + sRed[grp, q, i]
                    store_output(out, residual, has_res, total, i // COLS, col0 + i % COLS, n)
        else:
            for i in cutlass.range_constexpr(OUTS):
                if kt == i % KT:
                    store_output(out, residual, has_res, acc[i // COLS, i % COLS], i // COLS, col0 + i % COLS, n)

    @cute.jit
    def mac(self, a, w, acc, kk, col0, koff):
        """One K trip: issue every W and A load of the trip first, then the FMAs."""
        cfg = self.cfg
        M, COLS, VEC, UNROLL, KT = cfg.m, cfg.cols, cfg.vec, cfg.unroll, cfg.k_threads
        vlay = cute.make_layout(VEC)
        wfrag = []  # [UNROLL][COLS] of (VEC,) bf16 vectors
        afrag = []  # [UNROLL][M] of (VEC,) bf16 vectors
        for u in cutlass.range_constexpr(UNROLL):
            ku = koff + u * KT * VEC
            wfrag.append(
                [
                    cute.make_tensor(w + cute.assume((col0 + j) * kk + ku, divby=VEC), vlay).load()
                    for j in range(COLS)
                ]
            )
            afrag.append(
                [
                    cute.make_tensor(a + cute.assume(m * kk + ku, divby=VEC), vlay).load()
                    for m in range(M)
                ]
            )
        for u in cutlass.range_constexpr(UNROLL):
            af = [afrag[u][m].to(cutlass.Float32) for m in range(M)]
            for j in cutlass.range_constexpr(COLS):
                wf = wfrag[u][j].to(cutlass.Float32)
                for m in cutlass.range_constexpr(M):
                    s = acc[m, j]
                    for e in cutlass.range_constexpr(VEC):
                        s = s + wf[e] * af[m][e]
                    acc[m, j] = s


def compile_variant(cfg: KernelConfig, arch: str, dump_dir: str) -> bytes:
    """Compile entry: AOT-compile one "simt" variant for ``arch`` and return the cubin bytes."""
    return compile_kernel(SkinnyGemm(cfg), arch, dump_dir, cfg.name)
