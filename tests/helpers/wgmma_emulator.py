"""A CPU emulator of the "wgmma" kernel (kernels/skinny_wgmma.py) on integer-valued inputs, exact in float64.

It runs the kernel's own index functions (box_coords, token_dst, operand_addrs, acc_coords, sw128_desc) on
Python ints (token_copiers and token_chunk: which copier writes which token chunk) against a model of the hardware they drive (not emulated: the token source address, the cluster
reduction's slots and the barrier phases, which the H200 runs check):

- TMA with the 128-byte swizzle writes box row r's 16-byte unit j at r * 128 + (j ^ (r % 8)) * 16 from a
  1024-aligned box start; cp.async writes its 16 bytes where the kernel says (token_dst).
- wgmma reads a K-major operand through a shared-memory descriptor: start address (bits 0-13, >> 4),
  stride byte offset between 8-row groups (bits 32-45, >> 4), swizzle mode (bits 62-63, 1 = 128 B);
  element (row i, k kk) of a k16 step is at start + (i // 8) * SBO + (i % 8) * 128 + 2 kk, and the
  swizzle then XORs address bits 4-6 with bits 7-9.
- Accumulator e of thread (warp, lane) holds D[row, token] of the PTX fragment layout of m64nNk16 (_ptx_acc,
  written apart from the kernel's acc_coords, which only decides where the kernel stores it).

Each stage of each CTA of each cluster rank is written and read through one byte array; the ranks' partial
sums are added as the cluster reduction does, and each stored (token, row) is recorded. A walk (``persist``)
keeps one array per CTA across its row groups: ring stages reused by the global chunk count, the tokens
written once, with the first group, into the region after the ring.
"""

from __future__ import annotations

import itertools

import numpy as np

from skinny_gemm.kernels.config import WGMMA_K
from skinny_gemm.kernels.skinny_wgmma import (
    ROW_BYTES,
    SW128_ATOM,
    acc_coords,
    box_coords,
    operand_addrs,
    ring_slot,
    sw128_desc,
    token_chunk,
    token_copiers,
    token_dst,
    token_src,
    walk_chunk,
    walk_tokens,
)

K16_BYTES = 32


def _swizzle(addr: int) -> int:
    return addr ^ (((addr >> 7) & 7) << 4)


def _ptx_acc(e: int, warp: int, lane: int) -> tuple[int, int]:
    """The hardware's side, written from the PTX fragment layout of m64nNk16 (not the kernel's acc_coords):
    accumulator e of (warp, lane) holds D[16 warp + lane / 4 + 8 ((e / 2) % 2), 8 (e / 4) + 2 (lane % 4) + e % 2]."""
    return 16 * warp + lane // 4 + 8 * ((e >> 1) & 1), 8 * (e >> 2) + 2 * (lane & 3) + (e & 1)


def _decode(desc: int) -> tuple[int, int, int]:
    """(start address, stride byte offset, swizzle mode) of a wgmma shared-memory descriptor."""
    return (desc & 0x3FFF) << 4, ((desc >> 32) & 0x3FFF) << 4, desc >> 62


def _write_box(smem: np.ndarray, base: int, w: np.ndarray, kx: int, row0: int, cols: int) -> None:
    """TMA with the 128-byte swizzle: the (cols, 64) box of weight w at (k element kx, row row0) at ``base``
    (1024-aligned); rows past the weight's N land as zeros (the tensor map has N rows)."""
    assert base % SW128_ATOM == 0
    rows = np.zeros((cols, 64))
    inside = w[row0 : row0 + cols, kx : kx + 64]
    rows[: len(inside)] = inside
    for r, row in enumerate(rows):
        for j in range(8):
            at = base + r * ROW_BYTES + (j ^ (r % 8)) * 16
            smem[at // 2 : at // 2 + 8] = row[8 * j : 8 * j + 8]


def _read_operand(smem: np.ndarray, desc: int, rows: int) -> np.ndarray:
    """(rows, 16) values one k16 step of wgmma reads through ``desc``."""
    start, sbo, mode = _decode(desc)
    assert mode == 1 and sbo == SW128_ATOM
    out = np.empty((rows, 16))
    for i in range(rows):
        for kk in range(16):
            out[i, kk] = smem[_swizzle(start + (i // 8) * sbo + (i % 8) * ROW_BYTES + 2 * kk) // 2]
    return out


def _copy_tokens(smem: np.ndarray, x: np.ndarray, kx: int, base: int, cols: int, nt: int) -> None:
    """The producer's token copies of the 64-k chunk at ``kx``: copier t's turns write token row r's chunk j at
    ``base`` + token_dst(cols, r, j) (rows past m copy 0 bytes: zeros land)."""
    m, k = x.shape
    flat = x.reshape(-1)
    copiers, turns = token_copiers(nt)
    assert copiers <= 128, "the producer is one warpgroup"
    for t, turn in itertools.product(range(copiers), range(turns)):
        r, j = token_chunk(t, turn, copiers)
        at = token_src(r, j, k, kx)
        assert r >= m or 0 <= at <= flat.size - 8, f"token row {r} chunk {j} read outside the tokens"
        src = flat[at : at + 8] if r < m else np.zeros(8)
        at = base + token_dst(cols, r, j)
        smem[at // 2 : at // 2 + 8] = src


def _multiply(smem: np.ndarray, acc: dict, a_addr: int, b_addr: int, wg: int, nt: int) -> None:
    """Consumer warpgroup wg's four k16 steps through the descriptors of a_addr and b_addr, into its threads'
    accumulators (keyed (wg, warp, lane, e)) as the PTX fragment layout places D."""
    desc0 = sw128_desc(0)
    d = np.zeros((64, nt))
    for u in range(4):
        a = _read_operand(smem, desc0 + (a_addr >> 4) + 2 * u, 64)
        b = _read_operand(smem, desc0 + (b_addr >> 4) + 2 * u, nt)
        d += a @ b.T
    for warp in range(4):
        for lane in range(32):
            for e in range(nt // 2):
                i, tok = _ptx_acc(e, warp, lane)
                key = (wg, warp, lane, e)
                acc[key] = acc.get(key, 0.0) + d[i, tok]


def _store(acc: dict, tile: int, cols: int, out: np.ndarray, stores: np.ndarray, tail: bool) -> None:
    """Each accumulator to the output the kernel's acc_coords names (tokens < m; with ``tail`` columns < N, as
    store_output masks them; without it a column past N is a store outside the output)."""
    m, n = out.shape
    for (wg, warp, lane, e), v in acc.items():
        i, tok = acc_coords(e, warp, lane)
        col = tile * cols + (wg - 1) * 64 + i
        assert tail or col < n, f"column {col} stored past N={n}"
        if tok < m and col < n:
            out[tok, col] = v
            stores[tok, col] += 1


def _walk(cfg, x: np.ndarray, w: np.ndarray, out: np.ndarray, stores: np.ndarray) -> None:
    """The ``persist`` walk: CTA b takes row groups b, b + grid, ...; its ring runs on across them (global chunk g),
    and the tokens land once, with the first group's chunks, in the resident region after the ring."""
    n, k = w.shape
    nt, cols, stages = cfg.nt, cfg.cols, cfg.stages
    chunks = k // WGMMA_K
    tokens = stages * cfg.wgmma_stage
    grid = cfg.grid(n)
    for b in range(grid):
        smem = np.full((tokens + cfg.wgmma_tokens) // 2, np.nan)  # bf16 slots; unwritten ones poison a product
        for it, tile in enumerate(range(b, cfg.row_groups(n), grid)):
            acc = {}
            for c in range(chunks):
                stage = ring_slot(walk_chunk(tile, b, grid, c, chunks), stages)[0] * cfg.wgmma_stage
                kx, row = box_coords(c, tile, cols)
                _write_box(smem, stage, w, kx, row, cols)
                if it == 0:
                    _copy_tokens(smem, x, kx, tokens + walk_tokens(c, nt), 0, nt)
                for wg in range(1, cols // 64 + 1):
                    _multiply(smem, acc, operand_addrs(stage, wg, cols)[0], tokens + walk_tokens(c, nt), wg, nt)
            _store(acc, tile, cols, out, stores, cfg.tail)


def run(cfg, x: np.ndarray, w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(out[m, n] as the kernel stores it, NaN where never stored; stores[m, n] per output) for tokens x, weight w."""
    m, k = x.shape
    n = w.shape[0]
    nt, cols, split, stages = cfg.nt, cfg.cols, cfg.split, cfg.stages
    out = np.full((m, n), np.nan)
    stores = np.zeros((m, n), dtype=np.int32)
    if cfg.wgmma_walk:
        _walk(cfg, x, w, out, stores)
        return out, stores
    chunks = k // cfg.k_step
    for tile in range(cfg.row_groups(n)):
        total = {}  # (consumer warpgroup, warp, lane, e) -> sum over the cluster's ranks
        for rank in range(split):
            smem = np.full(stages * cfg.wgmma_stage // 2, np.nan)  # bf16 slots; unwritten ones poison a product
            acc = {}
            for c in range(chunks):
                stage = ring_slot(c, stages)[0] * cfg.wgmma_stage
                kx, row = box_coords(rank * chunks + c, tile, cols)
                _write_box(smem, stage, w, kx, row, cols)
                _copy_tokens(smem, x, kx, stage, cols, nt)
                for wg in range(1, cols // 64 + 1):
                    _multiply(smem, acc, *operand_addrs(stage, wg, cols), wg, nt)
            for key, v in acc.items():
                total[key] = total.get(key, 0.0) + v
        _store(total, tile, cols, out, stores, cfg.tail)
    return out, stores
