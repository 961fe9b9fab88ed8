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
