"""The "mma" walk (``persist`` with kind "mma", kernels/skinny_mma.py ``walk``) on CPU: its order replayed over a
CTA's row groups, its index math (tests/helpers/index_emulator.py), its config rules, with negative controls."""

import dataclasses

import numpy as np
import pytest
from helpers import index_emulator
from helpers.index_emulator import coverage, walk_pointers

from skinny_gemm.kernels.config import ConfigError, KernelConfig
from skinny_gemm.kernels.skinny_mma import MMA, NEXT, WEIGHT, walk_order


def replay(stages, steps, groups, order=walk_order):
    """A CTA's walk over ``groups`` (row group indices, in order) with register buffers; returns the errors.

    The fill puts the first group's stages 0..stages-2 in buffers 0..stages-2. Each group replays ``order``: WEIGHT
    loads (this group, stage), NEXT (the next group, or past the last this one again, stage). An MMA must find
    (this group, its step) in buffer step % stages, and no load may overwrite a buffer whose stage no MMA has read.
    """
    D = stages
    buf = {j: (groups[0], j) for j in range(D - 1)}
    unread = set(buf)
    errors, consumed = [], []
    for i, rg in enumerate(groups):
        ahead = groups[i + 1] if i + 1 < len(groups) else rg
        for op, b, arg in order(D, steps):
            if op in (WEIGHT, NEXT):
                if b in unread:
                    errors.append(f"group {rg}: a load into buffer {b} overwrites {buf[b]} before its MMA")
                buf[b] = (rg if op == WEIGHT else ahead, arg)
                unread.add(b)
            else:
                assert op == MMA
                if buf.get(b) != (rg, arg):
                    errors.append(f"group {rg}: the MMA of step {arg} finds {buf.get(b)} in buffer {b}")
                unread.discard(b)
                consumed.append((rg, arg))
    if consumed != [(rg, s) for rg in groups for s in range(steps)]:
        errors.append(f"steps consumed out of order: {consumed[:8]}")
    return errors


ORDER_CASES = [(d, s, g) for d in (2, 3, 4, 8) for s in (d, 2 * d, 4 * d) for g in (1, 2, 5)]


@pytest.mark.parametrize("stages, steps, ngroups", ORDER_CASES)
def test_every_mma_reads_its_own_group_and_step(stages, steps, ngroups):
    assert replay(stages, steps, [3 + 7 * i for i in range(ngroups)]) == []


def test_the_last_trip_loads_the_next_groups_fill():
    """The group's last stages - 1 loads are the next group's stages 0..stages-2, into buffers 0..stages-2: the
    fill the next group starts from, so the stream does not stop at the epilogue."""
    for d, s in ((2, 4), (4, 8), (8, 16)):
        loads = [op for op in walk_order(d, s) if op[0] != MMA]
        assert loads[-(d - 1) :] == [(NEXT, j, j) for j in range(d - 1)]
        assert all(op[0] == WEIGHT for op in loads[: -(d - 1)])


@pytest.mark.parametrize("stages, steps", [(2, 4), (4, 8), (8, 8)])
def test_refilling_the_buffer_about_to_be_read_is_caught(stages, steps):
    """Negative control: an order whose refill before step s goes into buffer s % stages (the one its MMA reads)."""

    def clobber(d, n):
        return [(op, (b + 1) % d, arg) if op != MMA else (op, b, arg) for op, b, arg in walk_order(d, n)]

    assert replay(stages, steps, [0, 5, 9], order=clobber) != []


def test_a_next_group_load_of_the_wrong_group_is_caught():
    """Negative control: the last trip's refills taken from this group's rows (WEIGHT) instead of the next one's."""

    def stale(d, n):
        return [(WEIGHT if op == NEXT else op, b, arg) for op, b, arg in walk_order(d, n)]

    assert replay(4, 8, [0, 5, 9], order=stale) != []


WALK = {"kind": "mma", "vec": 8, "unroll": 1, "prefetch": False, "fetch": 128}
CASES = [
    # (config, n, k): grids that leave the CTAs 1-3 row groups each
    (KernelConfig(m=16, threads=512, k_threads=512, cols=16, stages=4, static_k=4096, persist=3, **WALK), 16 * 7, 4096),
    (
        KernelConfig(
            m=16,
            threads=512,
            k_threads=512,
            cols=8,
            stages=2,
            slices=2,
            token_groups=2,
            static_k=4096,
            persist=5,
            **WALK,
        ),
        8 * 13,
        4096,
    ),
    (
        KernelConfig(m=8, threads=512, k_threads=256, cols=8, stages=4, slices=2, static_k=4096, persist=4, **WALK),
        16 * 9,
        4096,
    ),
    (
        KernelConfig(m=12, threads=256, k_threads=128, cols=8, stages=4, static_k=2048, persist=2, bias=True, **WALK),
        16 * 5,
        2048,
    ),
    (
        KernelConfig(m=4, threads=128, k_threads=128, cols=4, stages=2, slices=4, static_k=2048, persist=3, **WALK),
        4 * 4,
        2048,
    ),
]
IDS = [f"{c.name}-n{n}" for c, n, _ in CASES]


@pytest.mark.parametrize("cfg, n, k", CASES, ids=IDS)
def test_every_k_of_every_output_once(cfg, n, k):
    cfg.check(n=n, k=k)
    assert cfg.grid(n) < n // cfg.cols_per_cta, "the grid caps: some CTA walks two groups or more"
    counts, stored, bad = coverage(cfg, n, k)
    assert bad == []
    assert (stored == 1).all(), np.argwhere(stored != 1)[:5]
    assert (counts == 1).all(), np.argwhere(counts != 1)[:5]


@pytest.mark.parametrize("cfg, n, k", CASES[:2], ids=IDS[:2])
def test_negative_control_one_group_per_cta_leaves_outputs_unstored(cfg, n, k, monkeypatch):
    """A walk whose CTAs stop after their first row group: the rows past the grid are never stored."""
    monkeypatch.setattr(index_emulator, "row_groups", lambda cfg, n, cta: [cta])
    _, stored, _ = coverage(cfg, n, k)
    assert (stored[:, : cfg.grid(n) * cfg.cols_per_cta] == 1).all() and (
        stored[:, cfg.grid(n) * cfg.cols_per_cta :] == 0
    ).all()


def test_walk_rules():
    base = KernelConfig(m=16, threads=512, k_threads=512, cols=16, stages=4, static_k=4096, persist=132, **WALK)
    base.check(n=28672, k=4096)
    assert base.warp_steps == 8 and base.register_rule[0] == 8 + 32 + 64
    assert base.register_budget == 128 - 24
    assert base.mma_smem == 2 * 16 * 16 * 16 * 4, "two reduction buffers, one per group parity"
    assert base.launch(28672).grid == 132 and base.launch(28672, persist=False).grid == 28672 // 16
    assert base.name.endswith("_p132")
    for change, rule in (
        (dict(static_k=0), "persist"),
        (dict(prefetch=True), "persist"),
        (dict(ring=True), "persist"),
        (dict(stages=8), "register budget"),  # 8 + 64 + 64 over 104
        (dict(k_threads=256), "register budget"),  # 2 groups of 8 warps: 128 token registers
        (dict(token_stages=2), "persist"),
    ):
        with pytest.raises(ConfigError, match=f"rule '{rule}'"):
            dataclasses.replace(base, **change).check(n=28672, k=4096)
    # without PDL the walk stays a walk (the decode phase's no-PDL twin keeps it)
    dataclasses.replace(base, pdl=False).check(n=28672, k=4096)


@pytest.mark.parametrize("cfg, n, k", CASES, ids=IDS)
def test_each_group_prefetches_the_next_and_the_last_its_own_rows(cfg, n, k):
    """The kernel's pointer arithmetic, replayed: a group's ``ahead`` is the next group's ``here`` (the CTA's last
    group: its own, rows that exist), ``here`` steps by whole row groups, and the reduction buffers alternate."""
    r_half, span = k // 2, cfg.cols_per_cta * (k // 2)
    for cta in range(cfg.grid(n)):
        walk = walk_pointers(cfg, n, k, cta)
        assert [rg for rg, *_ in walk] == list(range(cta, n // cfg.cols_per_cta, cfg.grid(n)))
        for (rg, here, ahead, parity), after in zip(walk, walk[1:] + [None]):
            assert here == rg * cfg.cols_per_cta * r_half and here % span == 0
            assert ahead == (after[1] if after else here)
            assert parity == (after[3] ^ 1 if after else parity)
