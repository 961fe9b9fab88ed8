"""vLLM general plugin: route unquantized BF16 projections whose per-rank (N, K) has a plan to ``skinny_gemm.linear``.

vLLM calls ``register`` in each of its processes (entry point group
``vllm.general_plugins``), the API server too, which never loads a model.
``register`` therefore imports nothing of vLLM: it patches each hooked vLLM
module as soon as that module is imported (at once where it already is), so
a process that never imports vLLM's layers pays nothing. The hooks wrap
methods of vLLM's own classes at run time, never its files:

- ``process_weights_after_loading`` of ``UnquantizedLinearMethod`` and
  ``UnquantizedEmbeddingMethod``: vLLM calls it once per layer after the
  weights are loaded and before CUDA graphs are captured. There each layer's
  local weight shape is matched against the plans for its GPU and, where one
  fits, a ``RoutedApply`` is installed as that layer's quant method ``apply``.
- ``BaseModelLoader.load_model``: after a model is loaded, the routes are put
  into vLLM's compile-cache key (``key_compile_cache``).
- the workers' ``compile_or_warm_up_model``: after vLLM's profile and warm-up
  runs, one summary line (``summary``) says what was routed and how often
  each routed (shape, M) was really called.

Everything that touches vLLM is imported inside the functions that need it, so
this module and the forward it installs (``RoutedApply``, ``install_route``)
import without vLLM: the GPU tests run that forward on machines without vLLM.
Nothing here imports cutlass or compiles anything.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import os
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass

import torch

from . import api
from .manifest import ARCH_FOR_CAPABILITY

ENV_SWITCH = "SKINNY_GEMM_VLLM"
LOG_PREFIX = "skinny-gemm vLLM plugin:"
# The per-layer record; RoutedApply reads it on every call.
LAYER_ATTR = "_skinny_gemm"
ROUTED = "routed"
NO_PLAN = "no plan"
# Outcomes of layers that are not candidates but are reported, so the line accounts for every BF16 projection.
ROUTER = "MoE router"
OWN_KERNEL = "vLLM's own kernel"
# The key of the routes in vLLM's additional_config (key_compile_cache).
CACHE_KEY = "skinny_gemm_routes"
# The custom op a routed layer calls under torch.compile (see RoutedApply).
OP_NAMESPACE = "skinny_gemm_vllm"

# Under vLLM's logger tree, so vLLM's handler and format print it: a logger
# outside "vllm" has no handler and Python drops its INFO records.
logger = logging.getLogger("vllm.skinny_gemm")

# (n, k, device) -> the planned token counts. A module global so that tests can
# swap in a plan table of their own.
planned_ms = api.planned_ms

# (n, k, m) -> calls that reached skinny_gemm.linear through a route in this process.
CALLS: Counter = Counter()

# Attributes by which vLLM's own low-latency GEMMs claim a layer inside its forward,
# bypassing quant_method.apply (DeepSeekV2FusedQkvAProjLinear's dsv3_fused_a_gemm).
_OWN_KERNEL_FLAGS = ("_use_min_latency_gemm",)


@dataclass(frozen=True)
class LayerMatch:
    """What the plugin decided for one layer: its local weight shape, the planned M, and the outcome.

    ``dtype`` is the loaded weight's dtype; ``own_forward`` marks a vLLM layer
    class with a forward of its own, which may bypass the route.
    """

    name: str
    n: int
    k: int
    ms: frozenset
    outcome: str
    dtype: str = "bfloat16"
    own_forward: bool = False

    @property
    def routed(self) -> bool:
        """True when this layer's planned M run through skinny_gemm.linear."""
        return self.outcome == ROUTED


class RoutedApply:
    """The ``apply`` put on a routed layer's quant method: planned M to skinny_gemm.linear, the rest to vLLM's."""

    def __init__(self, original):
        self.original = original

    def __call__(self, layer, x, bias=None):
        """Same signature and result as vLLM's ``apply(layer, x, bias)``."""
        match = getattr(layer, LAYER_ATTR, None)
        if match is not None and match.routed and x.dtype == layer.weight.dtype:
            # vLLM's weights are Parameter subclasses (ModelWeightParameter);
            # skinny_gemm.linear launches only on plain tensors, which
            # detach() gives without a copy.
            if torch.compiler.is_compiling():
                # The token count is symbolic here: branching or counting on it
                # would bake one size into the graph (vLLM drops the guards).
                # The opaque op counts and picks plan or F.linear at run time,
                # as vLLM's own path (F.linear on CUDA) would compute.
                return torch.ops.skinny_gemm_vllm.routed_linear(x, layer.weight.detach(), bias)
            m = x.numel() // match.k
            if m in match.ms:
                CALLS[(match.n, match.k, m)] += 1
                return api.linear(x, layer.weight.detach(), bias)
        return self.original(layer, x, bias)


def _routed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    CALLS[(weight.shape[0], weight.shape[1], x.numel() // x.shape[-1])] += 1
    return api.linear(x, weight, bias)


def _routed_linear_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[:-1] + (weight.shape[0],))


@functools.cache
def define_op() -> None:
    """Register ``skinny_gemm_vllm::routed_linear`` once per process (where a route is first installed)."""
    op = torch.library.custom_op(f"{OP_NAMESPACE}::routed_linear", mutates_args=())(_routed_linear)
    op.register_fake(_routed_linear_fake)


def install_route(quant_method, layer, match: LayerMatch) -> None:
    """Record ``match`` on ``layer`` and, when routed, put a RoutedApply in front of ``quant_method.apply``."""
    setattr(layer, LAYER_ATTR, match)
    if match.routed:
        define_op()
    # One quant method may serve several layers; RoutedApply looks the route up per layer.
    if match.routed and not isinstance(quant_method.__dict__.get("apply"), RoutedApply):
        quant_method.apply = RoutedApply(quant_method.apply)


_warned_values: set = set()


def enabled() -> bool:
    """False only when SKINNY_GEMM_VLLM is 0; any value but 0 or 1 warns once and counts as on."""
    value = os.environ.get(ENV_SWITCH)
    if value is None or value.strip() == "1":
        return True
    if value.strip() == "0":
        return False
    if value not in _warned_values:
        _warned_values.add(value)
        logger.warning("%s %s=%r is neither 0 nor 1: treated as 1 (on)", LOG_PREFIX, ENV_SWITCH, value)
    return True


# ---- hooks, installed when vLLM imports the module that defines them ----------------------------------------------


def _hooks() -> dict[str, list]:
    """Module -> [(class name, method name, wrapper factory)]: what register() patches."""
    return {
        "vllm.model_executor.layers.linear": [
            ("UnquantizedLinearMethod", "process_weights_after_loading", _routing_after_loading)
        ],
        "vllm.model_executor.layers.vocab_parallel_embedding": [
            ("UnquantizedEmbeddingMethod", "process_weights_after_loading", _routing_after_loading)
        ],
        "vllm.model_executor.model_loader.base_loader": [("BaseModelLoader", "load_model", _after_model_loaded)],
        # CPUWorker overrides the method without calling Worker's: both are hooked.
        "vllm.v1.worker.gpu_worker": [("Worker", "compile_or_warm_up_model", _after_warm_up)],
        "vllm.v1.worker.cpu_worker": [("CPUWorker", "compile_or_warm_up_model", _after_warm_up)],
    }


def register() -> None:
    """vLLM's general-plugin entry point: hook vLLM once per process, unless switched off; imports no vLLM module."""
    if not enabled():
        return
    pending = {}
    for module_name, patches in _hooks().items():
        module = sys.modules.get(module_name)
        if module is not None:
            _patch_module(module, patches)
        else:
            pending[module_name] = patches
    if pending and not any(isinstance(f, _PatchOnImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _PatchOnImport(pending))


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """Patches a hooked vLLM module right after it is executed: the import itself is vLLM's, not ours."""

    def __init__(self, pending: dict):
        self.pending = pending

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.pending:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None and spec.loader is not None and hasattr(spec.loader, "exec_module"):
                patches = self.pending.pop(fullname)
                spec.loader = _PatchingLoader(spec.loader, patches)
                return spec
        return None


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patches):
        self.loader = loader
        self.patches = patches

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        self.loader.exec_module(module)
        _patch_module(module, self.patches)

    def __getattr__(self, name):
        # get_source, get_filename, is_package ...: the original loader's (tracebacks, inspect, torch.compile).
        return getattr(self.loader, name)


def _patch_module(module, patches) -> None:
    for cls_name, method, make_wrapper in patches:
        cls = getattr(module, cls_name, None)
        if cls is not None and hasattr(cls, method):
            _patch(cls, method, make_wrapper)


def _patch(cls, name, make_wrapper) -> None:
    original = getattr(cls, name)
    # vLLM loads plugins once per process, but a second register() must not wrap twice.
    if getattr(original, "_skinny_gemm_original", None) is not None:
        return
    wrapper = make_wrapper(original)
    wrapper._skinny_gemm_original = original
    setattr(cls, name, wrapper)


def _routing_after_loading(original):
    @functools.wraps(original)
    def process_weights_after_loading(self, layer):
        # The shape is read before vLLM's own processing, which may repack or
        # drop the weight (it does on CPU); whether F.linear can still use the
        # weight is checked after it.
        weight = getattr(layer, "weight", None)
        loaded = (tuple(weight.shape), weight.dtype, weight.device) if _is_matrix(weight) else None
        result = original(self, layer)
        if loaded is not None:
            match = None
            if _is_candidate(self, layer):
                match = match_layer(self, layer, *loaded)
            elif _is_router(layer):
                match = _reported(layer, *loaded, ROUTER)
            if match is not None:
                install_route(self, layer, match)
        return result

    return process_weights_after_loading


def _after_model_loaded(original):
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        key_compile_cache(kwargs.get("vllm_config", args[0] if args else None), model)
        return model

    return load_model


def _after_warm_up(original):
    @functools.wraps(original)
    def compile_or_warm_up_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        runner = getattr(self, "model_runner", None)
        # A worker without a model (not loaded, or a runner with none): nothing to report. get_model()
        # unwraps vLLM's CUDA-graph wrappers.
        model = runner.get_model() if getattr(runner, "model", None) is not None else None
        if isinstance(model, torch.nn.Module):
            logger.info("%s", summary(model))
        return result

    return compile_or_warm_up_model


def key_compile_cache(vllm_config, model: torch.nn.Module) -> None:
    """Put the routes into ``vllm_config.additional_config``, so vLLM's compile cache keys on them.

    vLLM reuses a saved torch.compile artifact whose key (its env vars and
    config hash) matches and whose traced source files are unchanged. Routing
    changes the graph but neither of those: without this, a graph compiled
    before the wheel was installed would run with it (nothing routed), and one
    compiled with routes would run with SKINNY_GEMM_VLLM=0. The config hash
    covers additional_config; nothing routed leaves it as it was.
    """
    routes = sorted({(m.n, m.k, tuple(sorted(m.ms))) for _, m in layer_matches(model).values() if m.routed})
    if not routes:
        return
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict):
        extra[CACHE_KEY] = [[n, k, list(ms)] for n, k, ms in routes]
    else:
        logger.warning(
            "%s vLLM's additional_config is no dict: its compile cache cannot tell graphs with and without "
            "skinny-gemm apart; set VLLM_DISABLE_COMPILE_CACHE=1 when switching the plugin on or off",
            LOG_PREFIX,
        )


# ---- matching ------------------------------------------------------------------------------------------------------


def _is_matrix(weight) -> bool:
    return isinstance(weight, torch.Tensor) and weight.dim() == 2 and not weight.is_meta


def _is_router(layer) -> bool:
    """vLLM's MoE gate (GateLinear): its own multi-tier router GEMMs; the plugin leaves it alone."""
    gate_linear = getattr(sys.modules.get("vllm.model_executor.layers.fused_moe.router.gate_linear"), "GateLinear", ())
    return bool(gate_linear) and isinstance(layer, gate_linear)


def _is_candidate(quant_method, layer) -> bool:
    """Exactly vLLM's unquantized linear method (not on a MoE router), or its embedding method on an LM head."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
    )

    # Subclasses of the method replace apply; routers use the plain method but run their own GEMMs.
    if type(quant_method) is UnquantizedLinearMethod:
        return not _is_router(layer)
    return type(quant_method) is UnquantizedEmbeddingMethod and isinstance(layer, ParallelLMHead)


def _own_forward(layer) -> bool:
    """True when a subclass of vLLM's linear classes defines forward (it may run its own GEMM, not apply)."""
    for cls in type(layer).__mro__:
        if cls.__module__ in ("vllm.model_executor.layers.linear", "vllm.model_executor.layers.vocab_parallel_embedding"):
            return False
        if "forward" in vars(cls):
            return True
    return False


def _reported(layer, shape, dtype, device, outcome) -> LayerMatch:
    n, k = shape
    name = getattr(layer, "prefix", "") or type(layer).__name__
    return LayerMatch(name=name, n=n, k=k, ms=frozenset(), outcome=outcome, dtype=_dtype_name(dtype))


def _dtype_name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _head_dtype():
    """The model config's head_dtype (an fp32 LM head computes with torch.mm, never apply), or None."""
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    model_config = getattr(config, "model_config", None)
    return getattr(model_config, "head_dtype", None)


def match_layer(quant_method, layer, shape, dtype, device) -> LayerMatch:
    """Decide one layer from its loaded weight's shape, dtype and device; ``layer`` as vLLM's processing left it."""
    from vllm import envs
    from vllm.model_executor.layers.utils import dispatch_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    n, k = shape
    name = getattr(layer, "prefix", "") or type(layer).__name__
    # Planned M per shape whatever the dtype, so every shape without a plan is listed as such.
    ms = frozenset(planned_ms(n, k, device))
    weight = getattr(layer, "weight", None)
    head_dtype = _head_dtype() if isinstance(layer, ParallelLMHead) else None
    if not ms:
        outcome = NO_PLAN
    elif dtype != torch.bfloat16:
        outcome = f"dtype {_dtype_name(dtype)}"
    elif head_dtype is not None and head_dtype != dtype:
        outcome = f"head_dtype {_dtype_name(head_dtype)}"
    elif any(getattr(layer, flag, False) for flag in _OWN_KERNEL_FLAGS):
        outcome = OWN_KERNEL
    elif envs.VLLM_BATCH_INVARIANT:
        outcome = "VLLM_BATCH_INVARIANT"
    elif getattr(quant_method, "_gemm_impl", None) not in (None, dispatch_unquantized_gemm()):
        # The user picked a --linear-backend for these layers: respect it.
        outcome = "linear backend"
    elif not _is_matrix(weight) or tuple(weight.shape) != (n, k):
        outcome = "weight repacked by vLLM"
    else:
        outcome = ROUTED
    return LayerMatch(
        name=name, n=n, k=k, ms=ms, outcome=outcome, dtype=_dtype_name(dtype), own_forward=_own_forward(layer)
    )


def layer_matches(model: torch.nn.Module) -> dict[str, tuple[str, LayerMatch]]:
    """Module name -> (module class name, LayerMatch) for every layer the plugin decided on in ``model``."""
    found = {}
    for name, module in model.named_modules():
        match = module.__dict__.get(LAYER_ATTR)
        if match is not None:
            found[name] = (type(module).__name__, match)
    return found


# ---- the summary line ----------------------------------------------------------------------------------------------


def summary(model: torch.nn.Module, calls: Counter | None = None) -> str:
    """The one log line: GPU and arch, routes and their calls so far, routes never called, shapes without a plan,
    layers skipped and why, layers vLLM's own kernels claim, MoE routers left alone."""
    calls = CALLS if calls is None else calls
    matches = [m for _, m in layer_matches(model).values()]
    weight = next((p for p in model.parameters() if p.device.type != "meta"), None)
    device = weight.device if weight is not None else torch.device("cpu")
    groups = defaultdict(list)
    for m in matches:
        groups[m.outcome].append(m)
    routed = groups.pop(ROUTED, [])
    no_plan = groups.pop(NO_PLAN, [])
    routers = groups.pop(ROUTER, [])
    own = groups.pop(OWN_KERNEL, [])
    shapes = {(m.n, m.k): m.ms for m in routed}
    called = {(n, k, m): c for (n, k, m), c in calls.items() if m in shapes.get((n, k), ())}
    never = [m for m in routed if not any((m.n, m.k) == key[:2] for key in called)]
    candidates = len(matches) - len(routers)
    parts = [
        f"{LOG_PREFIX} {_describe_device(device)}: routed {len(routed)} of {candidates} unquantized layers"
        + (f": {_by_shape(routed, with_ms=True)}" if routed else ""),
        "calls: " + (_calls(called) or "none"),
    ]
    if never:
        parts.append(f"never called: {_by_shape(never)}")
    forwards = [m for m in routed if m.own_forward]
    if forwards:
        parts.append(f"own forward (routed only where it calls apply): {_by_shape(forwards)}")
    parts.append("no plan: " + (_by_shape(no_plan, with_dtype=True) or "none"))
    for outcome, skipped in sorted(groups.items()):
        parts.append(f"skipped ({outcome}): {_by_shape(skipped)}")
    if own:
        parts.append(f"{OWN_KERNEL}: {_by_shape(own)}")
    if routers:
        parts.append(f"left alone ({ROUTER}): {_by_shape(routers, with_dtype=True)}")
    return "; ".join(parts)


def _describe_device(device: torch.device) -> str:
    if device.type != "cuda":
        return f"{device.type} (no GPU)"
    capability = torch.cuda.get_device_capability(device)
    arch = ARCH_FOR_CAPABILITY.get(capability, f"sm_{capability[0]}{capability[1]}: no skinny-gemm target")
    loaded = "manifest loaded" if api.manifest(device) is not None else "no manifest loaded"
    return f"{torch.cuda.get_device_name(device)} ({device}, {arch}, {loaded})"


def _largest_first(key):
    (n, k) = key[:2]
    return (-n * k, key)


def _calls(called: dict) -> str:
    """``(N, K) M=1 x12, M=2 x4`` per shape, largest weight first."""
    per_shape = defaultdict(dict)
    for (n, k, m), count in called.items():
        per_shape[(n, k)][m] = count
    return ", ".join(
        f"({n}, {k}) " + ", ".join(f"M={m} x{c}" for m, c in sorted(per_shape[(n, k)].items()))
        for n, k in sorted(per_shape, key=_largest_first)
    )


def _by_shape(matches, with_ms=False, with_dtype=False) -> str:
    """``(N, K) name xCOUNT [M=...] [dtype]`` per shape, largest weight first."""
    shapes = defaultdict(list)
    for m in matches:
        shapes[(m.n, m.k)].append(m)
    items = []
    for (n, k), group in sorted(shapes.items(), key=lambda kv: _largest_first(kv[0])):
        names = ",".join(sorted({g.name.rsplit(".", 1)[-1] for g in group}))
        text = f"({n}, {k}) {names} x{len(group)}"
        if with_ms:
            text += " M=" + ",".join(str(m) for m in sorted(group[0].ms))
        if with_dtype:
            text += " " + ",".join(sorted({g.dtype for g in group}))
        items.append(text)
    return ", ".join(items)
