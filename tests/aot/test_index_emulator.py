"""The tail and M <= 16 index math, emulated on CPU (tests/helpers/index_emulator.py): every k of every
stored output is added exactly once, every output is stored once, and nothing outside W or A is read."""

import dataclasses

import numpy as np
import pytest
from helpers.index_emulator import coverage

from skinny_gemm.kernels.config import KernelConfig

MMA = {"kind": "mma", "vec": 8, "unroll": 1, "stages": 4, "prefetch": False}
CASES = [
    # (config, n, k): small N (a few CTAs, the last one partial) at the real tail K
    (KernelConfig(m=1, threads=256, k_threads=256, cols=4, unroll=1, tail=True), 4 * 3 + 2, 3696),
    (KernelConfig(m=4, threads=256, k_threads=256, cols=2, unroll=2, early=True, prefetch=False, tail=True), 5, 7392),
    (KernelConfig(m=2, threads=256, k_threads=32, cols=8, unroll=2, tail=True), 64 + 32, 2880),
    (KernelConfig(m=16, threads=256, k_threads=256, cols=1, unroll=1, bias=True, tail=True), 3, 3696),
    (KernelConfig(m=3, threads=128, k_threads=32, cols=2, vec=4, unroll=2, tail=True), 8 + 3, 456),
    (KernelConfig(m=8, threads=256, k_threads=32, cols=8, tail=True, **MMA), 64 + 32, 2880),
    (KernelConfig(m=16, threads=256, k_threads=256, cols=8, tail=True, **MMA), 8 + 5, 2880),
    (KernelConfig(m=16, threads=512, k_threads=128, cols=16, tail=True, bias=True, **MMA), 64 + 8, 5376),
    (KernelConfig(m=4, threads=256, k_threads=256, cols=4, slices=4, tail=True, **MMA), 4 + 2, 7392),
    (KernelConfig(m=8, threads=128, k_threads=128, cols=4, slices=2, tail=True, **MMA), 4 + 3, 2880),
    (KernelConfig(m=2, threads=128, k_threads=128, cols=1, slices=8, tail=True, **MMA), 3, 5376),
    (KernelConfig(m=12, threads=256, k_threads=128, cols=16, **MMA), 32, 2048),
    (KernelConfig(m=16, threads=256, k_threads=256, cols=8, **MMA), 16, 4096),
    (KernelConfig(m=16, threads=256, k_threads=256, cols=1, unroll=2), 4, 4096),
    # the sliced M = 8 picks of long K (slice-long, 2026-12-03): 7, 32 and 5 K-loop trips
    (KernelConfig(m=8, threads=256, k_threads=256, cols=16, slices=2, **MMA), 32, 14336),
    (KernelConfig(m=8, threads=64, k_threads=64, cols=8, slices=2, **{**MMA, "stages": 8}), 16, 32768),
    (KernelConfig(m=8, threads=128, k_threads=128, cols=16, slices=2, **MMA), 32, 5120),
    # sliced CTAs with more outputs than threads (m x cols > k_threads): each thread stores 2 or 3 in turns
    (KernelConfig(m=8, threads=128, k_threads=128, cols=32, slices=2, **{**MMA, "stages": 2}), 64, 4096),
    (KernelConfig(m=4, threads=32, k_threads=32, cols=20, slices=2, tail=True, **MMA), 20 + 7, 2880),
    # ... with 4 row groups per CTA (3 turns, tails, bias), and with 4 slices (3 turns, tails)
    (KernelConfig(m=8, threads=256, k_threads=64, cols=24, slices=2, tail=True, bias=True, **MMA), 96 + 5, 2880),
    (KernelConfig(m=4, threads=128, k_threads=32, cols=20, slices=4, tail=True, **{**MMA, "stages": 2}), 80 + 9, 2880),
    # token groups: 16 tokens on sliced tiles, the groups sharing each weight fragment
    (KernelConfig(m=16, threads=128, k_threads=128, cols=4, slices=2, token_groups=2, tail=True, **MMA), 4 + 1, 3696),
    (KernelConfig(m=16, threads=256, k_threads=256, cols=2, slices=4, token_groups=4, **MMA), 4, 4096),
    (KernelConfig(m=8, threads=128, k_threads=128, cols=2, slices=4, token_groups=2, **MMA), 4, 2048),
    (KernelConfig(m=12, threads=256, k_threads=256, cols=8, slices=2, token_groups=2, tail=True, **MMA), 8 + 3, 2880),
    # token groups with turns: 16 tokens x 32 rows over 256 threads, the sweep's widest token-groups CTA
    (
        KernelConfig(m=16, threads=256, k_threads=256, cols=32, slices=2, token_groups=2, **{**MMA, "stages": 2}),
        64,
        4096,
    ),
]
TURNS = [c for c in CASES if c[0].slices > 1 and c[0].outputs_per_thread > 1]


@pytest.mark.parametrize("cfg, n, k", CASES, ids=[f"{c.name}-n{n}-k{k}" for c, n, k in CASES])
def test_every_k_of_every_output_once(cfg, n, k):
    cfg.check(n=n, k=k)
    counts, stored, bad = coverage(cfg, n, k)
    assert bad == []
    assert (stored == 1).all(), np.argwhere(stored != 1)[:5]
    assert (counts == 1).all(), np.argwhere(counts != 1)[:5]


TAILS = [c for c in CASES if c[0].tail]


@pytest.mark.parametrize("cfg, n, k", TAILS, ids=[f"{c.name}-n{n}-k{k}" for c, n, k in TAILS])
def test_negative_control_without_the_tail_misses_k(cfg, n, k):
    """The same shape run by the config without ``tail`` (N cut to whole CTAs) misses or repeats k:
    the check above fails on it."""
    plain = dataclasses.replace(cfg, tail=False)
    assert k % plain.k_step, "every tail case has a K tail"
    counts, _, _ = coverage(plain, n // plain.cols_per_cta * plain.cols_per_cta, k)
    assert not (counts == 1).all()


class _OneTurn:
    """A config whose sliced epilogue stores only one output per thread (the rule before turns)."""

    def __init__(self, cfg):
        self._cfg = cfg

    def __getattr__(self, name):
        return getattr(self._cfg, name)

    outputs_per_thread = 1


@pytest.mark.parametrize("cfg, n, k", TURNS, ids=[f"{c.name}-n{n}-k{k}" for c, n, k in TURNS])
def test_negative_control_one_turn_leaves_outputs_unstored(cfg, n, k):
    """With one output per thread, the outputs past the group's k_threads are never stored: the check above
    fails on it."""
    _, stored, _ = coverage(_OneTurn(cfg), n, k)
    assert (stored == 0).any() and stored.max() == 1
