"""The bulk-copy skinny GEMM: the weight streams into a shared-memory ring by ``cp.async.bulk``, tensor cores multiply.

Order: config (imported: ``skinny_gemm.kernels.config``, kind "bulk"), kernel
class (host launcher, device body), compile entry.

Why: the register-pipelined mma kernel holds at most a few
loads per warp in flight (50 registers cap it at half occupancy, by ncu on the H200), and only
those few are issued before the PDL wait. Bulk copies land in shared memory,
so the bytes in flight cost no registers: one thread issues a whole chunk of
the CTA's rows per copy group, and the first ``stages`` chunks go out before
``griddepcontrol.wait``, while the previous kernel drains.

Ring: chunk c (``k_step`` = warps x 32 x ``unroll`` k of all ``cols`` rows)
lands in stage c % stages; its "full" mbarrier completes on the copies' byte
count. Every warp multiplies its ``unroll`` 32-k steps of the chunk and
arrives on the stage's "empty" mbarrier (every thread: an arrive releases
only its own reads); thread 0 waits for that one and
refills the stage with chunk c + stages, while the other warps go on. (A CTA
sync per chunk instead starved the ring: only 2-stage rings of the largest chunks won.) Row r of a stage sits at
r * (chunk bytes + 64): the pad puts the 8 lanes of each 128-byte phase of a
fragment read on distinct banks.

MMA fragments as in kernels/skinny_mma.py (tokens the 16-row A side, weight
rows the 8-wide B side, the K permutation trick): lane (g, q) reads 16 bytes
of row g of each 8-row tile at k = 8q of each step, from shared memory.

Same kernel-parameter ABI as kernels/skinny_gemm.py.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .common import Launcher, compile_kernel, wait_previous_grid
from .config import BULK_ROW_PAD, MMA_ROWS, KernelConfig
from .skinny_mma import LDS_PTX, WARP, mma_pair, mma_zero, reduce_and_store

BULK_COPY_PTX = "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [{$r0}], [{$r1}], {$r2}, [{$r3}];"


class SkinnyBulk(Launcher):
    """One compiled variant per KernelConfig of kind "bulk": one CTA per ``cols`` rows, its warps split each chunk's K."""

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
        """Device body: fill the ring before the PDL wait, then multiply chunk by chunk, reduce, store."""
        cfg = self.cfg
        M, S = cfg.m, cfg.stages
        TILES = cfg.cols // MMA_ROWS
        KC = cfg.k_step
        PITCH = KC * 2 + BULK_ROW_PAD  # bytes per row of a stage
        STAGE = cfg.cols * PITCH
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        wk = tidx // WARP
        lane = tidx % WARP
        g = lane // 4
        q = lane % 4
        row0 = bidx * cfg.cols
        if cutlass.const_expr(cfg.static_k > 0):
            kk = cfg.static_k
        else:
            kk = cute.assume(k, divby=KC)
        chunks = kk // KC
        keep = ((cutlass.Int32(M - 1) - g) >> 31) ^ cutlass.Int32(-1)
        r_half = kk // 2
        a_lane = cute.recast_ptr(a, dtype=cutlass.Int32) + cute.assume((g & keep) * r_half + q * 4, divby=4)

        ring = cute.arch.alloc_smem(cutlass.Int8, S * STAGE, alignment=128)  # (stage, row, PITCH) bytes
        bars = cute.arch.alloc_smem(cutlass.Int64, S, alignment=8)  # per stage: full (copies landed)
        empty = cute.arch.alloc_smem(cutlass.Int64, S, alignment=8)  # per stage: every warp done reading it
        if tidx == 0:
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(bars + s, 1)
                cute.arch.mbarrier_init(empty + s, cfg.k_threads)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if tidx == 0:
            for s in cutlass.range_constexpr(S):
                if s < chunks:
                    self.issue(w, ring, bars, row0, kk, s, s)
        wait_previous_grid(cfg)

        acc = cute.make_rmem_tensor((TILES, 4), cutlass.Float32)  # (tile, c0..c3) MMA accumulators
        acc.fill(0.0)
        # This lane's first byte in a stage: row g, k = (wk * unroll) * 32 + 8q.
        lane_off = g * PITCH + (wk * cfg.unroll * 32 + q * 8) * 2
        zero = mma_zero()
        for c in cutlass.range(chunks, unroll=1):
            s = c % S
            # The tokens do not depend on the ring: their loads go out before the wait.
            xs = []
            for u in cutlass.range_constexpr(cfg.unroll):
                kw = (c * KC + (wk * cfg.unroll + u) * 32) // 2  # this step's first token word
                xs.append(cute.make_tensor(a_lane + cute.assume(kw, divby=4), cute.make_layout(4)).load())
            cute.arch.mbarrier_wait(bars + s, (c // S) & 1)
            for u in cutlass.range_constexpr(cfg.unroll):
                for t in cutlass.range_constexpr(TILES):
                    addr = ring + (s * STAGE + t * MMA_ROWS * PITCH + lane_off + u * 64)
                    v = cute.arch.inline_ptx(
                        LDS_PTX, write_only_types=[cutlass.Int32] * 4, read_only_args=[addr.toint()]
                    )
                    mma_pair(acc, t, [xs[u][e] & keep for e in range(4)], v, zero)
            # Release the stage: every thread arrives (an arrive releases only its own
            # shared-memory reads), and only thread 0 waits for the slowest warp
            # before refilling it; the other warps go on to the chunks already landed.
            cute.arch.mbarrier_arrive(empty + s)
            if tidx == 0:
                if c + S < chunks:
                    cute.arch.mbarrier_wait(empty + s, (c // S) & 1)
                    self.issue(w, ring, bars, row0, kk, c + S, s)

        reduce_and_store(cfg, acc, 0, wk, lane, row0, out, residual, n, 0)

    @cute.jit
    def issue(self, w, ring, bars, row0, kk, chunk, stage):
        """Thread 0: expect the chunk's bytes on the stage's mbarrier, then one bulk copy per row."""
        cfg = self.cfg
        KC = cfg.k_step
        PITCH = KC * 2 + BULK_ROW_PAD
        bar = bars + stage
        cute.arch.mbarrier_arrive_and_expect_tx(bar, cfg.cols * KC * 2)
        for r in cutlass.range_constexpr(cfg.cols):
            src = w + cute.assume((row0 + r) * kk + chunk * KC, divby=8)
            dst = ring + (stage * cfg.cols * PITCH + r * PITCH)
            cute.arch.inline_ptx(
                BULK_COPY_PTX,
                read_only_args=[dst.toint(), src.toint(), cutlass.Int32(KC * 2), bar.toint()],
            )


def compile_variant(cfg: KernelConfig, arch: str, dump_dir: str) -> bytes:
    """Compile entry: AOT-compile one "bulk" variant for ``arch`` and return the cubin bytes."""
    return compile_kernel(SkinnyBulk(cfg), arch, dump_dir, cfg.name)
