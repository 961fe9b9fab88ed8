"""The "mma" ring (kernels/skinny_mma.py, ``ring``) on CPU: the kernel's slot function gives every lane, warp,
stage, step and operand its own 16-byte slot inside the launch's dynamic shared memory, and the kernel's
order of copies, commits and waits (``pipeline``, replayed by tests/helpers/ring_emulator.py with cp.async
modelled adversarially) reads every stage's own bytes and never overwrites unread ones; sabotaged orders are
caught."""

import pytest
from helpers import ring_emulator

from skinny_gemm.kernels.config import KernelConfig
from skinny_gemm.kernels.skinny_mma import RING_SLOT, WARP, pipeline, ring_slot

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
IDS = [f"{c.name}-k{k}" for c, k in CASES]


def _base(cfg, warp, lane):
    """The kernel's slot 0 of a lane: its warp's share of the ring, then 16 bytes per lane."""
    return warp * cfg.ring_smem // (cfg.threads // WARP) + lane * RING_SLOT


@pytest.mark.parametrize("cfg, k", CASES, ids=IDS)
def test_every_slot_is_its_own_and_inside_the_ring(cfg, k):
    cfg.check(n=cfg.cols_per_cta, k=k)
    seen = set()
    for warp in range(cfg.threads // WARP):
        for lane in range(WARP):
            for buf in range(cfg.stages):
                for u in range(cfg.unroll):
                    for part in range(cfg.mma_tiles + cfg.token_loads):
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
