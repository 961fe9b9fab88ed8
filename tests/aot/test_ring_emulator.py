"""The "mma" ring (kernels/skinny_mma.py, ``ring``) on CPU: the kernel's slot function gives every lane, warp,
stage, step and operand its own 16-byte slot inside the launch's dynamic shared memory, and the kernel's
order of copies, commits and waits (``pipeline``, replayed by tests/helpers/ring_emulator.py with cp.async
modelled adversarially) reads every stage's own bytes and never overwrites unread ones; sabotaged orders are
caught."""

import pytest
from helpers import ring_emulator

from skinny_gemm.kernels.config import KernelConfig
from skinny_gemm.kernels.skinny_mma import RING_SLOT, WALK_CLOSE, WARP, pipeline, ring_slot, walk_fill, walk_ring

BASE = {"kind": "mma", "vec": 8, "prefetch": False, "fetch": 128, "ring": True}
CASES = [
    # (config, k): M 8 and 16 (one or two token loads), 1-8 tiles, unroll 1 and 2, one trip and several,
    # a cluster split, slices
    (KernelConfig(m=16, threads=128, k_threads=128, cols=32, stages=16, unroll=1, **BASE), 14336),
    (KernelConfig(m=8, threads=256, k_threads=128, cols=16, stages=8, unroll=1, **BASE), 4096),
    (KernelConfig(m=16, threads=128, k_threads=128, cols=64, stages=8, unroll=1, split=2, **BASE), 4096),
    (KernelConfig(m=4, threads=128, k_threads=128, cols=8, stages=3, unroll=2, **BASE), 768),
    (KernelConfig(m=2, threads=128, k_threads=128, cols=8, stages=2, unroll=1, slices=4, **BASE), 1024),
]
WALK = {**BASE, "persist": 132}
# (config, k): the walk with ``ring`` (only the weight in the ring, the tokens in registers): 1 and 2 tiles, a
# warp's K range in one trip (t512) and in two (t256), two token groups, unroll 2
WALKS = [
    (KernelConfig(m=16, threads=512, k_threads=512, cols=16, stages=8, unroll=1, static_k=4096, **WALK), 4096),
    (KernelConfig(m=16, threads=256, k_threads=256, cols=8, stages=8, unroll=1, static_k=4096, **WALK), 4096),
    (
        KernelConfig(
            m=16,
            threads=256,
            k_threads=256,
            cols=8,
            stages=4,
            unroll=1,
            static_k=4096,
            slices=2,
            token_groups=2,
            **WALK,
        ),
        4096,
    ),
    (KernelConfig(m=8, threads=256, k_threads=256, cols=8, stages=2, unroll=2, static_k=5120, **WALK), 5120),
]
WALK_IDS = [f"{c.name}-k{k}" for c, k in WALKS]
IDS = [f"{c.name}-k{k}" for c, k in CASES]


def _base(cfg, warp, lane):
    """The kernel's slot 0 of a lane: its warp's share of the ring, then 16 bytes per lane."""
    return warp * cfg.ring_smem // (cfg.threads // WARP) + lane * RING_SLOT


@pytest.mark.parametrize("cfg, k", CASES + WALKS, ids=IDS + WALK_IDS)
def test_every_slot_is_its_own_and_inside_the_ring(cfg, k):
    cfg.check(n=cfg.cols_per_cta, k=k)
    seen = set()
    for warp in range(cfg.threads // WARP):
        for lane in range(WARP):
            for buf in range(cfg.stages):
                for u in range(cfg.unroll):
                    for part in range(cfg.ring_operands):
                        addr = ring_slot(cfg, _base(cfg, warp, lane), buf, u, part)
                        assert addr % RING_SLOT == 0 and 0 <= addr <= cfg.ring_smem - RING_SLOT
                        seen.add(addr)
    assert len(seen) * RING_SLOT == cfg.ring_smem  # disjoint, and the ring holds nothing else


@pytest.mark.parametrize("cfg, k", CASES, ids=IDS)
def test_the_schedule_reads_each_stage_its_own_copies(cfg, k):
    lane = ring_emulator.run(cfg, ring_slot, pipeline, k)
    assert lane.errors == []
    stages = k // cfg.k_step * cfg.stages  # the warp's K range in stages
    assert lane.reads == stages * cfg.unroll * (cfg.mma_tiles + cfg.token_loads)


@pytest.mark.parametrize("skew", [{"wait": 1}, {"refill": 1}, {"refill": -1}])
def test_a_sabotaged_schedule_is_caught(skew):
    """A wait that lets one more group stay in flight reads stale slots; a refill into the wrong buffer
    overwrites unread bytes or leaves a stage's slots stale."""
    cfg, k = CASES[0]
    assert ring_emulator.run(cfg, ring_slot, pipeline, k, skew).errors


def test_a_sabotaged_slot_function_is_caught():
    cfg, k = CASES[1]
    lane = ring_emulator.run(cfg, lambda c, b, buf, u, p: ring_slot(c, b, buf % 2, u, p), pipeline, k)
    assert lane.errors


def test_a_copy_over_unread_bytes_is_caught_when_issued():
    """The model flags the hazard at the copy, not when it lands: copy A, wait, copy B, read A is a race."""
    lane = ring_emulator.Lane()
    lane.copy(0, "A")
    lane.commit()
    lane.wait(0)
    lane.copy(0, "B")
    lane.read(0, "A")
    assert lane.errors


@pytest.mark.parametrize("edit", ["no commit", "wait one too few", "mma before its refill's commit"])
def test_a_wrong_edit_of_the_kernels_order_is_caught(edit):
    """The order the kernel traces, edited the way a slip would: each edit fails the replay."""
    cfg, k = CASES[1]

    def edited(stages):
        first, trip, last = pipeline(stages)
        if edit == "no commit":
            trip = [op for op in trip if op[0] != "commit"] + [("commit",)]
        elif edit == "wait one too few":
            last = [("mma", op[1], op[2] + 1) if op[0] == "mma" else op for op in last]
        else:
            i = next(i for i, op in enumerate(trip) if op[0] == "commit")
            trip = trip[:i] + [trip[i + 1], trip[i]] + trip[i + 2 :]
        return first, trip, last

    assert ring_emulator.run(cfg, ring_slot, edited, k).errors


def test_a_walks_ring_holds_the_weight_only():
    """The walk's tokens stay in registers: its ring has a slot per weight tile and no token slots."""
    cfg, _ = WALKS[0]
    assert cfg.ring_operands == cfg.mma_tiles
    assert cfg.ring_smem == cfg.threads * cfg.stages * cfg.unroll * cfg.mma_tiles * RING_SLOT


@pytest.mark.parametrize("cfg, k", WALKS, ids=WALK_IDS)
@pytest.mark.parametrize("groups", [[0], [3, 135, 267]])
def test_the_walks_schedule_reads_each_stage_its_own_copies(cfg, k, groups):
    """Every MMA of every group reads its own group's stage (the last trip's refills being the next group's first
    stages); only the last group's refills of its own rows go unread, and they land before the CTA exits."""
    cfg.check(k=k)
    lane = ring_emulator.run_walk(cfg, ring_slot, walk_fill, walk_ring, WALK_CLOSE, groups)
    assert lane.errors == []
    steps = cfg.warp_steps // cfg.unroll
    assert lane.reads == len(groups) * steps * cfg.unroll * cfg.mma_tiles
    assert len(lane.unread) == (cfg.stages - 1) * cfg.unroll * cfg.mma_tiles


@pytest.mark.parametrize(
    "edit",
    [
        "wait one too few",
        "one commit per group",
        "the next group's stages from this group",
        "a refill into the buffer about to be read",
        "no wait before exit",
    ],
)
def test_a_wrong_edit_of_the_walks_order_is_caught(edit):
    """The walk's ring order, edited the way a slip would: each edit fails the replay (a slot read early or
    stale, bytes overwritten unread, or copies still in flight when the CTA exits)."""
    cfg, k = WALKS[1]
    fill, order, close, skew = walk_fill, walk_ring, WALK_CLOSE, None
    if edit == "wait one too few":
        skew = {"wait": 1}
    elif edit == "one commit per group":

        def order(d, n):
            return [op for op in walk_ring(d, n) if op[0] != "commit"] + [("commit",)]
    elif edit == "the next group's stages from this group":

        def order(d, n):
            return [("weight", *op[1:]) if op[0] == "next group's weight" else op for op in walk_ring(d, n)]
    elif edit == "a refill into the buffer about to be read":
        skew = {"refill": 1}
    else:
        close = []
    lane = ring_emulator.run_walk(cfg, ring_slot, fill, order, close, [0, 132, 264], skew)
    assert lane.errors
