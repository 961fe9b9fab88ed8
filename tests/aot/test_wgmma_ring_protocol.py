"""The "wgmma" kernel's ring protocol, run on a model of its mbarriers under random interleavings (CPU).

The schedule is the kernel's own (skinny_wgmma.walk_chunk and ring_slot, which produce, produce_walk and multiply
call); the model is of the hardware: a barrier's phase completes when its pending arrivals and its expected
transaction bytes both reach zero, a wait on parity p returns once the phase of that parity has completed, a TMA
box and a cp.async land some time after they are issued, and a copier's cp.async arrive fires only after its own
earlier copies have landed. Every consumer read must find its stage holding the chunk it expects and the tokens of
that chunk landed, and every schedule must finish (a wait that never returns is a deadlock). The emulator
(test_wgmma_emulator.py) checks the index math; this checks the order.
"""

import random

import pytest

from skinny_gemm.kernels import skinny_wgmma
from skinny_gemm.kernels.skinny_wgmma import ring_slot, walk_chunk

BOX = 64 * 128  # the weight box's bytes: any nonzero count stands for it


class Barrier:
    def __init__(self, count):
        self.count, self.pending, self.tx, self.phase = count, count, 0, 0

    def arrive(self, expect_tx=0):
        self.tx += expect_tx
        self.pending -= 1
        assert self.pending >= 0, "more arrivals than the barrier's count in one phase"
        self._complete()

    def land(self, nbytes):
        self.tx -= nbytes
        self._complete()

    def _complete(self):
        if self.pending == 0 and self.tx == 0:
            self.phase += 1
            self.pending = self.count

    def passed(self, parity):
        return self.phase & 1 != parity


def run(stages, chunks, groups, nct, bidx, copiers, consumers, walk, seed):
    """One CTA's producer threads and consumer warpgroups over its row groups, interleaved by ``seed``."""
    rnd = random.Random(seed)
    full = [Barrier(1 + copiers) for _ in range(stages)]
    empty = [Barrier(consumers) for _ in range(stages)]
    held = [None] * stages  # (group, chunk) the stage's weight box holds
    stage_tokens = [dict() for _ in range(stages)]  # plain kind: copier -> chunk its tokens in the stage are of
    resident = {}  # walk: chunk -> copiers whose tokens of it landed
    inflight = []  # ("box", stage, (group, chunk)) / ("copy", copier, chunk, stage) / ("arrive", copier, stage)
    tiles = list(range(bidx, groups, nct)) if walk else [bidx]

    def chunk_count(tile, c):
        return walk_chunk(tile, bidx, nct, c, chunks) if walk else c

    def producer(t):
        if t == 0:
            for s in range(stages):
                full[s].arrive(BOX)
                inflight.append(("box", s, (tiles[0], s)))
        for tile in tiles:
            for c in range(chunks):
                g = chunk_count(tile, c)
                s, _, released = ring_slot(g, stages)
                if g >= stages:
                    while not empty[s].passed(released):
                        yield
                    if t == 0:
                        full[s].arrive(BOX)
                        inflight.append(("box", s, (tile, c)))
                if not walk or tile == tiles[0]:
                    inflight.append(("copy", t, c, s))
                inflight.append(("arrive", t, s))
                yield

    def consumer():
        for tile in tiles:
            for c in range(chunks):
                s, landed, _ = ring_slot(chunk_count(tile, c), stages)
                while not full[s].passed(landed):
                    yield
                assert held[s] == (tile, c), f"stage {s} holds {held[s]}, the consumer expects {(tile, c)}"
                if walk:
                    assert len(resident.get(c, ())) == copiers, f"tokens of chunk {c} not all landed"
                else:
                    assert all(stage_tokens[s].get(t) == c for t in range(copiers)), f"stage {s}'s tokens stale"
                yield
                empty[s].arrive()

    threads = [producer(t) for t in range(copiers)] + [consumer() for _ in range(consumers)]
    idle = 0
    while threads or inflight:
        if inflight and (not threads or rnd.random() < 0.5):
            i = rnd.randrange(len(inflight))
            event = inflight[i]
            if event[0] == "arrive" and any(e[0] == "copy" and e[1] == event[1] for e in inflight[:i]):
                continue  # a copier's arrive waits for its own earlier copies
            inflight.pop(i)
            if event[0] == "box":
                held[event[1]] = event[2]
                full[event[1]].land(BOX)
            elif event[0] == "copy":
                _, t, c, s = event
                if walk:
                    resident.setdefault(c, set()).add(t)
                else:
                    stage_tokens[s][t] = c
            else:
                full[event[2]].arrive()
            idle = 0
            continue
        thread = rnd.choice(threads)
        try:
            next(thread)
        except StopIteration:
            threads.remove(thread)
        idle += 1
        if idle > 20000:
            raise RuntimeError("deadlock: no thread can move and nothing is in flight")


# (stages, chunks per group, row groups, CTAs, copiers, consumer warpgroups): rings shorter than a group and
# as long, groups per CTA from 1 to 5
SHAPES = [(2, 2, 5, 2, 3, 1), (3, 4, 7, 3, 2, 2), (4, 4, 9, 2, 3, 2), (4, 6, 13, 5, 2, 2), (6, 8, 11, 2, 2, 1)]


@pytest.mark.parametrize("walk", [False, True], ids=["plain", "walk"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"s{s[0]}-c{s[1]}-g{s[2]}-n{s[3]}" for s in SHAPES])
def test_every_read_finds_its_chunk_and_no_schedule_deadlocks(shape, walk):
    stages, chunks, groups, nct, copiers, consumers = shape
    for bidx in range(nct):
        for seed in range(12):
            run(stages, chunks, groups, nct, bidx, copiers, consumers, walk, seed)


@pytest.mark.parametrize(
    "name, target, fake",
    [
        # each row group restarts the count: the second group waits on parities the first already used
        ("count restarts per group", "walk_chunk", lambda tile, bidx, nct, c, chunks: c),
        # the producer refills a stage without waiting for its release
        (
            "refill before the release",
            "ring_slot",
            lambda g, stages: (g % stages, (g // stages) & 1, (g // stages) & 1),
        ),
        # the consumers read a stage one phase early
        (
            "read before the box lands",
            "ring_slot",
            lambda g, stages: (g % stages, ((g // stages) + 1) & 1, ((g // stages) - 1) & 1),
        ),
    ],
)
def test_a_wrong_schedule_is_caught(monkeypatch, name, target, fake):
    """Negative controls: each sabotaged schedule function stalls or reads a stale stage in some interleaving."""
    monkeypatch.setitem(globals(), target, fake)
    monkeypatch.setattr(skinny_wgmma, target, fake)
    with pytest.raises((AssertionError, RuntimeError)):
        for seed in range(40):
            run(3, 4, 7, 3, 0, 2, 2, True, seed)
