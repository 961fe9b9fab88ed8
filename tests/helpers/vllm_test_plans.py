"""A test-only vLLM general plugin: hands the skinny-gemm plugin a plan table and counts the routed calls.

The engine's worker processes are spawned, so a test cannot patch them from
outside; vLLM loads this plugin in each of them, as it loads skinny-gemm's.
SKINNY_GEMM_TEST_PLANS holds JSON ``[[n, k, [m, ...]], ...]``.
"""

import json
import os
import sys
from collections import Counter

# M of every skinny_gemm.linear call made through the plugin in this process.
calls = Counter()


def register():
    """Swap in the table from SKINNY_GEMM_TEST_PLANS and count the routed calls."""
    text = os.environ.get("SKINNY_GEMM_TEST_PLANS")
    if not text:
        return
    from skinny_gemm.runtime import api, vllm_plugin

    table = {(n, k): tuple(ms) for n, k, ms in json.loads(text)}
    vllm_plugin.planned_ms = lambda n, k, device=None: table.get((n, k), ())
    real_linear = api.linear

    def counting_linear(x, weight, bias=None, residual=None):
        calls[x.numel() // x.shape[-1]] += 1
        return real_linear(x, weight, bias, residual)

    api.linear = counting_linear


def report(model):
    """Run inside vLLM's worker by LLM.apply_model: what the plugins did there, as plain data."""
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod
    from vllm.model_executor.model_loader.base_loader import BaseModelLoader

    hooks = (
        UnquantizedLinearMethod.process_weights_after_loading,
        UnquantizedEmbeddingMethod.process_weights_after_loading,
        BaseModelLoader.load_model,
    )
    found = {
        "pid": os.getpid(),
        "patched": [hasattr(hook, "_skinny_gemm_original") for hook in hooks],
        "cutlass_imported": any(m == "cutlass" or m.startswith("cutlass.") for m in sys.modules),
        "skinny_modules": sorted(m for m in sys.modules if m.startswith("skinny_gemm")),
        "matches": {},
        "calls": dict(calls),
    }
    if "skinny_gemm.runtime.vllm_plugin" in sys.modules:
        from skinny_gemm.runtime.vllm_plugin import layer_matches

        for name, (cls, m) in layer_matches(model).items():
            found["matches"][name] = [cls, m.n, m.k, sorted(m.ms), m.outcome]
    return found
