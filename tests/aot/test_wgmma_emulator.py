"""The "wgmma" kernel's index math, emulated on CPU (tests/helpers/wgmma_emulator.py): with its own index
functions and a model of TMA's swizzle, cp.async and wgmma's descriptor reads, every output is the exact
product and is stored once; a sabotaged index function gives wrong outputs."""

import numpy as np
import pytest
from helpers import wgmma_emulator

from skinny_gemm.kernels.config import KernelConfig

WG = {"kind": "wgmma", "unroll": 1, "prefetch": False}
CASES = [
    # (config, n, k): every token count class (nt 8 with m < 8, nt 16 with m < 16, ...), one and two consumer
    # warpgroups, a ring shorter than the chunk count (stages reused), cluster splits of 2 and 4
    (KernelConfig(m=1, threads=256, k_threads=256, cols=64, stages=2, **WG), 128, 256),
    (KernelConfig(m=8, threads=256, k_threads=256, cols=64, stages=4, split=2, **WG), 64, 512),
    (KernelConfig(m=12, threads=384, k_threads=384, cols=128, stages=2, **WG), 256, 192),
    (KernelConfig(m=16, threads=256, k_threads=256, cols=64, stages=3, split=4, **WG), 64, 512),
    # nt 24 and 32 (vLLM's graph sizes past 16): two copy turns, of 96 and 128 copiers; rows 20..23 zeros
    (KernelConfig(m=20, threads=384, k_threads=384, cols=128, stages=2, **WG), 128, 192),
    (KernelConfig(m=32, threads=256, k_threads=256, cols=64, stages=2, split=2, **WG), 64, 512),
    (KernelConfig(m=24, threads=256, k_threads=256, cols=64, stages=3, split=4, **WG), 128, 1024),
    # the walk: 3 CTAs over 7 row groups (1-3 groups each, the ring's chunk count running on across them, 3
    # stages against 4 chunks per group); one over 2 groups of two consumers, tokens 9..15 zeros
    (KernelConfig(m=12, threads=256, k_threads=256, cols=64, stages=3, static_k=256, persist=3, **WG), 448, 256),
    (KernelConfig(m=9, threads=384, k_threads=384, cols=128, stages=2, static_k=128, persist=1, **WG), 256, 128),
    # walks at nt 8 and 32 (two copy turns into the resident chunks), without PDL
    (KernelConfig(m=5, threads=256, k_threads=256, cols=64, stages=2, static_k=256, persist=2, **WG), 192, 256),
    (
        KernelConfig(m=32, threads=256, k_threads=256, cols=64, stages=2, static_k=192, persist=2, pdl=False, **WG),
        320,
        192,
    ),
    # tails: N = 200 in two 128-row groups (rows 200..255 of the second box land as zeros, their stores masked),
    # and a walk of 2 CTAs over 5 64-row groups ending at N = 300
    (KernelConfig(m=16, threads=384, k_threads=384, cols=128, stages=2, tail=True, **WG), 200, 192),
    (
        KernelConfig(m=8, threads=256, k_threads=256, cols=64, stages=2, static_k=256, persist=2, tail=True, **WG),
        300,
        256,
    ),
]


def _inputs(m, n, k, seed=0):
    gen = np.random.default_rng(seed)
    # small integers: every product and sum is exact in float64 (and in the fp32 the kernel accumulates in)
    return gen.integers(-8, 9, (m, k)).astype(np.float64), gen.integers(-8, 9, (n, k)).astype(np.float64)


@pytest.mark.parametrize("cfg, n, k", CASES, ids=[f"{c.name}-n{n}-k{k}" for c, n, k in CASES])
def test_every_output_is_the_exact_product_stored_once(cfg, n, k):
    cfg.check(n=n, k=k)
    x, w = _inputs(cfg.m, n, k)
    out, stores = wgmma_emulator.run(cfg, x, w)
    assert (stores == 1).all(), np.argwhere(stores != 1)[:5]
    np.testing.assert_array_equal(out, x @ w.T)


@pytest.mark.parametrize(
    "name, fake",
    [
        ("token rows unswizzled", lambda cols, r, j: cols * 128 + r * 128 + j * 16),
        ("token rows swapped in pairs", lambda cols, r, j: cols * 128 + (r ^ 1) * 128 + ((j ^ (r % 8)) * 16)),
        # at nt = 32: the second turn copies the first turn's chunks again, so token rows 16..31 are never written
        ("second turn repeating the first", lambda t, turn, copiers: (t // 8, t % 8)),
        # the walk's resident chunks all in one place: every group multiplies the last chunk's tokens
        ("walk tokens in one chunk", lambda c, nt: 0),
        # the walk's chunks overlapping by a row
        ("walk tokens a row short", lambda c, nt: c * (nt - 1) * 128),
        # a row's 16-byte chunks read in swapped pairs
        ("token source chunks swapped", lambda r, j, kk, k0: r * kk + k0 + (j ^ 1) * 8),
        (
            "accumulator rows of the other half",
            lambda e, warp, lane: (warp * 16 + lane // 4 + 8 * (e % 2), 8 * (e // 4) + 2 * (lane % 4) + (e // 2) % 2),
        ),
        (
            "accumulator lanes transposed",
            lambda e, warp, lane: (warp * 16 + (lane % 8), 8 * (e // 4) + 2 * (lane // 8) + e % 2),
        ),
    ],
)
def test_a_wrong_index_function_gives_wrong_outputs(monkeypatch, name, fake):
    """Negative controls: the check above fails when one of the kernel's index functions is wrong."""
    cfg, n, k = {"secon": CASES[5], "walk ": CASES[8]}.get(name[:5], CASES[1])
    target = {"token": "token_dst", "secon": "token_chunk", "walk ": "walk_tokens"}.get(name[:5], "acc_coords")
    target = "token_src" if name.startswith("token source") else target
    monkeypatch.setattr(wgmma_emulator, target, fake)
    x, w = _inputs(cfg.m, n, k)
    out, stores = wgmma_emulator.run(cfg, x, w)
    assert not ((stores == 1).all() and np.array_equal(out, x @ w.T)), name
