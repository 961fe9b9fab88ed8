"""The "mma" ring's schedule (kernels/skinny_mma.py, ``ring``), emulated for one lane on CPU.

The kernel's order of copies, commits, waits and reads is replayed here with its own slot function
(``skinny_mma.ring_slot``) against an adversarial model of cp.async: a copy lands in shared memory only when a
``cp.async.wait_group N`` forces its group (every group but the N newest), so a read of a slot whose copy is
still in flight sees the old bytes. Each slot holds what was last copied there as (operand, stage, step); a
read must find its own stage's operand, and a copy must not overwrite a slot whose bytes were never read.

Knobs (``skew``) let a test sabotage the schedule the way a wrong edit of the kernel would.
"""

from __future__ import annotations

from dataclasses import dataclass, field

WARP, SLOT = 32, 16


@dataclass
class Lane:
    """One lane's view: shared memory slots (address -> content), in-flight groups, the open group."""

    memory: dict = field(default_factory=dict)
    unread: set = field(default_factory=set)
    groups: list = field(default_factory=list)  # committed, not yet forced: [[(addr, content), ...], ...]
    open: list = field(default_factory=list)  # issued since the last commit
    errors: list = field(default_factory=list)
    reads: int = 0

    def copy(self, addr, content):
        self.open.append((addr, content))

    def commit(self):
        self.groups.append(self.open)
        self.open = []

    def wait(self, pending):
        while len(self.groups) > pending:
            for addr, content in self.groups.pop(0):
                if addr in self.unread:
                    self.errors.append(f"slot {addr} overwritten by {content} before {self.memory[addr]} was read")
                self.memory[addr] = content
                self.unread.add(addr)

    def read(self, addr, want):
        got = self.memory.get(addr)
        if got != want:
            self.errors.append(f"slot {addr} read {got}, wanted {want}")
        self.unread.discard(addr)
        self.reads += 1


def run(cfg, ring_slot, k: int, skew: dict | None = None) -> Lane:
    """Replay lane 0 of warp 0 over a K range of ``k`` (the warp's share: k // k_step trips); returns the lane.

    ``ring_slot(cfg, base, buf, u, part)`` is the kernel's slot function. ``skew`` sabotages: "wait" adds to
    every wait's pending count, "refill" shifts the buffer a trip refills.
    """
    skew = skew or {}
    D, U = cfg.stages, cfg.unroll
    parts = cfg.mma_tiles + cfg.token_loads
    trips = k // cfg.k_step
    lane = Lane()

    def load(buf, stage, which):
        for u in range(U):
            for p in range(parts):
                if (p < cfg.mma_tiles) == (which == "weight"):
                    lane.copy(ring_slot(cfg, 0, buf, u, p), (p, stage, u))

    def mma(buf, stage, pending):
        lane.wait(pending + skew.get("wait", 0))
        for u in range(U):
            for p in range(parts):
                lane.read(ring_slot(cfg, 0, buf, u, p), (p, stage, u))

    # prologue: stages 0..D-2, the weight before the PDL wait, each stage's tokens then a commit
    for j in range(D - 1):
        load(j, j, "weight")
    for j in range(D - 1):
        load(j, j, "token")
        lane.commit()
    for t in range(trips - 1):
        for j in range(D):
            nxt = t * D + j + D - 1
            buf = (j + D - 1 + skew.get("refill", 0)) % D
            load(buf, nxt, "weight")
            load(buf, nxt, "token")
            lane.commit()
            mma(j, t * D + j, D - 1)
    last = trips * D - 1
    load(D - 1, last, "weight")
    load(D - 1, last, "token")
    lane.commit()
    for j in range(D):
        mma(j, (trips - 1) * D + j, D - 1 - j)
    lane.wait(0)
    if lane.unread:
        lane.errors.append(f"{len(lane.unread)} slots copied and never read")
    return lane
