"""The warpgroup-MMA skinny GEMM: weight rows are the MMA's 64-row side, tokens its N; TMA feeds a shared-memory ring.

Order: config (imported: ``skinny_gemm.kernels.config``, kind "wgmma"), kernel
class (host launcher, device body), compile entry.

Why: the mma and bulk kernels put the tokens on mma.sync's 16-row side, so
M = 16 loads every weight fragment for 16 rows of which the MMA's 8 columns
use one, and their rings cost registers or lanes. Here the weight is the
operand the MMA is wide in (wgmma m64nNk16, N = m rounded up to 8, at most 32 tokens), both operands
are read from shared memory by descriptor, and the copies cost no threads:
M = 16 costs what M = 8 costs (docs/perf.md, "v4").

Ring: stage s holds one 64-k chunk (128 bytes per row, the 128-byte swizzle's
row) of the CTA's ``cols`` weight rows, then of the ``nt`` token rows; both
start on the swizzle's 1024-byte atom. Warpgroup 0 produces: thread 0 issues
the weight box by TMA (the runtime encodes one tensor map per weight and
passes its device address as ``w``; runtime/tensormaps.py) with the stage's
byte count on its "full" mbarrier, and the stage's nt x 8 token chunks (16
bytes of token row r at swizzled chunk j ^ (r % 8)) are copied by cp.async,
in one turn of nt x 8 threads up to 16 tokens and two turns of nt x 4 at 24
and 32 (token_copiers), each copier's completion arriving on the same
barrier (rows past m copy nothing and land zeros). The first ``stages`` weight boxes go out before the PDL wait;
tokens only after it. Warpgroups 1.. consume 64 rows each: four
m64n{nt}k16 per stage, one wait, one arrive on the stage's "empty" barrier.

Split: ``split`` CTAs of a cluster share a row group, each a contiguous K
slice; ranks 1.. add their accumulators into rank 0's shared memory
(distributed shared memory), rank 0 adds the residual or bias and stores.

Tail (``tail``): N of any size; the last row group's TMA box rows past N
land as zeros (the tensor map has N rows) and its stores past N are masked.

Walk (``persist``, static K): a grid of at most ``persist`` CTAs walks the
row groups ``gridDim`` apart. The tokens are copied once, with the first
group's chunks, into a resident region (chunk c: nt rows x 128 B, swizzled as
in a stage), so a stage holds only the weight box and the tokens cross L2
once per CTA rather than once per row group; the ring runs on across groups
(global chunk g = group's index in the walk x chunks + c), so the producer
streams the next group's weight while the consumers store this one's outputs.

Accumulator e of consumer thread (warp, g = lane / 4, q = lane % 4) is weight
row warp * 16 + g + 8 * ((e % 4) // 2) and token 8 * (e // 4) + 2q + e % 2.

Same 40-byte kernel-parameter ABI as kernels/skinny_gemm.py, with ``w`` the
weight's tensor map rather than the weight.
"""

from __future__ import annotations

import cutlass
import cutlass.cute as cute

from .common import Launcher, compile_kernel, store_output, wait_previous_grid
from .config import WGMMA_K, WGMMA_ROWS, KernelConfig
from .skinny_mma import CLUSTER_ARRIVE_PTX, CLUSTER_SYNC_PTX, CLUSTER_WAIT_PTX, MAPA_PTX, ST_CLUSTER_PTX

WARPGROUP = 128
# The 128-byte swizzle's atom: 8 rows x 128 B, the stride between 8-row groups (the descriptor's SBO).
SW128_ATOM = 1024
ROW_BYTES = WGMMA_K * 2
PREFETCH_MAP_PTX = "prefetch.tensormap [{$r0}];"
TMA_PTX = (
    "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes "
    "[{$r0}], [{$r1}, {{$r2}, {$r3}}], [{$r4}];"
)
CP_ASYNC_PTX = "cp.async.cg.shared.global [{$r0}], [{$r1}], 16, {$r2};"
CP_ARRIVE_PTX = "cp.async.mbarrier.arrive.noinc.shared::cta.b64 [{$r0}];"
# cp.async writes through the generic proxy, wgmma reads through the async proxy.
FENCE_ASYNC_PTX = "fence.proxy.async.shared::cta;"


def sw128_desc(addr: int) -> int:
    """The wgmma shared-memory descriptor of a 128-byte-swizzled K-major tile at ``addr`` (1024-aligned):
    start address >> 4, leading offset 1 (unused with this swizzle), stride offset one atom, swizzle mode 1."""
    return (addr >> 4) | (1 << 16) | ((SW128_ATOM >> 4) << 32) | (1 << 62)


# The index math, as plain functions of ints: the device body calls them on the DSL's traced ints and
# tests/helpers/wgmma_emulator.py on Python ints (the same code is what the CPU emulation checks).


def box_coords(chunk, tile, cols):
    """The weight box of a 64-k chunk for row group ``tile``: its TMA coordinates (k element, weight row)."""
    return chunk * WGMMA_K, tile * cols


def token_dst(cols, r, j):
    """Byte offset in a stage of token row r's 16-byte chunk j: after the weight box, row r at 128 B, chunk j at
    j ^ (r % 8) (the 128-byte swizzle the descriptors name; the box starts on a 1024-byte atom)."""
    return cols * ROW_BYTES + r * ROW_BYTES + ((j ^ (r % 8)) * 16)


def token_copiers(nt):
    """(threads of the producer warpgroup that copy a stage's nt x 8 token chunks, chunks each): as few turns of
    at most one warpgroup as hold them (nt 24 and 32: two turns of 96 and 128 threads)."""
    turns = -(-nt * 8 // WARPGROUP)
    assert nt * 8 % turns == 0, nt
    return nt * 8 // turns, turns


def token_src(r, j, kk, k0):
    """Element offset in the tokens (m rows of K) of token row r's 16-byte chunk j of the 64-k chunk at k0."""
    return r * kk + k0 + j * 8


def walk_chunk(tile, bidx, nct, c, chunks):
    """The ring's chunk count g of chunk c of row group ``tile`` in CTA bidx's walk (``nct`` CTAs, ``chunks`` per
    group): producer and consumers both count it, so a group's chunks follow the previous group's in the ring."""
    return (tile - bidx) // nct * chunks + c


def ring_slot(g, stages):
    """Ring chunk g: (its stage, the parity its full barrier completes, the parity of the empty barrier's release
    of that stage's previous chunk g - stages, which the producer waits for when g >= stages)."""
    return g % stages, (g // stages) & 1, ((g // stages) - 1) & 1


def token_chunk(t, turn, copiers):
    """(token row, 16-byte chunk) copier t copies in ``turn``: turn-major, so each turn's copiers read whole rows."""
    q = t + turn * copiers if turn else t
    return q // 8, q % 8


def walk_tokens(c, nt):
    """Byte offset of the walk's resident token chunk c (nt rows x 128 B, 1024-aligned) in its token region."""
    return c * nt * ROW_BYTES


def operand_addrs(stage, wg, cols):
    """Shared addresses of consumer warpgroup wg's (>= 1) weight rows and of the tokens in the stage at ``stage``."""
    return stage + (wg - 1) * WGMMA_ROWS * ROW_BYTES, stage + cols * ROW_BYTES


def acc_coords(e, warp, lane):
    """Accumulator e of a thread (warp of its warpgroup, lane): (weight row in the warpgroup's 64, token)."""
    return warp * 16 + lane // 4 + 8 * ((e % 4) // 2), 8 * (e // 4) + 2 * (lane % 4) + e % 2


def wgmma_ptx(nt: int) -> str:
    """One stage's four m64n{nt}k16 from shared memory, committed and waited for.

    Inputs: the A (weight) descriptors of the four k16 steps ($r0-$r3), the B (token) ones ($r4-$r7),
    then the accumulators, copied into the outputs first (the DSL's asm has no tied operands)."""
    na = nt // 2
    body = "".join(f"mov.f32 {{$w{e}}}, {{$r{8 + e}}};\n\t" for e in range(na))
    body += "wgmma.fence.sync.aligned;\n\t"
    d = ", ".join(f"{{$w{e}}}" for e in range(na))
    for u in range(4):
        body += (
            f"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.bf16.bf16 {{{d}}}, {{$r{u}}}, {{$r{4 + u}}}, "
            "p, 1, 1, 0, 0;\n\t"
        )
    body += "wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;"
    return "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, 1, 1;\n\t" + body + "\n}"


class SkinnyWgmma(Launcher):
    """One compiled variant per KernelConfig of kind "wgmma": a cluster of ``split`` CTAs per ``cols`` weight rows."""

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
        """Device body: warpgroup 0 fills the ring, the others multiply; the cluster reduces into rank 0, which stores."""
        cfg = self.cfg
        S, NT, X = cfg.stages, cfg.nt, cfg.split
        COPIERS = token_copiers(NT)[0]
        LAYOUT = cfg.wgmma_layout
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        wg = tidx // WARPGROUP
        t = tidx % WARPGROUP
        rank = bidx % X
        tile = bidx // X
        kk = cute.assume(k, divby=cfg.k_step)
        chunks = kk // cfg.k_step  # this CTA's 64-k chunks
        c0 = rank * chunks
        wmap = w.toint()
        smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=SW128_ATOM)
        ring = smem  # (stage, [cols weight rows | nt token rows (none in the walk)], 128) bytes, each row swizzled
        tokens = smem + LAYOUT.tokens  # the walk's (chunk, nt token rows, 128) bytes, swizzled as in a stage
        # (stage): the weight box and the stage's tokens (the walk: its first group's) landed
        full = cute.recast_ptr(smem + LAYOUT.barriers, dtype=cutlass.Int64)
        empty = full + S  # (stage): every consumer warpgroup done reading it
        red = cute.recast_ptr(smem + LAYOUT.reduction, dtype=cutlass.Float32)  # (rank - 1, thread, e)
        if tidx == 0:
            cute.arch.inline_ptx(PREFETCH_MAP_PTX, read_only_args=[wmap])
            for s in cutlass.range_constexpr(S):
                cute.arch.mbarrier_init(full + s, 1 + COPIERS)
                cute.arch.mbarrier_init(empty + s, cfg.cols // WGMMA_ROWS)
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()
        if cutlass.const_expr(X > 1):
            cute.arch.inline_ptx(CLUSTER_ARRIVE_PTX)
        if wg == 0:
            if cutlass.const_expr(cfg.wgmma_walk):
                self.produce_walk(a, wmap, ring, tokens, full, empty, bidx, kk, t, n)
            else:
                self.produce(a, wmap, ring, full, empty, tile, c0, chunks, kk, t)
            cute.arch.sync_warp()
            if cutlass.const_expr(X > 1):
                cute.arch.inline_ptx(CLUSTER_WAIT_PTX)
                cute.arch.inline_ptx(CLUSTER_SYNC_PTX)
        elif cutlass.const_expr(cfg.wgmma_walk):
            self.consume_walk(ring, tokens, full, empty, bidx, wg, t, tidx, out, residual, n)
        else:
            acc = self.consume(ring, full, empty, chunks, wg)
            self.reduce_and_store(acc, red, rank, tile, wg, t, tidx, out, residual, n)

    @cute.jit
    def issue_weight(self, wmap, ring, full, tile, chunk, s):
        """Thread 0: expect the weight box's bytes on stage s's full barrier and issue its TMA copy."""
        cfg = self.cfg
        bar = full + s
        cute.arch.mbarrier_arrive_and_expect_tx(bar, cfg.cols * ROW_BYTES)
        dst = ring + s * cfg.wgmma_stage
        kx, row = box_coords(chunk, tile, cfg.cols)
        cute.arch.inline_ptx(TMA_PTX, read_only_args=[dst.toint(), wmap, kx, row, bar.toint()])

    @cute.jit
    def produce(self, a, wmap, ring, full, empty, tile, c0, chunks, kk, t):
        """Warpgroup 0: the first ``stages`` weight boxes before the PDL wait, then chunk by chunk each stage's
        tokens (copier t < copiers: its turns' 16 bytes of a token row, token_chunk) and, once a stage is
        released, its next box."""
        cfg = self.cfg
        S = cfg.stages
        COPIERS = token_copiers(cfg.nt)[0]
        if t == 0:
            for s in cutlass.range_constexpr(S):
                if s < chunks:
                    self.issue_weight(wmap, ring, full, tile, c0 + s, s)
        wait_previous_grid(cfg)
        if t < COPIERS:
            copies = self.token_sources(a, t, kk, c0 * WGMMA_K, cfg.cols)
            for c in cutlass.range(chunks, unroll=1):
                s, _, released = ring_slot(c, S)
                if c >= S:
                    cute.arch.mbarrier_wait(empty + s, released)
                    if t == 0:
                        self.issue_weight(wmap, ring, full, tile, c0 + c, s)
                self.copy_tokens(ring + s * cfg.wgmma_stage, copies, c)
                cute.arch.inline_ptx(CP_ARRIVE_PTX, read_only_args=[(full + s).toint()])

    @cute.jit
    def token_sources(self, a, t, kk, k0, cols):
        """Copier t's turns (token_chunk): per turn its source at K element k0, its byte count (0 for token rows
        past m: zeros land, read from row 0's valid address) and its offset in a token box after ``cols`` rows."""
        COPIERS, TURNS = token_copiers(self.cfg.nt)
        srcs, nbytes, dst_offs = [], [], []
        for turn in cutlass.range_constexpr(TURNS):
            r, j = token_chunk(t, turn, COPIERS)
            live = r < self.cfg.m
            src_row = r if live else 0
            nbytes.append(cutlass.Int32(16) if live else cutlass.Int32(0))
            srcs.append(a + cute.assume(token_src(src_row, j, kk, k0), divby=8))
            dst_offs.append(token_dst(cols, r, j))
        return srcs, nbytes, dst_offs

    @cute.jit
    def copy_tokens(self, box, copies, c):
        """A copier's turns of 64-k chunk c (token_sources' copies): 16 bytes each by cp.async into the box at ``box``."""
        srcs, nbytes, dst_offs = copies
        for turn in cutlass.range_constexpr(len(srcs)):
            dst = box + dst_offs[turn]
            cute.arch.inline_ptx(
                CP_ASYNC_PTX,
                read_only_args=[dst.toint(), (srcs[turn] + c * WGMMA_K).toint(), nbytes[turn]],
            )

    @cute.jit
    def produce_walk(self, a, wmap, ring, tokens, full, empty, bidx, kk, t, n):
        """Warpgroup 0 of a walk: the first group's first ``stages`` weight boxes before the PDL wait, then each
        group's chunks in ring order (global chunk g: the next box once stage g % stages is released), the tokens
        copied with the first group's chunks into the resident region; every copier arrives on every stage, so
        each full barrier counts the same arrivals for any group."""
        cfg = self.cfg
        S, NT = cfg.stages, cfg.nt
        CHUNKS = cfg.static_k // WGMMA_K
        COPIERS = token_copiers(NT)[0]
        nct, _, _ = cute.arch.grid_dim()
        groups = cfg.row_groups(n)
        if t == 0:
            for s in cutlass.range_constexpr(S):  # CHUNKS >= S: the config's rule
                self.issue_weight(wmap, ring, full, bidx, s, s)
        wait_previous_grid(cfg)
        if t < COPIERS:
            copies = self.token_sources(a, t, kk, 0, 0)
            for tile in cutlass.range(bidx, groups, nct, unroll=1):
                for c in cutlass.range(CHUNKS, unroll=1):
                    g = walk_chunk(tile, bidx, nct, c, CHUNKS)
                    s, _, released = ring_slot(g, S)
                    if g >= S:
                        cute.arch.mbarrier_wait(empty + s, released)
                        if t == 0:
                            self.issue_weight(wmap, ring, full, tile, c, s)
                    if tile == bidx:
                        self.copy_tokens(tokens + walk_tokens(c, NT), copies, c)
                    cute.arch.inline_ptx(CP_ARRIVE_PTX, read_only_args=[(full + s).toint()])

    @cute.jit
    def consume_walk(self, ring, tokens, full, empty, bidx, wg, t, tidx, out, residual, n):
        """Warpgroup wg >= 1 of a walk: per row group its 64 weight rows x nt tokens over K (the weight from the
        ring's global chunk g, the tokens from the resident chunk c), then its outputs stored."""
        cfg = self.cfg
        NT = cfg.nt
        CHUNKS = cfg.static_k // WGMMA_K
        nct, _, _ = cute.arch.grid_dim()
        groups = cfg.row_groups(n)
        acc = cute.make_rmem_tensor(NT // 2, cutlass.Float32)  # (e): see the module docstring
        base = ring.toint() & 0x3FFFF
        tok = tokens.toint() & 0x3FFFF
        desc0 = cutlass.Int64(sw128_desc(0))
        for tile in cutlass.range(bidx, groups, nct, unroll=1):
            acc.fill(0.0)
            for c in cutlass.range(CHUNKS, unroll=1):
                g = walk_chunk(tile, bidx, nct, c, CHUNKS)
                self.multiply(acc, full, empty, g, base, tok + walk_tokens(c, NT), wg, desc0, t)
            self.reduce_and_store(acc, None, 0, tile, wg, t, tidx, out, residual, n)

    @cute.jit
    def consume(self, ring, full, empty, chunks, wg):
        """Warpgroup wg >= 1: its 64 weight rows x nt tokens over this CTA's chunks; the fp32 accumulators."""
        cfg = self.cfg
        acc = cute.make_rmem_tensor(cfg.nt // 2, cutlass.Float32)  # (e): see the module docstring
        acc.fill(0.0)
        base = ring.toint() & 0x3FFFF
        desc0 = cutlass.Int64(sw128_desc(0))
        t = cute.arch.thread_idx()[0] % WARPGROUP
        for c in cutlass.range(chunks, unroll=1):
            self.multiply(acc, full, empty, c, base, None, wg, desc0, t)
        return acc

    @cute.jit
    def multiply(self, acc, full, empty, g, base, tokens, wg, desc0, t):
        """Ring chunk g: wait for its stage, four m64n{nt}k16 into acc of warpgroup wg's weight rows in the stage
        (the ring at shared address ``base``) by the stage's tokens, or by those at shared address ``tokens`` (the
        walk's resident chunk), then release the stage."""
        cfg = self.cfg
        S, NT = cfg.stages, cfg.nt
        NA = NT // 2
        s, landed, _ = ring_slot(g, S)
        cute.arch.mbarrier_wait(full + s, landed)
        cute.arch.inline_ptx(FENCE_ASYNC_PTX)
        a_addr, b_addr = operand_addrs(base + s * cfg.wgmma_stage, wg, cfg.cols)
        if cutlass.const_expr(tokens is not None):
            b_addr = tokens
        a0 = desc0 + cutlass.Int64(a_addr >> 4)
        b0 = desc0 + cutlass.Int64(b_addr >> 4)
        # a k16 step is 32 bytes further along the swizzled row: +2 in the descriptor's address field
        descs = [a0 + cutlass.Int64(2 * u) for u in range(4)] + [b0 + cutlass.Int64(2 * u) for u in range(4)]
        res = cute.arch.inline_ptx(
            wgmma_ptx(NT),
            write_only_types=[cutlass.Float32] * NA,
            read_only_args=descs + [acc[e] for e in range(NA)],
        )
        for e in cutlass.range_constexpr(NA):
            acc[e] = res[e]
        if t == 0:
            cute.arch.mbarrier_arrive(empty + s)

    @cute.jit
    def reduce_and_store(self, acc, red, rank, tile, wg, t, tidx, out, residual, n):
        """Ranks 1.. store their accumulators into rank 0's shared memory; rank 0 adds them, waits for the
        previous grid (PDL) and stores tokens < m, adding the residual or bias."""
        cfg = self.cfg
        X, NA, M = cfg.split, cfg.nt // 2, cfg.m
        ct = tidx - WARPGROUP  # consumer thread
        CT = cfg.cols * 2  # consumer threads: 128 per 64 rows
        if cutlass.const_expr(X > 1):
            cute.arch.inline_ptx(CLUSTER_WAIT_PTX)
            if rank != 0:
                for e in cutlass.range_constexpr(NA):
                    local = (red + ((rank - 1) * CT + ct) * NA + e).toint()
                    remote = cute.arch.inline_ptx(
                        MAPA_PTX, write_only_types=[cutlass.Int32], read_only_args=[local, cutlass.Int32(0)]
                    )
                    cute.arch.inline_ptx(ST_CLUSTER_PTX, read_only_args=[remote, acc[e]])
            cute.arch.inline_ptx(CLUSTER_SYNC_PTX)
        wait_previous_grid(cfg)
        if rank == 0:
            if cutlass.const_expr(X > 1):
                for r in cutlass.range_constexpr(X - 1):
                    part = cute.make_tensor(red + (r * CT + ct) * NA, cute.make_layout(NA))
                    for e in cutlass.range_constexpr(NA):
                        acc[e] = acc[e] + part[e]
            has_res = residual.toint() != 0
            row0 = tile * cfg.cols + (wg - 1) * WGMMA_ROWS
            for e in cutlass.range_constexpr(NA):
                row, tok = acc_coords(e, t // 32, t % 32)
                if tok < M:
                    store_output(cfg, out, residual, has_res, acc[e], tok, row0 + row, n)


def compile_variant(cfg: KernelConfig, arch: str, dump_dir: str) -> bytes:
    """Compile entry: AOT-compile one "wgmma" variant for ``arch`` (sm_90a only: wgmma and TMA) and return the cubin."""
    if arch != "sm_90a":
        raise ValueError(f"kind 'wgmma' runs only on sm_90a (warpgroup MMA), not {arch}")
    return compile_kernel(SkinnyWgmma(cfg), arch, dump_dir, cfg.name)
