"""A decode step without a GPU: "graphs" record which variants they launch, and a cost function times them."""

from __future__ import annotations


class FakeLib:
    """Stands in for a loaded artifact library: a launch only records the variant's name."""

    def __init__(self):
        self.launched = []

    def launch(self, name, x, w, out, residual, n, k):
        """Record one launch of ``name``; "cublas" is no variant of a library (a real one raises KeyError too)."""
        if name == "cublas":
            raise KeyError("variant cublas is not loaded")
        self.launched.append(name)


def fake_step(monkeypatch, cost) -> FakeLib:
    """Patch aot.measure so capture returns the names a graph launches and time_graphs returns cost(names);
    a cuBLAS launch is named "cublas" there (the decode phase's name for cuBLAS as a candidate)."""
    from skinny_gemm.aot import measure as ms
    from skinny_gemm.aot.results import CUBLAS

    lib = FakeLib()
    monkeypatch.setattr(ms, "cublas_call", lambda x, w, out: lambda: lib.launched.append(CUBLAS))

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


# A handmade model file with a step: every op kind, a repeat block, a non-BF16 linear, per-TP sizes.
HAND_MODEL = {
    "name": "hand",
    "linears": {
        "qkv": {"calls_per_step": 2, "tp": {"1": [96, 64], "2": [48, 64]}},
        "down": {"calls_per_step": 2, "tp": {"1": [64, 128], "2": [64, 64]}, "dtype": "fp8"},
        "head": {"calls_per_step": 1, "tp": {"1": [500, 64], "2": [250, 64]}},
    },
    "step": {
        "about": "two handmade layers",
        "tp": [1, 2],
        "context": 10,
        "other_weight_bytes": 1,
        "layers": {
            "layer": [
                {"op": "add_rms_norm", "size": 64},
                {"op": "linear", "linear": "qkv"},
                {"op": "rotary", "size": {"1": 32, "2": 16}},
                {"op": "attention", "kv_bytes_per_token": {"1": 40, "2": 20}},
                {"op": "recurrent", "state_bytes": 1000},
                {"op": "moe", "experts": 4, "top_k": 3, "expert_bytes": {"1": 7, "2": 5}},
                {"op": "linear", "linear": "down"},
                {"op": "all_reduce", "size": 64, "note": "placeholder"},
            ]
        },
        "sequence": [
            {"repeat": 2, "body": [{"layer": "layer"}]},
            {"op": "silu_and_mul", "size": 8},
            {"op": "linear", "linear": "head"},
        ],
    },
}
