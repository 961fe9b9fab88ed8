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
  fits, a ``RoutedApply`` is installed as that layer's quant method ``apply``
  (runtime/vllm_routes.py decides and installs).
- ``BaseModelLoader.load_model``: after a model is loaded, the routes are put
  into vLLM's compile-cache key (``key_compile_cache``).
- the workers' ``compile_or_warm_up_model``: after vLLM's profile and warm-up
  runs, one summary line (runtime/vllm_summary.py) says what was routed, how
  often each routed (shape, M) launched our kernel (graph captures included)
  and, as a warning, every fallback at a planned M with its reason. Later
  counts: ``llm.apply_model(summary)`` on demand, or ``$SKINNY_GEMM_COUNTERS``
  (runtime/counters.py) at process exit.

Nothing here imports vLLM at import time, cutlass, or compiles anything.
"""

from __future__ import annotations

import functools
import importlib.abc
import logging
import os
import sys

import torch

from . import vllm_routes as routes
from .vllm_summary import FELL_BACK, LOG_PREFIX, summary

ENV_SWITCH = "SKINNY_GEMM_VLLM"
# The key of the routes in vLLM's additional_config (key_compile_cache).
CACHE_KEY = "skinny_gemm_routes"

# Under vLLM's logger tree, so vLLM's handler and format print it: a logger
# outside "vllm" has no handler and Python drops its INFO records.
logger = logging.getLogger("vllm.skinny_gemm")


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


# Hooked vLLM names this vLLM lacks ("module.Class.method"): with any missing the plugin routes nothing in this
# process (a half-hooked vLLM could route without keying its compile cache, or without its summary line).
MISSING: set = set()


def _patch_module(module, patches) -> None:
    for cls_name, method, make_wrapper in patches:
        cls = getattr(module, cls_name, None)
        if cls is not None and hasattr(cls, method):
            _patch(cls, method, make_wrapper)
            continue
        name = f"{module.__name__}.{cls_name}.{method}"
        if name not in MISSING:
            MISSING.add(name)
            logger.warning(
                "%s this vLLM has no %s: the plugin stays off (nothing routed); tested with vLLM 0.26 "
                "(GPU) and 0.32 (CPU)",
                LOG_PREFIX,
                name,
            )


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
        loaded = routes.loaded_weight(layer)
        result = original(self, layer)
        if loaded is not None and not MISSING:
            match = routes.decide(self, layer, *loaded)
            if match is not None:
                routes.install_route(self, layer, match)
        return result

    return process_weights_after_loading


def _after_model_loaded(original):
    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        model = original(self, *args, **kwargs)
        key_compile_cache(kwargs.get("vllm_config", args[0] if args else None), model)
        return model

    return load_model


def _log_summary(worker) -> None:
    """Log the summary line of ``worker``'s model (a warning when a routed layer fell back at a planned M)."""
    runner = getattr(worker, "model_runner", None)
    # A worker without a model (not loaded, or a runner with none): nothing to report. get_model()
    # unwraps vLLM's CUDA-graph wrappers.
    model = runner.get_model() if getattr(runner, "model", None) is not None else None
    if isinstance(model, torch.nn.Module):
        line = summary(model)
        (logger.warning if FELL_BACK in line else logger.info)("%s (after warm-up)", line)


def _after_warm_up(original):
    @functools.wraps(original)
    def compile_or_warm_up_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        _log_summary(self)
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
    found = sorted({(m.n, m.k, tuple(sorted(m.ms))) for _, m in routes.layer_matches(model).values() if m.routed})
    if not found:
        return
    extra = getattr(vllm_config, "additional_config", None)
    if isinstance(extra, dict):
        extra[CACHE_KEY] = [[n, k, list(ms)] for n, k, ms in found]
    else:
        logger.warning(
            "%s vLLM's additional_config is no dict: its compile cache cannot tell graphs with and without "
            "skinny-gemm apart; set VLLM_DISABLE_COMPILE_CACHE=1 when switching the plugin on or off",
            LOG_PREFIX,
        )
