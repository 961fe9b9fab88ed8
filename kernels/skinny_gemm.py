"""The skinny GEMM: C[M, N] = A[M, K] @ W[N, K]^T (+ residual), BF16 in/out, fp32 accumulate.

Order: config (imported: ``skinny_gemm.kernels.config``), kernel class (host
launcher, device body), compile entry.

Kernel-parameter ABI: raw pointers and Int32 only (they become plain 8- and 4-byte C params in
declaration order; a dynamic-layout tensor would become a by-value struct of varying size), so every
variant takes the same 40 bytes: ``a, w, out, residual`` (u64 each; residual
may be 0 for none) then ``n, k`` (i32). ``k`` is ignored by static-K variants
but kept so one launch record format serves every variant. A ``bias`` variant
reads its 4th pointer as a bias vector of N bf16 (0 = none) instead.

Tail (``tail``): after the whole K trips, one more trip issues only the loads
that lie inside K; columns past N load row N - 1 and are never stored.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .common import Launcher, compile_kernel, next_group, prologue, store_output, wait_previous_grid
from .config import TAIL_K_GRAIN, KernelConfig

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
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        kt = tidx % KT  # this thread's slot along K inside its group
        grp = tidx // KT  # column group
        col0 = bidx * cfg.cols_per_cta + grp * COLS
        if cutlass.const_expr(cfg.static_k > 0):
            kk = cfg.static_k
        elif cutlass.const_expr(cfg.tail):
            kk = cute.assume(k, divby=TAIL_K_GRAIN)
        else:
            kk = cute.assume(k, divby=cfg.k_step)

        if cutlass.const_expr(cfg.persist > 0):
            self.walk(a, w, out, residual, n, kk, kt, grp, bidx)
        else:
            acc = cute.make_rmem_tensor((M, COLS), cutlass.Float32)  # (M, COLS) fp32 partial sums
            acc.fill(0.0)
            step = KT * VEC * UNROLL
            first = 0
            if cutlass.const_expr(cfg.early):
                # Trip 0's weight is in flight while the previous kernel drains.
                w0 = self.load_weight(w, kk, col0, kt * VEC, n)
                wait_previous_grid(cfg)
                self.fma(acc, w0, self.load_tokens(a, kk, kt * VEC))
                first = 1
            else:
                prologue(cfg, w, tidx, bidx * cfg.cols_per_cta, kk, n)
            if cutlass.const_expr(cfg.static_k > 0):
                for trip in cutlass.range_constexpr(first, cfg.static_k // step):
                    self.mac(a, w, acc, kk, col0, kt * VEC + trip * step, n)
            else:
                for trip in cutlass.range(first, kk // step):
                    self.mac(a, w, acc, kk, col0, kt * VEC + trip * step, n)
            if cutlass.const_expr(cfg.tail):
                self.tail_trip(a, w, acc, kk, col0, kt * VEC + kk // step * step, n)
            self.reduce_store(acc, out, residual, n, col0, kt, grp)

    @cute.jit
    def walk(self, a, w, out, residual, n, kk, kt, grp, bidx):
        """``persist``: this CTA's row groups, ``gridDim`` apart; each group's first trip is loaded one group ahead."""
        cfg = self.cfg
        COLS, VEC = cfg.cols, cfg.vec
        step = cfg.k_threads * VEC * cfg.unroll
        groups = n // cfg.cols_per_cta
        nct, _, _ = cute.arch.grid_dim()
        wbuf = cute.make_rmem_tensor(
            (cfg.unroll * COLS * VEC,), cutlass.BFloat16
        )  # (UNROLL x COLS x VEC) bf16: next trip 0
        self.stash(wbuf, self.load_weight(w, kk, bidx * cfg.cols_per_cta + grp * COLS, kt * VEC, n))
        wait_previous_grid(cfg)
        for g in cutlass.range(bidx, groups, nct, unroll=1):
            col0 = g * cfg.cols_per_cta + grp * COLS
            wcur = self.unstash(wbuf)
            gn = next_group(g, nct, groups)
            self.stash(wbuf, self.load_weight(w, kk, gn * cfg.cols_per_cta + grp * COLS, kt * VEC, n))
            acc = cute.make_rmem_tensor((cfg.m, COLS), cutlass.Float32)  # (M, COLS) fp32 partial sums
            acc.fill(0.0)
            self.fma(acc, wcur, self.load_tokens(a, kk, kt * VEC))
            for trip in cutlass.range(1, kk // step):
                self.mac(a, w, acc, kk, col0, kt * VEC + trip * step, n)
            self.reduce_store(acc, out, residual, n, col0, kt, grp)
            if cutlass.const_expr(cfg.k_threads > WARP):
                cute.arch.sync_threads()  # the next group rewrites the reduction's shared memory

    @cute.jit
    def stash(self, wbuf, frag):
        """Keep one trip's weight vectors ([UNROLL][COLS] of (VEC,)) in the register buffer ``wbuf``."""
        cfg = self.cfg
        for u in cutlass.range_constexpr(cfg.unroll):
            for j in cutlass.range_constexpr(cfg.cols):
                off = (u * cfg.cols + j) * cfg.vec
                cute.make_tensor(wbuf.iterator + off, cute.make_layout(cfg.vec)).store(frag[u][j])

    @cute.jit
    def unstash(self, wbuf):
        """The trip kept by ``stash``, as [UNROLL][COLS] of (VEC,) bf16 vectors."""
        cfg = self.cfg
        return [
            [
                cute.make_tensor(wbuf.iterator + (u * cfg.cols + j) * cfg.vec, cute.make_layout(cfg.vec)).load()
                for j in range(cfg.cols)
            ]
            for u in range(cfg.unroll)
        ]

    @cute.jit
    def reduce_store(self, acc, out, residual, n, col0, kt, grp):
        """Sum the group's K slots (lanes, then warps through shared memory) and store its M x COLS outputs."""
        cfg = self.cfg
        M, COLS, KT = cfg.m, cfg.cols, cfg.k_threads
        NWARP_K = max(KT // WARP, 1)
        OUTS = M * COLS
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
                    store_output(cfg, out, residual, has_res, total, i // COLS, col0 + i % COLS, n)
        else:
            for i in cutlass.range_constexpr(OUTS):
                if kt == i % KT:
                    store_output(cfg, out, residual, has_res, acc[i // COLS, i % COLS], i // COLS, col0 + i % COLS, n)

    @cute.jit
    def mac(self, a, w, acc, kk, col0, koff, n):
        """One K trip: issue every W and A load of the trip first, then the FMAs."""
        wfrag = self.load_weight(w, kk, col0, koff, n)
        self.fma(acc, wfrag, self.load_tokens(a, kk, koff))

    @cute.jit
    def load_weight(self, w, kk, col0, koff, n):
        """Issue one trip's weight loads: [UNROLL][COLS] of (VEC,) bf16 vectors."""
        cfg = self.cfg
        vlay = cute.make_layout(cfg.vec)
        return [
            [
                cute.make_tensor(
                    w + cute.assume(self.row(col0 + j, n) * kk + koff + u * cfg.k_threads * cfg.vec, divby=cfg.vec),
                    vlay,
                ).load()
                for j in range(cfg.cols)
            ]
            for u in range(cfg.unroll)
        ]

    @cute.jit
    def row(self, col, n):
        """The weight row a column loads: itself, or with ``tail`` row N-1 past N (read, never stored)."""
        r = col
        if cutlass.const_expr(self.cfg.tail):
            r = cutlass.min(col, n - 1)
        return r

    @cute.jit
    def tail_trip(self, a, w, acc, kk, col0, koff, n):
        """``tail``: the K trip past the last full one; each unrolled load is taken only where it lies inside K.

        K is a multiple of 8 and a load is VEC (2, 4 or 8) elements at a multiple of VEC, so a load is
        wholly inside K or wholly past it: nothing past K is read, and no masked value meets a product.
        """
        cfg = self.cfg
        vlay = cute.make_layout(cfg.vec)
        for u in cutlass.range_constexpr(cfg.unroll):
            ku = koff + u * cfg.k_threads * cfg.vec
            if ku < kk:
                wv = [
                    cute.make_tensor(w + cute.assume(self.row(col0 + j, n) * kk + ku, divby=cfg.vec), vlay)
                    .load()
                    .to(cutlass.Float32)
                    for j in range(cfg.cols)
                ]
                av = [
                    cute.make_tensor(a + cute.assume(m * kk + ku, divby=cfg.vec), vlay).load().to(cutlass.Float32)
                    for m in range(cfg.m)
                ]
                for j in cutlass.range_constexpr(cfg.cols):
                    for m in cutlass.range_constexpr(cfg.m):
                        s = acc[m, j]
                        for e in cutlass.range_constexpr(cfg.vec):
                            s = s + wv[j][e] * av[m][e]
                        acc[m, j] = s

    @cute.jit
    def load_tokens(self, a, kk, koff):
        """Issue one trip's token loads: [UNROLL][M] of (VEC,) bf16 vectors."""
        cfg = self.cfg
        vlay = cute.make_layout(cfg.vec)
        return [
            [
                cute.make_tensor(
                    a + cute.assume(m * kk + koff + u * cfg.k_threads * cfg.vec, divby=cfg.vec), vlay
                ).load()
                for m in range(cfg.m)
            ]
            for u in range(cfg.unroll)
        ]

    @cute.jit
    def fma(self, acc, wfrag, afrag):
        """acc[m, j] += the trip's weight vectors times its token vectors, in fp32."""
        cfg = self.cfg
        for u in cutlass.range_constexpr(cfg.unroll):
            af = [afrag[u][m].to(cutlass.Float32) for m in range(cfg.m)]
            for j in cutlass.range_constexpr(cfg.cols):
                wf = wfrag[u][j].to(cutlass.Float32)
                for m in cutlass.range_constexpr(cfg.m):
                    s = acc[m, j]
                    for e in cutlass.range_constexpr(cfg.vec):
                        s = s + wf[e] * af[m][e]
                    acc[m, j] = s


def compile_variant(cfg: KernelConfig, arch: str, dump_dir: str) -> bytes:
    """Compile entry: AOT-compile one "simt" variant for ``arch`` and return the cubin bytes."""
    return compile_kernel(SkinnyGemm(cfg), arch, dump_dir, cfg.name)
