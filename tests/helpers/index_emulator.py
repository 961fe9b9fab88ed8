"""A CPU emulator of which weight rows, tokens and k each thread of a kernel reads and where its sums go.

It follows the index math of kernels/skinny_gemm.py ("simt") and kernels/skinny_mma.py ("mma", split 1)
for a config and a shape, including the ``tail`` path and the "mma" walk's row groups (``persist``): the warps' whole K steps, the masked tail steps,
rows clamped to N - 1 and the store guard. ``coverage`` returns, per stored output (token, row), how many
times each k was added into it, plus every out-of-bounds read; a correct mapping adds each k exactly once
into each output and reads nothing outside the weight and the tokens.

For "mma" it also checks the fragment claim the kernel relies on: in every product that the epilogue
keeps (A row i and B column j of one slice), the two lanes that load A row i and B column j read the
same k (m16n8k16: A row i's k slots come from lane (i % 8, q), B column j's from lane (j, q)).
"""

from __future__ import annotations

import numpy as np

WARP = 32
MMA_ROWS = 8


class Reads:
    """Counts per (token, row, k) of what reaches a stored output, and the reads that leave the tensors."""

    def __init__(self, cfg, n, k):
        self.cfg, self.n, self.k = cfg, n, k
        self.acc = {}  # (thread id, slot) -> list of (token, row, k0, length)
        self.bad = []

    def read_w(self, row, k0, length):
        if not (0 <= row < self.n and 0 <= k0 and k0 + length <= self.k):
            self.bad.append(("weight", row, k0, length))

    def read_a(self, token, k0, length):
        if not (0 <= token < self.cfg.m and 0 <= k0 and k0 + length <= self.k):
            self.bad.append(("tokens", token, k0, length))


def coverage(cfg, n, k):
    """(counts[m, n, k] of k added into each stored output, stored[m, n] times each output was written, bad reads)."""
    counts = np.zeros((cfg.m, n, k), dtype=np.int32)
    stored = np.zeros((cfg.m, n), dtype=np.int32)
    reads = Reads(cfg, n, k)
    emulate = _simt if cfg.kind == "simt" else _mma
    for cta in range(cfg.grid(n)):
        for group in row_groups(cfg, n, cta):
            emulate(cfg, n, k, group, reads, counts, stored)
    return counts, stored, reads.bad


def walk_pointers(cfg, n, k, cta):
    """The "mma" walk's per-group word offsets, by the kernel's own arithmetic (SkinnyMma.walk, 32-bit two's
    complement): (row group, ``here`` - w0, ``ahead`` - w0, reduction buffer parity) for each group of CTA ``cta``."""
    r_half, nct, groups = k // 2, cfg.grid(n), n // cfg.cols_per_cta
    span = cfg.cols_per_cta * r_half
    found = []
    for rg in range(cta, groups, nct):
        nxt = rg + nct
        over = (groups - 1 - nxt) >> 31  # Python's >> is arithmetic, as PTX's shr.s32
        gn = (nxt & (over ^ -1)) | (rg & over)
        found.append((rg, rg * span, gn * span, (rg - cta) // nct % 2))
    return found


def row_groups(cfg, n, cta):
    """The row groups CTA ``cta`` computes: its own, or with an "mma" walk (``persist``) every grid-th from it."""
    if cfg.walk:
        return range(cta, n // cfg.cols_per_cta, cfg.grid(n))
    return [cta]


def _row(cfg, col, n):
    return min(col, n - 1) if cfg.tail else col


def _simt(cfg, n, k, cta, reads, counts, stored):
    KT, VEC, U, COLS = cfg.k_threads, cfg.vec, cfg.unroll, cfg.cols
    step = KT * VEC * U
    for tid in range(cfg.threads):
        kt, grp = tid % KT, tid // KT
        col0 = cta * cfg.cols_per_cta + grp * COLS
        terms = []  # (col j, k0): one VEC-vector of every token against column j
        for trip in range(k // step):
            for u in range(U):
                terms += [(j, kt * VEC + trip * step + u * KT * VEC) for j in range(COLS)]
        if cfg.tail:
            koff = kt * VEC + k // step * step
            for u in range(U):
                ku = koff + u * KT * VEC
                if ku < k:  # the kernel's guard: the load is not issued past K
                    terms += [(j, ku) for j in range(COLS)]
        for j, k0 in terms:
            reads.read_w(_row(cfg, col0 + j, n), k0, VEC)
            for m in range(cfg.m):
                reads.read_a(m, k0, VEC)
        # the group's sum of slot (m, j) is stored once, by thread kt == (m * COLS + j) % KT
        for j, k0 in terms:
            col = col0 + j
            if col < n:
                counts[:, col, k0 : k0 + VEC] += 1
        if kt == 0:
            for j in range(COLS):
                if col0 + j < n or not cfg.tail:
                    stored[:, col0 + j] += 1


def _mma(cfg, n, k, cta, reads, counts, stored):
    """One row group ``cta`` of an "mma" config (a CTA's, or one of a walk's)."""
    assert cfg.split == 1, "the emulator follows the split-1 path"
    S, WK, D, U = cfg.slices, cfg.k_threads // WARP, cfg.stages, cfg.unroll
    partials = S > 1 or cfg.persist  # the sliced epilogue: every partial through shared memory
    R = MMA_ROWS // S
    MG = cfg.m // cfg.token_groups  # tokens per group: group h's A row i is token h * MG + i // S
    tiles = cfg.mma_tiles
    krange = k // cfg.k_step * cfg.k_step if cfg.tail else k
    tail_step = 32 * S
    sred = {}  # sliced: (group, K-split warp, token, column, slice) -> the k of that shared-memory partial
    for warp in range(cfg.threads // WARP):
        wk, grp = warp % WK, warp // WK
        row0 = cta * cfg.cols_per_cta + grp * cfg.cols
        # per lane (g, q): the k positions (8 each) it loads, each inside K or masked to zero
        kpos = {}
        for g in range(8):
            for q in range(4):
                base = wk * (krange // WK) + (g % S) * 32 + q * 8
                ks = [base + st * tail_step for st in range(k // cfg.k_step * D * U)]
                if cfg.tail:
                    for s in range(wk, -(-(k - krange) // tail_step), WK):
                        kp = krange + s * tail_step + (g % S) * 32 + q * 8
                        ks.append(kp if kp < k else None)  # None: the words are zeros (address: K = 0)
                kpos[g, q] = ks
                for kp in ks:
                    for t in range(tiles):
                        reads.read_w(_row(cfg, row0 + t * R + g // S, n), 0 if kp is None else kp, 8)
                    for h in range(cfg.token_groups):
                        for i in (g, g + 8)[: cfg.token_loads]:
                            tok = i // S
                            reads.read_a(h * MG + (tok if tok < MG else 0), 0 if kp is None else kp, 8)
        for h, t in ((h, t) for h in range(cfg.token_groups) for t in range(tiles)):
            for i in range(16):  # A row: token h * MG + i // S at slice i % S
                for j in range(8):  # B column: weight row t * R + j // S at slice j % S
                    if i % S != j % S:
                        continue  # products of different slices are discarded by the epilogue
                    if i // S >= MG or (i >= 8 and cfg.token_loads == 1):
                        continue  # padding rows (or rows 8..15 that no lane loads)
                    tok, col = h * MG + i // S, t * R + j // S
                    ks = []  # the k this MMA output D[i][j] sums: its four q lanes' loads
                    for q in range(4):
                        a_ks, b_ks = kpos[i % 8, q], kpos[j, q]
                        assert a_ks == b_ks, f"lanes ({i % 8},{q}) and ({j},{q}) read different k"
                        ks += [kp for kp in a_ks if kp is not None]
                    if partials:
                        # the lane holding D[i][j] writes it to sRed[grp, wk, token, column, slice], once
                        key = (grp, wk, tok, col, j % S)
                        assert key not in sred, f"sRed{key} written twice"
                        sred[key] = ks
                    elif row0 + col < n:
                        for kp in ks:
                            counts[tok, row0 + col, kp : kp + 8] += 1
        if not partials and wk == 0:  # the K-split warps' sums end in warp 0 of the group, which stores them
            for col in range(cfg.cols):
                if row0 + col < n or not cfg.tail:
                    stored[:, row0 + col] += 1
    if partials:
        _sliced_stores(cfg, n, cta, sred, counts, stored)


def _sliced_stores(cfg, n, cta, sred, counts, stored):
    """The sliced epilogue after its barrier: the group's threads take its m x cols outputs in turns (slot = turn x
    k_threads + thread), each adding sRed[grp, r, token, column, slice] over the K-split warps r and the slices."""
    WK = cfg.k_threads // WARP
    for grp in range(cfg.groups):
        row0 = cta * cfg.cols_per_cta + grp * cfg.cols
        for thread in range(cfg.k_threads):
            for turn in range(cfg.outputs_per_thread):
                slot = turn * cfg.k_threads + thread
                if slot >= cfg.m * cfg.cols:
                    continue
                tok, col = divmod(slot, cfg.cols)
                if row0 + col >= n and cfg.tail:
                    continue  # the store guard: rows past N are summed, never stored
                stored[tok, row0 + col] += 1
                for r in range(WK):
                    for sl in range(cfg.slices):
                        for kp in sred.get((grp, r, tok, col, sl), []):
                            counts[tok, row0 + col, kp : kp + 8] += 1
