"""vLLM general plugin: route unquantized BF16 projections whose per-rank (N, K) has a plan to ``skinny_gemm.linear``.

vLLM calls ``register`` in each of its processes (entry point group
``vllm.general_plugins``). It wraps two methods of vLLM's own classes at run
time, never its files:

- ``process_weights_after_loading`` of ``UnquantizedLinearMethod`` and
  ``UnquantizedEmbeddingMethod``: vLLM calls it once per layer after the
  weights are loaded and before CUDA graphs are captured. There each layer's
  local weight shape is matched against the plans for its GPU and, where one
  fits, a ``RoutedApply`` is installed as that layer's quant method ``apply``.
- ``BaseModelLoader.load_model``: after a model is loaded, the routes are put
  into vLLM's compile-cache key (``key_compile_cache``) and one summary line
  is logged (``summary``).

Everything that touches vLLM is imported inside the functions that need it, so
this module and the forward it installs (``RoutedApply``, ``install_route``)
import without vLLM: the GPU tests run that forward on machines without vLLM.
Nothing here imports cutlass or compiles anything.
"""

from __future__ import annotations

import functools
import logging
import os
from collections import defaultdict
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
# The key of the routes in vLLM's additional_config (key_compile_cache).
CACHE_KEY = "skinny_gemm_routes"

# Under vLLM's logger tree, so vLLM's handler and format print it: a logger
# outside "vllm" has no handler and Python drops its INFO records.
logger = logging.getLogger("vllm.skinny_gemm")

# (n, k, device) -> the planned token counts. A module global so that tests can
# swap in a plan table of their own.
planned_ms = api.planned_ms


@dataclass(frozen=True)
class LayerMatch:
    """What the plugin decided for one layer: its local weight shape, the planned M, and the outcome."""

    name: str
    n: int
    k: int
    ms: frozenset
    outcome: str

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
        if match is not None and match.routed and bias is None and x.dtype == layer.weight.dtype:
            # Under torch.compile the token count is symbolic: branching on it
            # would bake one branch into the graph for every size. There the
            # call goes to skinny_gemm.linear, which picks plan or F.linear at
            # run time, as vLLM's own path (F.linear on CUDA) would compute.
            if torch.compiler.is_compiling() or x.numel() // match.k in match.ms:
                # vLLM's weights are Parameter subclasses (ModelWeightParameter);
                # skinny_gemm.linear launches only on plain tensors, which
                # detach() gives without a copy.
                return api.linear(x, layer.weight.detach())
        return self.original(layer, x, bias)


def install_route(quant_method, layer, match: LayerMatch) -> None:
    """Record ``match`` on ``layer`` and, when routed, put a RoutedApply in front of ``quant_method.apply``."""
    setattr(layer, LAYER_ATTR, match)
    # One quant method may serve several layers; RoutedApply looks the route up per layer.
    if match.routed and not isinstance(quant_method.__dict__.get("apply"), RoutedApply):
        quant_method.apply = RoutedApply(quant_method.apply)


def enabled() -> bool:
    """False when SKINNY_GEMM_VLLM turns the plugin off (0, false, off, no)."""
    return os.environ.get(ENV_SWITCH, "1").strip().lower() not in ("0", "false", "off", "no")


def register() -> None:
    """vLLM's general-plugin entry point: patch the hooks once per process, unless switched off."""
    if not enabled():
        return
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    for cls in (UnquantizedLinearMethod, UnquantizedEmbeddingMethod):
        _patch(cls, "process_weights_after_loading", _routing_after_loading)
    _patch(BaseModelLoader, "load_model", _after_model_loaded)


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
        if loaded is not None and _is_candidate(self, layer):
            install_route(self, layer, match_layer(self, layer, *loaded))
        return result

    return process_weights_after_loading


def _after_model_loaded(original):
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        key_compile_cache(kwargs.get("vllm_config", args[0] if args else None), model)
        logger.info("%s", summary(model))
        return model

    return load_model


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


def _is_matrix(weight) -> bool:
    return isinstance(weight, torch.Tensor) and weight.dim() == 2 and not weight.is_meta


def _is_candidate(quant_method, layer) -> bool:
    """Exactly vLLM's unquantized linear method, or its embedding method on an LM head (never an embedding lookup)."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead, UnquantizedEmbeddingMethod

    # Subclasses (MoE routers, model-specific low-latency GEMMs) replace apply; leave them alone.
    if type(quant_method) is UnquantizedLinearMethod:
        return True
    return type(quant_method) is UnquantizedEmbeddingMethod and isinstance(layer, ParallelLMHead)


def match_layer(quant_method, layer, shape, dtype, device) -> LayerMatch:
    """Decide one layer from its loaded weight's shape, dtype and device; ``layer`` as vLLM's processing left it."""
    import vllm.envs as envs
    from vllm.model_executor.layers.utils import dispatch_unquantized_gemm
    from vllm.model_executor.layers.vocab_parallel_embedding import ParallelLMHead

    n, k = shape
    name = getattr(layer, "prefix", "") or type(layer).__name__
    ms = frozenset(planned_ms(n, k, device)) if dtype == torch.bfloat16 else frozenset()
    bias = getattr(layer, "bias", None)
    # A linear layer hands its bias to apply unless skip_bias_add; an LM head
    # gets its bias per call (LogitsProcessor's embedding_bias), which
    # RoutedApply checks.
    static_bias = isinstance(bias, torch.Tensor) and not getattr(layer, "skip_bias_add", False)
    weight = getattr(layer, "weight", None)
    if dtype != torch.bfloat16:
        outcome = f"dtype {str(dtype).removeprefix('torch.')}"
    elif not ms:
        outcome = NO_PLAN
    elif static_bias and not isinstance(layer, ParallelLMHead):
        outcome = "bias"
    elif envs.VLLM_BATCH_INVARIANT:
        outcome = "VLLM_BATCH_INVARIANT"
    elif getattr(quant_method, "_gemm_impl", None) not in (None, dispatch_unquantized_gemm()):
        # The user picked a --linear-backend for these layers: respect it.
        outcome = "linear backend"
    elif not _is_matrix(weight) or tuple(weight.shape) != (n, k):
        outcome = "weight repacked by vLLM"
    else:
        outcome = ROUTED
    return LayerMatch(name=name, n=n, k=k, ms=ms, outcome=outcome)


def layer_matches(model: torch.nn.Module) -> dict[str, tuple[str, LayerMatch]]:
    """Module name -> (module class name, LayerMatch) for every layer the plugin decided on in ``model``."""
    found = {}
    for name, module in model.named_modules():
        match = module.__dict__.get(LAYER_ATTR)
        if match is not None:
            found[name] = (type(module).__name__, match)
    return found


def summary(model: torch.nn.Module) -> str:
    """The one log line: GPU and arch, layers routed per shape, shapes with no plan, layers skipped and why."""
    matches = [m for _, m in layer_matches(model).values()]
    weight = next((p for p in model.parameters() if p.device.type != "meta"), None)
    device = weight.device if weight is not None else torch.device("cpu")
    groups = defaultdict(list)
    for m in matches:
        groups[m.outcome].append(m)
    routed = groups.pop(ROUTED, [])
    no_plan = groups.pop(NO_PLAN, [])
    parts = [
        f"{LOG_PREFIX} {_describe_device(device)}: routed {len(routed)} of {len(matches)} unquantized layers"
        + (f": {_by_shape(routed, with_ms=True)}" if routed else ""),
        "no plan: " + (_by_shape(no_plan) or "none"),
    ]
    for outcome, skipped in sorted(groups.items()):
        parts.append(f"skipped ({outcome}): {_by_shape(skipped)}")
    return "; ".join(parts)


def _describe_device(device: torch.device) -> str:
    if device.type != "cuda":
        return f"{device.type} (no GPU)"
    capability = torch.cuda.get_device_capability(device)
    arch = ARCH_FOR_CAPABILITY.get(capability, f"sm_{capability[0]}{capability[1]}: no skinny-gemm target")
    loaded = "manifest loaded" if api.manifest(device) is not None else "no manifest loaded"
    return f"{torch.cuda.get_device_name(device)} ({device}, {arch}, {loaded})"


def _by_shape(matches, with_ms=False) -> str:
    """``(N, K) name xCOUNT [M=...]`` per shape, largest weight first."""
    shapes = defaultdict(list)
    for m in matches:
        shapes[(m.n, m.k)].append(m)
    items = []
    for (n, k), group in sorted(shapes.items(), key=lambda kv: (-kv[0][0] * kv[0][1], kv[0])):
        names = ",".join(sorted({g.name.rsplit(".", 1)[-1] for g in group}))
        text = f"({n}, {k}) {names} x{len(group)}"
        if with_ms:
            text += " M=" + ",".join(str(m) for m in sorted(group[0].ms))
        items.append(text)
    return ", ".join(items)
