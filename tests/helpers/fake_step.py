"""A decode step without a GPU: "graphs" record which variants they launch, and a cost function times them."""

from __future__ import annotations


class FakeLib:
    """Stands in for a loaded artifact library: a launch only records the variant's name."""

    def __init__(self):
        self.launched = []

    def launch(self, name, x, w, out, residual, n, k):
        """Record one launch of ``name``."""
        self.launched.append(name)


def fake_step(monkeypatch, cost) -> FakeLib:
    """Patch aot.measure so capture returns the names a graph launches and time_graphs returns cost(names)."""
    from skinny_gemm.aot import measure as ms

    lib = FakeLib()

    def capture(calls):
        lib.launched.clear()
        for call in calls:
            call()
        return tuple(lib.launched)

    monkeypatch.setattr(ms, "capture", capture)
    monkeypatch.setattr(ms, "time_graphs", lambda graphs, per, trials: {key: cost(g) for key, g in graphs.items()})
    return lib


def cand(us: float) -> dict:
    """A correct candidate's result row with isolated time ``us``."""
    return {"config": {}, "bad_elements": 0, "us": us}


# Two shapes: (64, 32) called twice in the TP4 step, (32, 64) once in each of TP4 and TP8.
STEPS = [{"tp": 4, "calls": [[64, 32], [32, 64], [64, 32]]}, {"tp": 8, "calls": [[32, 64]]}]
