"""The forward the vLLM plugin installs, on a GPU and without vLLM: for every planned shape of the loaded
manifest it matches F.linear (within the bound of helpers/reference.py), eager and under CUDA graph
replay, and really launches the planned kernel.

vLLM is not needed: the layer and its quant method are stand-ins with what the plugin touches (a
``weight`` that, like vLLM's ModelWeightParameter, is a Parameter subclass, and ``apply``).
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch
import torch.nn.functional as F
from helpers.reference import (
    assert_within_bound,
    poison_,
    poison_allocator,
    random_tensor,
)

from skinny_gemm.runtime import api, counters, ops
from skinny_gemm.runtime.vllm_routes import (
    ROUTED,
    LayerMatch,
    RoutedApply,
    install_route,
)

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (the plugin's forward runs cubins)"
)


class _VllmWeight(torch.nn.Parameter):
    """Like vLLM's ModelWeightParameter: a Parameter subclass whose __torch_function__ passes through."""

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        return super().__torch_function__(func, types, args, kwargs or {})


class _Method:
    """vLLM's unquantized linear method on CUDA: apply is F.linear."""

    def apply(self, layer, x, bias=None):
        return F.linear(x, layer.weight, bias)


def _planned_shapes():
    data = api.manifest()
    if data is None:
        pytest.skip(f"no skinny-gemm manifest loaded for {torch.cuda.get_device_name()}")
    shapes = defaultdict(set)
    for plan in data["plans"]:
        shapes[(plan["n"], plan["k"])].add(plan["m"])
    return sorted(shapes.items())


def _routed_layer(w, ms):
    n, k = w.shape
    layer = torch.nn.Module()
    layer.weight = _VllmWeight(w, requires_grad=False)
    method = _Method()
    install_route(method, layer, LayerMatch(name="layer", n=n, k=k, ms=frozenset(ms), outcome=ROUTED))
    assert isinstance(method.apply, RoutedApply)
    return layer, method


@pytest.fixture
def fallbacks(monkeypatch):
    """Counts calls that end in F.linear inside skinny_gemm (a planned M must cause none)."""
    calls = []
    real = ops.fallback

    def counting(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(ops, "fallback", counting)
    return calls


@torch.no_grad()
def test_routed_forward_matches_f_linear_eager(fallbacks):
    gen = torch.Generator(device="cuda").manual_seed(0)
    for (n, k), ms in _planned_shapes():
        w = random_tensor((n, k), "cuda", 0.05, generator=gen)
        layer, method = _routed_layer(w, ms)
        for m in sorted(ms):
            assert api.plan_for(n, k, m) is not None
            x = random_tensor((m, k), "cuda", generator=gen)
            poison_allocator((m, n), "cuda")
            y = method.apply(layer, x)
            torch.cuda.synchronize()
            assert_within_bound(y, x, w, what=f"eager (n={n}, k={k}, m={m})")
            assert not fallbacks, f"(n={n}, k={k}, m={m}) fell back to F.linear"
        del layer, method, w


@torch.no_grad()
def test_routed_forward_matches_f_linear_under_graph_replay(fallbacks):
    gen = torch.Generator(device="cuda").manual_seed(1)
    for (n, k), ms in _planned_shapes():
        w = random_tensor((n, k), "cuda", 0.05, generator=gen)
        layer, method = _routed_layer(w, ms)
        for m in sorted(ms):
            static_x = random_tensor((m, k), "cuda", generator=gen)
            method.apply(layer, static_x)  # loads and binds before capture, as vLLM's warm-up does
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = method.apply(layer, static_x)
            for trial in range(2):
                x = random_tensor((m, k), "cuda", scale=4.0**trial, generator=gen)
                static_x.copy_(x)
                poison_(static_y)
                graph.replay()
                torch.cuda.synchronize()
                assert_within_bound(static_y, x, w, what=f"graph replay {trial} (n={n}, k={k}, m={m})")
            assert not fallbacks, f"(n={n}, k={k}, m={m}) fell back to F.linear"
            del graph, static_y
        del layer, method, w


@torch.no_grad()
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
def test_compiled_route_launches_the_plan_under_graph_replay_and_counts_it(fallbacks, monkeypatch, backend):
    """vLLM's compiled graph calls the plugin's opaque op for every M: it must run the plan and count the launch.
    Under Inductor the op receives the layer's Parameter subclass itself, as in vLLM."""
    calls = Counter()
    monkeypatch.setattr(counters, "LAUNCHES", calls)
    gen = torch.Generator(device="cuda").manual_seed(2)
    # Three shapes keep the compile time short; the op and its dispatch are the same for all.
    for (n, k), ms in _planned_shapes()[:3]:
        w = random_tensor((n, k), "cuda", 0.05, generator=gen)
        layer, method = _routed_layer(w, ms)
        # One code object serves every shape and both backends: without a reset its compiled entries pile up past
        # Dynamo's recompile limit (8) over the three shapes' six token counts each.
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda x, layer=layer, method=method: method.apply(layer, x), backend=backend, dynamic=True, fullgraph=True
        )
        for m in sorted(ms):
            static_x = random_tensor((m, k), "cuda", generator=gen)
            compiled(static_x)  # compiles and warms up before capture, as vLLM does
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                static_y = compiled(static_x)
            x = random_tensor((m, k), "cuda", generator=gen)
            static_x.copy_(x)
            poison_(static_y)
            graph.replay()
            torch.cuda.synchronize()
            assert_within_bound(static_y, x, w, what=f"compiled graph replay (n={n}, k={k}, m={m})")
            assert not fallbacks, f"(n={n}, k={k}, m={m}) fell back to F.linear"
            del graph, static_y
        # Warm-up and capture per M; a replay runs no Python and counts nothing.
        assert {m: c for (cn, ck, m), c in calls.items() if (cn, ck) == (n, k)} == dict.fromkeys(sorted(ms), 2)
        del layer, method, w, compiled


@torch.no_grad()
def test_unplanned_m_stays_on_vllm_path(monkeypatch):
    (n, k), ms = _planned_shapes()[0]
    m = next(m for m in range(1, 64) if m not in ms)
    w = random_tensor((n, k), "cuda", 0.05)
    layer, method = _routed_layer(w, ms)
    monkeypatch.setattr(api, "linear", lambda *a, **kw: pytest.fail("skinny_gemm.linear called for an unplanned M"))
    x = random_tensor((m, k), "cuda")
    torch.testing.assert_close(method.apply(layer, x), F.linear(x, w), rtol=0, atol=0)
