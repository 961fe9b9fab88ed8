"""The "mma" ring's schedule (kernels/skinny_mma.py, ``ring``), emulated for one lane on CPU.

The kernel's own order (``skinny_mma.pipeline``: the list of loads, commits, waits and MMAs it traces) is
replayed here with its own slot function (``skinny_mma.ring_slot``) against an adversarial model of cp.async:
a copy lands in shared memory only when a ``cp.async.wait_group N`` forces its group (every group but the N
newest). Each slot holds what was last copied there as (operand, stage, step); a read must find its own
stage's operand with no copy to it in flight, and a copy must not be issued to a slot whose latest bytes
(landed or in flight) were never read.

Knobs (``skew``) let a test sabotage the order the way a wrong edit of the kernel would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WARP, SLOT = 32, 16


@dataclass
class Lane:
    """One lane's view: shared memory slots (address -> content), in-flight groups, the open group."""

    memory: dict = field(default_factory=dict)
    unread: set = field(default_factory=set)  # slots whose latest copy (landed or in flight) was never read
    pending: dict = field(default_factory=dict)  # slot -> copies issued there that have not landed
    groups: list = field(default_factory=list)  # committed, not yet forced: [[(addr, content), ...], ...]
    open: list = field(default_factory=list)  # issued since the last commit
    errors: list = field(default_factory=list)
    reads: int = 0

    def copy(self, addr, content):
        if addr in self.unread:
            self.errors.append(f"slot {addr}: {content} copied over bytes never read")
        self.unread.add(addr)
        self.pending[addr] = self.pending.get(addr, 0) + 1
        self.open.append((addr, content))

    def commit(self):
        self.groups.append(self.open)
        self.open = []

    def wait(self, pending):
        while len(self.groups) > pending:
            for addr, content in self.groups.pop(0):
                self.memory[addr] = content
                self.pending[addr] -= 1

    def read(self, addr, want):
        if self.pending.get(addr):
            self.errors.append(f"slot {addr} read while its copy is in flight")
        got = self.memory.get(addr)
        if got != want:
            self.errors.append(f"slot {addr} read {got}, wanted {want}")
        self.unread.discard(addr)
        self.reads += 1


def run(cfg, ring_slot, pipeline, k: int, skew: dict | None = None) -> Lane:
    """Replay lane 0 of warp 0 over a K range of ``k`` (k // k_step trips); returns the lane.

    ``ring_slot(cfg, base, buf, u, part)`` is the kernel's slot function and ``pipeline(stages)`` its order
    (kernels/skinny_mma.py): the fill, one trip (repeated), the peeled last trip. ``skew`` sabotages:
    "wait" adds to every wait's pending count, "refill" shifts the buffer a trip's loads fill.
    """
    skew = skew or {}
    D, U = cfg.stages, cfg.unroll
    parts = cfg.mma_tiles + cfg.token_loads
    trips = k // cfg.k_step
    lane = Lane()
    first, trip, last = pipeline(D)

    def replay(steps, base, shift=0):
        for op, *args in steps:
            if op in ("weight", "token"):
                buf, stage = (args[0] + shift) % D, base + args[1]
                for u in range(U):
                    for p in range(parts):
                        if (p < cfg.mma_tiles) == (op == "weight"):
                            lane.copy(ring_slot(cfg, 0, buf, u, p), (p, stage, u))
            elif op == "commit":
                lane.commit()
            elif op == "mma":
                buf, pending = args
                lane.wait(pending + skew.get("wait", 0))
                for u in range(U):
                    for p in range(parts):
                        lane.read(ring_slot(cfg, 0, buf, u, p), (p, base + buf, u))
            elif op != "pdl wait":
                lane.errors.append(f"unknown op {op}")

    replay(first, 0)
    for t in range(trips - 1):
        replay(trip, t * D, skew.get("refill", 0))
    replay(last, (trips - 1) * D)
    lane.wait(0)
    if lane.unread:
        lane.errors.append(f"{len(lane.unread)} slots copied and never read")
    return lane


def run_walk(cfg, ring_slot, fill, order, close, groups: list, skew: dict | None = None) -> Lane:
    """Replay lane 0 of warp 0 of a ``persist`` walk with ``ring`` over the row groups ``groups`` (one CTA's, in
    walk order); returns the lane after the kernel's close.

    ``fill(stages)``, ``order(stages, steps)`` and ``close`` are the kernel's (``skinny_mma.walk_fill`` /
    ``walk_ring`` / ``WALK_CLOSE``, whose waits must leave no copy in flight at exit): the
    first group's first stages, then per group its loads (WEIGHT: this group's stage, NEXT: the next group's, past
    the last this one's again), commits and MMAs. Only the weight goes through the ring (the tokens stay in
    registers), so a slot's content is (tile, group, stage, step). The last group's NEXT copies are never read:
    they must have landed by the end and are returned in ``lane.unread``. ``skew`` "wait" adds to every MMA's
    wait's pending count, "refill" shifts the buffer each load fills.
    """
    skew = skew or {}
    D, U = cfg.stages, cfg.unroll
    steps = cfg.warp_steps // U
    lane = Lane()

    def copy(buf, stage, group):
        for u in range(U):
            for p in range(cfg.ring_operands):
                lane.copy(ring_slot(cfg, 0, buf, u, p), (p, group, stage, u))

    for op, *args in fill(D):
        if op == "weight":
            copy(args[0], args[1], groups[0])
        else:
            lane.commit()
    for i, group in enumerate(groups):
        ahead = groups[i + 1] if i + 1 < len(groups) else group
        for op, *args in order(D, steps):
            if op in ("weight", "next group's weight"):
                copy((args[0] + skew.get("refill", 0)) % D, args[1], group if op == "weight" else ahead)
            elif op == "commit":
                lane.commit()
            elif op == "mma":
                buf, stage, pending = args
                lane.wait(pending + skew.get("wait", 0))
                for u in range(U):
                    for p in range(cfg.ring_operands):
                        lane.read(ring_slot(cfg, 0, buf, u, p), (p, group, stage, u))
            else:
                lane.errors.append(f"unknown op {op}")
    for _, pending in close:
        lane.wait(pending)
    if any(lane.pending.values()):
        lane.errors.append(f"{sum(lane.pending.values())} copies still in flight when the CTA exits")
    return lane
