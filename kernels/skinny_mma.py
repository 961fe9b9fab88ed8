"""The tensor-core skinny GEMM: tokens are the MMA's 16-row side, weight rows its 8-wide side.

Order: config (imported: ``skinny_gemm.kernels.config``, kind "mma"), kernel
class (host launcher, device body), compile entry.

Why: the SIMT kernel pays scalar FMAs and conversions for every token, so its
cost grows with M (docs/perf.md). ``mma.sync.m16n8k16`` (bf16 in, fp32
accumulate) takes 8 weight rows x 16 token rows per instruction: M = 1..8 cost
the same, and no bf16->fp32 conversion is issued at all. Token rows 8..15 of
the A tile are zero; the tensor cores have throughput to spare, and in return a
lane's 16-byte weight load *is* its B fragment: both B registers of an MMA hold
the same weight row, so the loaded registers feed HMMA without a move, and
nothing but loads in flight occupies the pipeline's registers.

Fragment mapping (PTX ISA m16n8k16 layouts, g = lane / 4, q = lane % 4):
lane (g, q) loads 16 bytes (8 k) of weight row g of each 8-row tile and of
token g, at k = 8q .. 8q+7 of every 32-k step. Words 0, 1 feed the first MMA,
words 2, 3 the second: A = {x[2h], 0, x[2h+1], 0} (token g in row g, k slots
2q, 2q+1 and 2q+8, 2q+9; rows g+8 zero), B = {w[2h], w[2h+1]} (column g, the
same slots). Both sides map slot 2q+e to k 8q+4h+e and slot 2q+8+e to
8q+4h+2+e, so they agree on every k (the "K permutation trick"), and all 16
bytes of every load are used. The accumulator's c0, c1 are token g against
weight rows 2q, 2q+1 of the tile; c2, c3 belong to the zero rows.

Slices (``slices`` S > 1; measured in docs/perf.md "What won"): B column j is weight row j // S
at K slice j % S, and A row i is token i // S at slice i % S, where slice s
is the 32 k at offset 32s of every 32S-k block. A lane still loads 16 bytes
of its B column's row and of its A rows' tokens at one k, so the operands
still agree on every k. Only the products of matching slices are partial
sums of an output; the epilogue adds each output's S slices and the warps'
K ranges in shared memory. A tile is then 8 / S rows. A warp load covers
64S contiguous bytes of each of its rows (one row x 512 B at S = 8), and a
CTA can be as small as one row: the SIMT kernel's grain, on tensor cores.
The A side holds M x S rows, so M x S <= 16; past 8 rows a lane loads a
second token (A row g + 8).

K loop: each warp streams its own contiguous K range in stages of ``unroll``
32-k steps through ``stages`` register buffers: stage s+stages-1 is loaded
before stage s is multiplied, so a warp always has stages-1 stages of loads in
flight while it waits for the oldest one; the loop is unrolled ``stages`` times
so every buffer index is static (a runtime index would put the buffers in
local memory). The first stages-1 weight loads go out before the PDL wait.

M up to 16 (unsliced): past 8 tokens each lane also loads token g + 8 into A
rows 8..15, and the accumulator's c2, c3 are its outputs.

Tail (``tail``): the warps split only K's whole K steps; the rest goes in
32 x slices-k steps dealt to the warps in turn, each lane's 8 k either inside K
or replaced by zero words (a bitwise select after a load of the row's K = 0).
Rows past N load row N - 1 and are never stored.

Ring (``ring``): the stages live in shared memory instead of registers. Each
lane copies the same 16-byte words by ``cp.async`` (weight: L2 only, with the
config's fetch hint; tokens: through L1, which the other warps' copies hit)
into its own slots, one commit group per stage, and reads a stage back with
``ld.shared`` after ``cp.async.wait_group`` right before its MMAs. A lane reads
only what it copied itself, so no barrier is needed: the wait makes its own
copies visible to it, and a slot's refill is issued after the lane's own read
of it in program order (ptxas keeps that order, hoisting the copy just past the
read; its write lands a global round trip later). Slots (per warp: stage, step,
operand, lane) are 32 x 16 contiguous bytes per operand, so every copy and read
is 4 conflict-free wavefronts. Why: at M = 16 a lane's register stage holds 32
bytes of tokens per 16 of weight, so the register budget caps the weight in
flight at 2-8 stages; inside the served step those shallow pipelines lost 2-22
us per down_proj call on the H200, and deep rings (cuBLAS's and "wgmma"'s) none.
The tokens' copies cost shared-memory bandwidth (a write and a read of 32
bytes per 16 of weight at 8 weight rows per warp), so the ring wins with 16-64
rows per warp; tokens kept in registers, 1-3 stages ahead, lost (docs/perf.md).

Same kernel-parameter ABI as kernels/skinny_gemm.py (``bias``: the 4th pointer
is a bias vector of N bf16).
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .common import Launcher, compile_kernel, next_group, prefetch_weight, store_output, wait_previous_grid
from .config import MMA_K_STEP, MMA_ROWS, RING_SLOT, TAIL_K_GRAIN, KernelConfig

WARP = 32
# Placeholders are written {$r0}; the outer braces are PTX's vector operands.
MMA_PTX = (
    "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
    "{{$w0}, {$w1}, {$w2}, {$w3}}, {{$r0}, {$r1}, {$r2}, {$r3}}, {{$r4}, {$r5}}, {{$r6}, {$r7}, {$r8}, {$r9}};"
)


# The weight is read exactly once: the read-only path, no L1 allocation (the
# token tile, which every warp rereads, keeps L1 to itself), and an L2 fetch of
# cfg.fetch bytes per request, so the row's next steps may already be on their
# way from HBM (on the H200 128 B was faster than 256 B on some shapes, no hint on others).
def ldg_stream_ptx(fetch: int) -> str:
    """The weight load for a config's ``fetch`` (bytes of L2 fetch per request, 0 = no hint)."""
    return f"ld.global.nc.L1::no_allocate{l2_fetch(fetch)}.v4.u32 {{{{$w0}}, {{$w1}}, {{$w2}}, {{$w3}}}}, [{{$r0}}];"


def l2_fetch(fetch: int) -> str:
    """The L2 fetch-size qualifier of a weight load or copy (0: none)."""
    return f".L2::{fetch}B" if fetch else ""


# ``ring``: the same words copied into shared memory. The weight bypasses L1 (.cg) as the register path's
# no_allocate does; the tokens go through it (.ca), as the register path's plain loads do.
def cp_weight_ptx(fetch: int) -> str:
    """The weight's 16-byte cp.async for a config's ``fetch`` (0 = no hint)."""
    return f"cp.async.cg.shared.global{l2_fetch(fetch)} [{{$r0}}], [{{$r1}}], 16;"


CP_TOKEN_PTX = "cp.async.ca.shared.global [{$r0}], [{$r1}], 16;"
CP_COMMIT_PTX = "cp.async.commit_group;"
# (also kernels/skinny_bulk.py's fragment read)
LDS_PTX = "ld.shared.v4.u32 {{$w0}, {$w1}, {$w2}, {$w3}}, [{$r0}];"


class SkinnyMma(Launcher):
    """One compiled variant per KernelConfig of kind "mma".

    Warps of a CTA: ``k_threads // 32`` split K into contiguous ranges, and
    ``threads // k_threads`` groups each own ``cols`` weight rows (``cols * slices / 8``
    MMA tiles of ``8 / slices`` rows).
    """

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
        """Device body: pipelined MMA over this warp's K range, reduce the K-split warps in smem, store."""
        cfg = self.cfg
        M, D, S = cfg.m, cfg.stages, cfg.slices
        TILES = cfg.mma_tiles
        WK = cfg.k_threads // WARP
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        wk = warp % WK  # this warp's K range
        grp = warp // WK  # this warp's row group
        g = lane // 4  # weight row within a tile (B column), and this lane's token (A row)
        q = lane % 4  # which 8-k slice of a 32-k step this lane loads
        # Clusters are 1-D along x, so a cluster is `split` consecutive CTAs and its rank is bidx % split.
        if cutlass.const_expr(cfg.static_k > 0):
            kk = cfg.static_k
        elif cutlass.const_expr(cfg.tail):
            kk = cute.assume(k, divby=TAIL_K_GRAIN)
        else:
            kk = cute.assume(k, divby=cfg.k_step)
        r_half = kk // 2  # a weight or token row, in 32-bit words
        # The K the warps' ranges split: all of K, or (tail) its whole K steps; tail_steps takes the rest.
        krange = kk
        if cutlass.const_expr(cfg.tail):
            krange = kk // cfg.k_step * cfg.k_step
        rank = 0
        if cutlass.const_expr(cfg.split > 1):
            # Distributed shared memory may be written only once every CTA of the cluster
            # runs: this arrive is matched by the wait before the partial sums are sent,
            # so the K loop hides it.
            cute.arch.inline_ptx(CLUSTER_ARRIVE_PTX)
            rank = bidx % cfg.split
            row0 = bidx // cfg.split * cfg.cols_per_cta + grp * cfg.cols
            kc = kk // cfg.split  # this CTA's K range
            # This lane's first word: its K range starts at rank * kc + wk * kc / WK, its slice at 8q.
            koff = cute.assume((rank * kc + wk * (kc // WK) + q * 8) // 2, divby=4)
        elif cutlass.const_expr(S > 1):
            row0 = bidx * cfg.cols_per_cta + grp * cfg.cols
            # This lane's first word: its K range starts at wk * kk / WK, its slice g % S at 32 (g % S), then 8q.
            koff = cute.assume((wk * (krange // WK) + (g % S) * 32 + q * 8) // 2, divby=4)
        else:
            row0 = bidx * cfg.cols_per_cta + grp * cfg.cols
            # This lane's first word: its K range starts at wk * kk / WK, its slice at 8q.
            koff = cute.assume((wk * (krange // WK) + q * 8) // 2, divby=4)
        if cutlass.const_expr(S > 1):
            # B column g: row g // S; A rows g and g + 8: tokens g // S and (g + 8) // S, all at slice g % S.
            # Padding tokens (>= M) read token 0 and are zeroed by their mask, as in the unsliced branch.
            # (The A row g + 8 pointer is dead code unless token_loads is 2; ptxas drops it. Building it
            # in this order keeps the planned sliced cubins byte-identical to the ones tested on the H200.)
            # With token groups the A rows hold one group's MG tokens; group h's tokens start at token h * MG.
            MG = M // cfg.token_groups
            tok = g // S
            keep = ((cutlass.Int32(MG - 1) - tok) >> 31) ^ cutlass.Int32(-1)
            tok2 = (g + MMA_ROWS) // S
            keep2 = ((cutlass.Int32(MG - 1) - tok2) >> 31) ^ cutlass.Int32(-1)
            w_lane = cute.recast_ptr(w, dtype=cutlass.Int32) + cute.assume((row0 + g // S) * r_half + koff, divby=4)
            a_lane = cute.recast_ptr(a, dtype=cutlass.Int32) + cute.assume((tok & keep) * r_half + koff, divby=4)
            a_lane2 = cute.recast_ptr(a, dtype=cutlass.Int32) + cute.assume((tok2 & keep2) * r_half + koff, divby=4)
        else:
            # Lanes whose token is padding (g >= M) read token 0 and zero it: all-ones
            # mask for real tokens, zero for padding, without a branch.
            keep = ((cutlass.Int32(M - 1) - g) >> 31) ^ cutlass.Int32(-1)
            w_lane = cute.recast_ptr(w, dtype=cutlass.Int32) + cute.assume((row0 + g) * r_half + koff, divby=4)
            a_lane = cute.recast_ptr(a, dtype=cutlass.Int32) + cute.assume((g & keep) * r_half + koff, divby=4)
            if cutlass.const_expr(cfg.token_loads > 1):
                # m > 8: A row g + 8 is token g + 8 (or padding, read as token 0 and masked)
                tok2 = g + MMA_ROWS
                keep2 = ((cutlass.Int32(M - 1) - tok2) >> 31) ^ cutlass.Int32(-1)
                a_lane2 = cute.recast_ptr(a, dtype=cutlass.Int32) + cute.assume((tok2 & keep2) * r_half + koff, divby=4)
            else:
                keep2, a_lane2 = keep, a_lane  # unused: A rows 8..15 are zero
        # (pointer, mask) of A row g's token, then of A row g + 8's (read only when token_loads is 2), then
        # token groups 1.. as (A row g, A row g + 8) pointer pairs, MG tokens further each (same masks)
        more = []
        if cutlass.const_expr(cfg.token_groups > 1):
            more = [
                (a_lane + cute.assume(h * MG * r_half, divby=4), a_lane2 + cute.assume(h * MG * r_half, divby=4))
                for h in range(1, cfg.token_groups)
            ]
        tokens = (a_lane, keep, a_lane2, keep2, more)
        if cutlass.const_expr(cfg.tail):
            # Per tile, this lane's weight row from K = 0, clamped to N - 1: rows past N are read, never stored.
            R = MMA_ROWS // S
            w_rows = [
                cute.recast_ptr(w, dtype=cutlass.Int32)
                + cute.assume(cutlass.min(row0 + t * R + g // S, n - 1) * r_half, divby=4)
                for t in range(TILES)
            ]
            w_lane = [p + koff for p in w_rows]

        if cutlass.const_expr(cfg.ring):
            # (warp, stage buffer, step, operand, lane) 16-byte slots; operands: the tiles' weight words, then
            # the token loads'. This lane's slot 0; ring_slot adds (buffer, step, operand).
            ring = cute.arch.get_dyn_smem(cutlass.Int8, alignment=128)
            wbuf = ring + cute.assume(warp * cfg.ring_smem // (cfg.threads // WARP) + lane * RING_SLOT, divby=16)
            xbuf = wbuf  # unused: both operands live in the ring
        else:
            # (stage buffer, step, tile, word) i32: 8 k of weight row g (g // S with slices) per step and tile
            wbuf = cute.make_rmem_tensor((D, cfg.unroll, TILES, 4), cutlass.Int32)
            # (stage buffer, step, word) i32: per token group, 8 k of A row g's token, then (second load) of A
            # row g + 8's
            xbuf = cute.make_rmem_tensor(
                (cfg.x_stages, cfg.unroll, 4 * cfg.token_loads * cfg.token_groups), cutlass.Int32
            )
        # (token group x tile, c0..c3) MMA accumulators
        acc = cute.make_rmem_tensor((TILES * cfg.token_groups, 4), cutlass.Float32)
        acc.fill(0.0)

        if cutlass.const_expr(cfg.persist > 0):
            # row group 0's rows (as w_lane names them), this lane's first word
            w0 = cute.recast_ptr(w, dtype=cutlass.Int32) + cute.assume(
                (grp * cfg.cols + g // S) * r_half + koff, divby=4
            )
            self.walk(w0, tokens, wbuf, acc, r_half, grp, wk, lane, bidx, out, residual, n)
        else:
            prefetch_weight(cfg, w, tidx, bidx * cfg.cols_per_cta, kk, n)
            # The fill (every buffer but one), the trips, the peeled last trip: ``pipeline``'s order (the weight may
            # be read before the PDL wait, the tokens not; the last trip has no refill to guard).
            first, _, peeled = pipeline(D, cfg.x_stages)
            ops = (w_lane, tokens, wbuf, xbuf, acc, r_half)
            self.run(first, FILL, 0, ops)
            if cutlass.const_expr(cfg.static_k > 0):
                for t in cutlass.range_constexpr(cfg.static_k // cfg.k_step - 1):
                    self.trip(w_lane, tokens, wbuf, xbuf, acc, t, r_half)
            else:
                # unroll=1: the body already is D steps; ptxas unrolling it again spilled a loop counter.
                for t in cutlass.range(kk // cfg.k_step - 1, unroll=1):
                    self.trip(w_lane, tokens, wbuf, xbuf, acc, t, r_half)
            self.run(peeled, LAST, kk // cfg.k_step * D - 1, ops)
            if cutlass.const_expr(cfg.tail):
                self.tail_steps(w_rows, tokens, acc, kk, krange, koff, wk, g, q)

            if cutlass.const_expr(S > 1):
                reduce_slices_and_store(cfg, acc, grp, wk, lane, row0, out, residual, n)
            else:
                reduce_and_store(cfg, acc, grp, wk, lane, row0, out, residual, n, rank)

    @cute.jit
    def walk(self, w0, tokens, wbuf, acc, r_half, grp, wk, lane, bidx, out, residual, n):
        """``persist``: this CTA's row groups, ``gridDim`` apart, with every token of the warp's K range in registers.

        The tokens are loaded once, after the PDL wait (the first group's first stages go out before it), each
        step's in a register buffer of its own. Each group runs ``walk_order``: the register pipeline's refills,
        of which the last stages - 1 are the next group's first stages (past the CTA's last group: this group's
        rows again, L2 hits rather than a branch), so the weight stream does not stop for the epilogue. Every thread of a group
        sums some of its outputs (the sliced epilogue at any ``slices``: at 16 K-split warps, warp 0 alone adding
        them kept the rest at the barrier).
        """
        cfg = self.cfg
        D, STEPS = cfg.stages, cfg.warp_steps // cfg.unroll
        groups = n // cfg.cols_per_cta
        nct, _, _ = cute.arch.grid_dim()
        span = cfg.cols_per_cta * r_half  # words from one row group to the next
        # (stage, step, word) i32: per token group, 8 k of A row g's token (and of A row g + 8's), every stage
        xres = cute.make_rmem_tensor((STEPS, cfg.unroll, 4 * cfg.token_loads * cfg.token_groups), cutlass.Int32)
        # two reduction buffers, one per group parity: a group's partials land in the buffer the group before last
        # read, which every thread had left by the previous group's barrier, so one barrier per group does
        red = cute.arch.alloc_smem(cutlass.Float32, cfg.mma_smem // 4, alignment=16)
        half = cfg.mma_smem // 8
        first = w0 + cute.assume(bidx * span, divby=4)
        for j in cutlass.range_constexpr(D - 1):
            self.load_weight(first, wbuf, j, j, r_half)
        wait_previous_grid(cfg)
        for s in cutlass.range_constexpr(STEPS):
            self.load_token(tokens, xres, s, s)
        for rg in cutlass.range(bidx, groups, nct, unroll=1):
            gn = next_group(rg, nct, groups)
            here = w0 + cute.assume(rg * span, divby=4)
            ahead = w0 + cute.assume(gn * span, divby=4)
            acc.fill(0.0)
            for op, buf, stage in walk_order(D, STEPS):
                if cutlass.const_expr(op == WEIGHT):
                    self.load_weight(here, wbuf, buf, stage, r_half)
                elif cutlass.const_expr(op == NEXT):
                    self.load_weight(ahead, wbuf, buf, stage, r_half)
                else:
                    self.mma_stage(wbuf, xres, acc, buf, tokens, D - 1, stage)
            row0 = rg * cfg.cols_per_cta + grp * cfg.cols
            parity = (rg - bidx) // nct % 2
            sRed = reduction_buffer(cfg, red + cute.assume(parity * half, divby=4))
            reduce_slices_and_store(cfg, acc, grp, wk, lane, row0, out, residual, n, sRed)

    @cute.jit
    def trip(self, w_lane, tokens, wbuf, xbuf, acc, t, r_half):
        """One K-loop trip: for each buffer j, refill the buffer freed one step earlier, then multiply j."""
        D = self.cfg.stages
        self.run(pipeline(D, self.cfg.x_stages)[1], TRIP, t, (w_lane, tokens, wbuf, xbuf, acc, r_half))

    def run(self, steps, part, at, ops):
        """Trace one part of ``pipeline``'s order (a plain method: every branch is on the order's constants, at
        trace time). ``at``: 0 for the fill, the trip's index t, or the warp's last stage for the peeled trip."""
        w_lane, tokens, wbuf, xbuf, acc, r_half = ops
        D = self.cfg.stages
        for op, *args in steps:
            if op in (WEIGHT, TOKEN):
                # the stage: the fill's own; t*D + j + D - 1 for a trip's refill before buffer j (written in
                # this order so the planned cubins stay byte-identical; a token refill token_stages ahead is
                # t*D + j + token_stages - 1); the peeled trip's refills are its last stages, the weight's the last
                stage = args[1] if part == FILL else t_stage(at, args[1] - D + 1, D) if part == TRIP else at
                if part == LAST and args[1] != D - 1:
                    stage = at - (D - 1 - args[1])
                if op == WEIGHT:
                    self.load_weight(w_lane, wbuf, args[0], stage, r_half)
                else:
                    self.load_token(tokens, xbuf, args[0], stage)
            elif op == COMMIT:
                commit(self.cfg)
            elif op == PDL_WAIT:
                wait_previous_grid(self.cfg)
            else:
                self.mma_stage(wbuf, xbuf, acc, args[0], tokens, args[1], args[0] % self.cfg.x_stages)

    @cute.jit
    def load_weight(self, w_lane, wbuf, buf, stage, r_half):
        """Issue stage ``stage``'s weight loads into buffer ``buf``: per step and tile, 8 k of row g (row g // S at slice g % S)."""
        cfg = self.cfg
        S = cfg.slices
        for u in cutlass.range_constexpr(cfg.unroll):
            for t in cutlass.range_constexpr(cfg.mma_tiles):
                # a step is 32 k per slice: 16 * S words along the row; a tile is 8 / S rows
                if cutlass.const_expr(cfg.tail):
                    # one pointer per tile (rows clamped to N - 1)
                    ptr = w_lane[t] + cute.assume((stage * cfg.unroll + u) * 16 * S, divby=4)
                else:
                    ptr = w_lane + cute.assume(
                        t * (MMA_ROWS // S) * r_half + (stage * cfg.unroll + u) * 16 * S, divby=4
                    )
                if cutlass.const_expr(cfg.ring):
                    cute.arch.inline_ptx(
                        cp_weight_ptx(cfg.fetch), read_only_args=[ring_slot(cfg, wbuf, buf, u, t).toint(), ptr.toint()]
                    )
                else:
                    v = cute.arch.inline_ptx(
                        ldg_stream_ptx(cfg.fetch), write_only_types=[cutlass.Int32] * 4, read_only_args=[ptr.toint()]
                    )
                    for e in cutlass.range_constexpr(4):
                        wbuf[buf, u, t, e] = v[e]

    @cute.jit
    def load_token(self, tokens, xbuf, buf, stage):
        """Issue stage ``stage``'s token loads into buffer ``buf``: per step, 8 k of each A row's token (L1 hits but the first)."""
        cfg = self.cfg
        a_lane, _, a_lane2, _, more = tokens
        TL = cfg.token_loads
        for u in cutlass.range_constexpr(cfg.unroll):
            off = cute.assume((stage * cfg.unroll + u) * 16 * cfg.slices, divby=4)
            if cutlass.const_expr(cfg.ring):
                for h in cutlass.range_constexpr(cfg.token_loads):
                    src = (a_lane if h == 0 else a_lane2) + off
                    dst = ring_slot(cfg, xbuf, buf, u, cfg.mma_tiles + h)
                    cute.arch.inline_ptx(CP_TOKEN_PTX, read_only_args=[dst.toint(), src.toint()])
            else:
                for h, (p1, p2) in enumerate([(a_lane, a_lane2), *more]):
                    v = cute.make_tensor(p1 + off, cute.make_layout(4)).load()
                    for e in cutlass.range_constexpr(4):
                        xbuf[buf, u, 4 * TL * h + e] = v[e]
                    if cutlass.const_expr(TL > 1):
                        v2 = cute.make_tensor(p2 + off, cute.make_layout(4)).load()
                        for e in cutlass.range_constexpr(4):
                            xbuf[buf, u, 4 * TL * h + 4 + e] = v2[e]

    @cute.jit
    def tail_steps(self, w_rows, tokens, acc, kk, krange, koff, wk, g, q):
        """``tail``: K past the warps' whole steps, in 32 x slices-k steps dealt to the warps in turn.

        A lane's 8 k lie wholly inside K or wholly past it (K is a multiple of 8). Past K its loads read
        K = 0 of the same rows and its weight and token words are replaced by zeros (a bitwise select, so
        an inf or nan there never meets a product). A row i and B column j of a kept product are loaded
        by lanes of the same q and slice, so both are inside K or both are zero.
        """
        cfg = self.cfg
        S = cfg.slices
        WK = cfg.k_threads // WARP
        STEP = MMA_K_STEP * S
        a_lane, keep, a_lane2, keep2, more = tokens
        # the token pointers without this lane's main-loop K offset: token row starts (per token group)
        rows = [(p1 + (-koff), p2 + (-koff)) for p1, p2 in [(a_lane, a_lane2), *more]]
        zero = mma_zero()
        steps = (kk - krange + (STEP - 1)) // STEP
        for s in cutlass.range(wk, steps, WK, unroll=1):
            kpos = krange + s * STEP + (g % S) * 32 + q * 8
            inside = (kpos - kk) >> 31  # all ones inside K, zero past it
            word = cute.assume((kpos // 2) & inside, divby=4)
            xs = []
            for a_row, a_row2 in rows:
                xv = cute.make_tensor(a_row + word, cute.make_layout(4)).load()
                x = [xv[e] & keep & inside for e in range(4)]
                x2 = None
                if cutlass.const_expr(cfg.token_loads > 1):
                    xv2 = cute.make_tensor(a_row2 + word, cute.make_layout(4)).load()
                    x2 = [xv2[e] & keep2 & inside for e in range(4)]
                xs.append((x, x2))
            for t in cutlass.range_constexpr(cfg.mma_tiles):
                v = cute.arch.inline_ptx(
                    ldg_stream_ptx(cfg.fetch),
                    write_only_types=[cutlass.Int32] * 4,
                    read_only_args=[(w_rows[t] + word).toint()],
                )
                for h, (x, x2) in enumerate(xs):
                    mma_pair(acc, h * cfg.mma_tiles + t, x, [v[e] & inside for e in range(4)], zero, x2)

    @cute.jit
    def mma_stage(self, wbuf, xbuf, acc, buf, tokens, pending, xb):
        """Two MMAs per step and tile on weight buffer ``buf`` and token buffer ``xb`` (the first waits for its
        loads; ring: once at most ``pending`` later commit groups are in flight, then read back from shared
        memory)."""
        cfg = self.cfg
        _, keep, _, keep2, _ = tokens
        TL = cfg.token_loads
        zero = mma_zero()
        if cutlass.const_expr(cfg.ring):
            cute.arch.inline_ptx(f"cp.async.wait_group {pending};")
        for u in cutlass.range_constexpr(cfg.unroll):
            for h in cutlass.range_constexpr(cfg.token_groups):
                # token group h's A rows: operands mma_tiles + TL * h (+ 1 for A rows g + 8)
                x = [v & keep for v in self.words(xbuf, xb, u, cfg.mma_tiles + TL * h)]
                x2 = None
                if cutlass.const_expr(TL > 1):
                    x2 = [v & keep2 for v in self.words(xbuf, xb, u, cfg.mma_tiles + TL * h + 1)]
                for t in cutlass.range_constexpr(cfg.mma_tiles):
                    mma_pair(acc, h * cfg.mma_tiles + t, x, self.words(wbuf, buf, u, t), zero, x2)

    def words(self, bufs, buf, u, part):
        """The 4 words of operand ``part`` (a tile's weight, then the token loads) at step ``u`` of buffer ``buf``:
        from the lane's ring slot (``ring``), else from the weight's or the tokens' registers."""
        cfg = self.cfg
        if cfg.ring:
            return lds(ring_slot(cfg, bufs, buf, u, part))
        if part < cfg.mma_tiles:
            return [bufs[buf, u, part, e] for e in range(4)]
        return [bufs[buf, u, 4 * (part - cfg.mma_tiles) + e] for e in range(4)]


def ring_slot(cfg, lane_slot, buf, u, part):
    """``ring``: this lane's 16-byte slot of operand ``part`` (a tile's weight words, then the token loads) at
    step ``u`` of stage buffer ``buf``, from its slot 0 (all static: one immediate offset)."""
    return lane_slot + ((buf * cfg.unroll + u) * (cfg.mma_tiles + cfg.token_loads) + part) * WARP * RING_SLOT


@cute.jit
def commit(cfg):
    """``ring``: close the copies issued since the last commit into one group (nothing without a ring)."""
    if cutlass.const_expr(cfg.ring):
        cute.arch.inline_ptx(CP_COMMIT_PTX)


@cute.jit
def lds(ptr):
    """Four words from shared memory (a lane's ring slot)."""
    v = cute.arch.inline_ptx(LDS_PTX, write_only_types=[cutlass.Int32] * 4, read_only_args=[ptr.toint()])
    return [v[e] for e in range(4)]


# The K loop's order, the one source the kernel traces and tests/helpers/ring_emulator.py replays.
WEIGHT, TOKEN, COMMIT, PDL_WAIT, MMA = "weight", "token", "commit", "pdl wait", "mma"
FILL, TRIP, LAST = "fill", "trip", "last"


def t_stage(t, j, D):
    """Trip t's refill before buffer j: stage t*D + j + D - 1."""
    return t * D + j + D - 1


def pipeline(stages: int, token_stages: int | None = None) -> tuple[list, list, list]:
    """(first, trip, last): the loads, commits and MMAs of the pipeline's fill, of one K-loop trip and of the
    peeled last trip, in issue order. (WEIGHT or TOKEN, buffer, stage from the part's first), (COMMIT,),
    (PDL_WAIT,), (MMA, buffer, commit groups it lets stay pending). Without ``ring`` COMMIT is nothing and
    an MMA waits on its registers instead of its group; MMA j reads weight buffer j and token buffer
    j % token_stages.

    The fill issues stages 0..D-2 (the tokens 0..X-2, X = token_stages, default D): the weight before the PDL
    wait, the tokens after it, a commit per stage (group 0 also holds every weight copy issued before the
    wait). Trip t refills, before multiplying buffer j, the weight buffer freed one step earlier with stage
    t*D + j + D - 1 and the token buffer freed one step earlier with stage t*D + j + X - 1. The last trip has
    only the refills left whose stages exist (the weight's last stage; the tokens' last X - 1); buffer j's
    group is complete once at most the D - 1 - j groups after it are pending (with X = D).
    """
    D = stages
    X = token_stages or D
    first = [(WEIGHT, j, j) for j in range(D - 1)] + [(PDL_WAIT,)]
    first += [op for j in range(X - 1) for op in ((TOKEN, j, j), (COMMIT,))]
    trip = []
    for j in range(D):
        trip += [(WEIGHT, (j + D - 1) % D, j + D - 1), (TOKEN, (j + X - 1) % X, j + X - 1), (COMMIT,), (MMA, j, D - 1)]
    last = [(WEIGHT, D - 1, D - 1)]
    for j in range(D):
        if j + X - 1 <= D - 1:
            last += [(TOKEN, (j + X - 1) % X, j + X - 1), (COMMIT,)]
        last.append((MMA, j, D - 1 - j))
    return first, trip, last


NEXT = "next group's weight"


def walk_order(stages: int, steps: int) -> list:
    """One row group of the ``persist`` walk, in issue order: (WEIGHT or NEXT, buffer, stage) and (MMA, buffer,
    the step's token buffer). ``steps`` stages cover the warp's K range; the fill before the walk has put stages
    0..stages-2 in buffers 0..stages-2. Before multiplying stage s (in buffer s % stages) the buffer freed one step
    earlier is refilled with stage s + stages - 1: this group's while it has one, else the next group's stage
    s + stages - 1 - steps, so the group ends with the next one's fill in place. Every step's tokens stay in their
    own buffer (the step's index)."""
    D = stages
    assert steps % D == 0, (
        f"{steps} steps do not fill {D} buffers evenly: the next group's stage j must land in buffer j"
    )
    order = []
    for s in range(steps):
        ahead = s + D - 1
        order.append((WEIGHT, ahead % D, ahead) if ahead < steps else (NEXT, ahead % D, ahead - steps))
        order.append((MMA, s % D, s))
    return order


# Shared with kernels/skinny_bulk.py, which feeds the same MMAs from shared memory.


@cute.jit
def mma_zero():
    """A zero register for the padding halves of the A fragment.

    A register, not a constant: an Int32 constant becomes an immediate inside
    the MMA's operand vector, which this ptxas accepts but PTX does not promise.
    """
    return cute.arch.inline_ptx("mov.b32 {$w0}, 0;", write_only_types=[cutlass.Int32])


@cute.jit
def mma_pair(acc, t, x, w, zero, x2=None):
    """One 32-k step on tile t: two m16n8k16 MMAs, A rows g from x[0..3] and g + 8 from x2 (None: zero), B from w[0..3]."""
    for h in cutlass.range_constexpr(2):
        c = cute.arch.inline_ptx(
            MMA_PTX,
            write_only_types=[cutlass.Float32] * 4,
            read_only_args=[
                x[2 * h],
                zero if x2 is None else x2[2 * h],
                x[2 * h + 1],
                zero if x2 is None else x2[2 * h + 1],
                w[2 * h],
                w[2 * h + 1],
                acc[t, 0],
                acc[t, 1],
                acc[t, 2],
                acc[t, 3],
            ],
        )
        for e in cutlass.range_constexpr(4):
            acc[t, e] = c[e]


# Distributed shared memory (sm_90+): map a shared address to the same offset in
# cluster CTA `rank`, store there; the cluster barrier's release/acquire orders
# those stores before the first CTA reads them.
MAPA_PTX = "mapa.shared::cluster.u32 {$w0}, {$r0}, {$r1};"
ST_CLUSTER_PTX = "st.shared::cluster.f32 [{$r0}], {$r1};"
CLUSTER_ARRIVE_PTX = "barrier.cluster.arrive.relaxed.aligned;"
CLUSTER_WAIT_PTX = "barrier.cluster.wait.aligned;"
CLUSTER_SYNC_PTX = "barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"


@cute.jit
def reduce_and_store(cfg, acc, grp, wk, lane, row0, out, residual, n, rank):
    """Sum the K-split warps' accumulators in shared memory, then (split) the cluster's CTAs into CTA 0; store there.

    Cluster CTA ``rank`` of a row group holds partial sums over its share of K.
    """
    TILES = cfg.cols // MMA_ROWS
    WK = cfg.k_threads // WARP
    # values per lane and tile: c0, c1 (token g), and with m > 8 c2, c3 (token g + 8)
    V = 2 * cfg.token_loads
    g = lane // 4
    q = lane % 4
    has_res = residual.toint() != 0
    if cutlass.const_expr(WK > 1):
        # (groups, WK, TILES * V, 32) fp32: each K-split warp's c0, c1 (c2, c3).
        sRed = cute.make_tensor(
            cute.arch.alloc_smem(cutlass.Float32, cfg.groups * WK * TILES * V * WARP, alignment=16),
            cute.make_layout(
                (cfg.groups, WK, TILES * V, WARP), stride=(WK * TILES * V * WARP, TILES * V * WARP, WARP, 1)
            ),
        )
        for i in cutlass.range_constexpr(TILES * V):
            sRed[grp, wk, i, lane] = acc[i // V, i % V]
        cute.arch.sync_threads()
        if wk == 0:
            for i in cutlass.range_constexpr(TILES * V):
                total = acc[i // V, i % V]
                for j in cutlass.range_constexpr(1, WK):
                    total = total + sRed[grp, j, i, lane]
                acc[i // V, i % V] = total
    if cutlass.const_expr(cfg.split > 1):
        # (split - 1, groups, TILES * 2, 32) fp32: the partials CTAs 1.. send to CTA 0. Every
        # CTA allocates it so the mapped offset is the same in each; only CTA 0's is used.
        sX = cute.make_tensor(
            cute.arch.alloc_smem(cutlass.Float32, (cfg.split - 1) * cfg.groups * TILES * V * WARP, alignment=16),
            cute.make_layout(
                (cfg.split - 1, cfg.groups, TILES * V, WARP),
                stride=(cfg.groups * TILES * V * WARP, TILES * V * WARP, WARP, 1),
            ),
        )
        cute.arch.inline_ptx(CLUSTER_WAIT_PTX)
        if wk == 0 and rank != 0:
            for i in cutlass.range_constexpr(TILES * V):
                local = (sX.iterator + sX.layout((rank - 1, grp, i, lane))).toint()
                remote = cute.arch.inline_ptx(
                    MAPA_PTX, write_only_types=[cutlass.Int32], read_only_args=[local, cutlass.Int32(0)]
                )
                cute.arch.inline_ptx(ST_CLUSTER_PTX, read_only_args=[remote, acc[i // V, i % V]])
        cute.arch.inline_ptx(CLUSTER_SYNC_PTX)
        if wk == 0 and rank == 0:
            for i in cutlass.range_constexpr(TILES * V):
                total = acc[i // V, i % V]
                for r in cutlass.range_constexpr(cfg.split - 1):
                    total = total + sX[r, grp, i, lane]
                acc[i // V, i % V] = total
            if g < cfg.m:
                store_rows(cfg, acc, g, q, row0, out, residual, has_res, n)
    elif wk == 0 and g < cfg.m:
        store_rows(cfg, acc, g, q, row0, out, residual, has_res, n)


@cute.jit
def reduce_slices_and_store(cfg, acc, grp, wk, lane, row0, out, residual, n, sRed=None):
    """``slices`` (and the ``persist`` walk at any slices): each warp puts its slice partials in shared memory
    (``sRed``, else a buffer of its own), then each thread of the group adds and stores ``outputs_per_thread``
    outputs, k_threads apart.

    Lane (g, q) holds D[i][j] for A row i = g + 8h and B column j = 2q + e in acc[tile, 2h + e]. It is a
    partial of output (token i // S, row tile * 8 / S + j // S) when i and j are the same slice (i % S == j % S);
    each (token, row, slice) is in exactly one lane. The sum runs in a fixed order (warps, then slices).
    """
    S = cfg.slices
    WK = cfg.k_threads // WARP
    M = cfg.m
    g = lane // 4
    q = lane % 4
    has_res = residual.toint() != 0
    if cutlass.const_expr(sRed is None):
        sRed = reduction_buffer(cfg, cute.arch.alloc_smem(cutlass.Float32, cfg.mma_smem // 4, alignment=16))
    MG = M // cfg.token_groups  # tokens per group: group hg's A row i is token hg * MG + i // S
    for hg in cutlass.range_constexpr(cfg.token_groups):
        for t in cutlass.range_constexpr(cfg.mma_tiles):
            for h in cutlass.range_constexpr(cfg.token_loads):
                for e in cutlass.range_constexpr(2):
                    i = g + MMA_ROWS * h
                    j = 2 * q + e
                    if i % S == j % S:
                        if i // S < MG:
                            sRed[grp, wk, hg * MG + i // S, t * (MMA_ROWS // S) + j // S, j % S] = acc[
                                hg * cfg.mma_tiles + t, 2 * h + e
                            ]
    cute.arch.sync_threads()
    first = wk * WARP + lane  # this thread's place in its group
    # the group's k_threads threads take its M * cols outputs in turns: first, first + k_threads, ...
    # (more than one each lets a CTA hold more rows per token read: tokens cost M / cols of the weight's bytes)
    for o in cutlass.range_constexpr(cfg.outputs_per_thread):
        slot = first + o * cfg.k_threads
        if slot < M * cfg.cols:
            tok = slot // cfg.cols
            col = slot % cfg.cols
            total = cutlass.Float32(0.0)
            for r in cutlass.range_constexpr(WK):
                for sl in cutlass.range_constexpr(S):
                    total = total + sRed[grp, r, tok, col, sl]
            store_output(cfg, out, residual, has_res, total, tok, row0 + col, n)


def reduction_buffer(cfg, base):
    """(groups, WK, M, cols, S) fp32 at ``base``: warp wk's partial of output (token, column) at each slice."""
    WK, M, S = cfg.k_threads // WARP, cfg.m, cfg.slices
    return cute.make_tensor(
        base,
        cute.make_layout(
            (cfg.groups, WK, M, cfg.cols, S), stride=(WK * M * cfg.cols * S, M * cfg.cols * S, cfg.cols * S, S, 1)
        ),
    )


@cute.jit
def store_rows(cfg, acc, g, q, row0, out, residual, has_res, n):
    """Store token g's c0, c1 of every tile (weight rows 2q, 2q+1 of each 8-row tile from row0), with m > 8
    also token g + 8's c2, c3."""
    V = 2 * cfg.token_loads
    for i in cutlass.range_constexpr(cfg.cols // MMA_ROWS * V):
        row = row0 + (i // V) * MMA_ROWS + q * 2 + i % 2
        if cutlass.const_expr(i % V < 2):
            store_output(cfg, out, residual, has_res, acc[i // V, i % V], g, row, n)
        else:
            if g + MMA_ROWS < cfg.m:
                store_output(cfg, out, residual, has_res, acc[i // V, i % V], g + MMA_ROWS, row, n)


def compile_variant(cfg: KernelConfig, arch: str, dump_dir: str) -> bytes:
    """Compile entry: AOT-compile one "mma" variant for ``arch`` and return the cubin bytes."""
    return compile_kernel(SkinnyMma(cfg), arch, dump_dir, cfg.name)
