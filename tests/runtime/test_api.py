"""The public API on CPU: every call falls back and gives exactly F.linear's result or error;
plan_for / planned_ms / manifest read the loaded tables (driver played by helpers.fake_driver.FakeDriver)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.artifacts import all_plans, manifest_of

import skinny_gemm
from skinny_gemm.runtime import loader

SHAPES = [((4096,), (32, 4096)), ((1, 64), (16, 64)), ((3, 64), (16, 64)), ((2, 3, 40), (24, 40)), ((0, 16), (8, 16))]


def expected(x, w, b=None, r=None):
    y = F.linear(x, w, b)
    return y if r is None else y + r


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("xs, ws", SHAPES)
def test_fallback_equals_f_linear(xs, ws, dtype):
    torch.manual_seed(0)
    x, w = torch.randn(xs, dtype=dtype), torch.randn(ws, dtype=dtype)
    b = torch.randn(ws[0], dtype=dtype)
    r = torch.randn(xs[:-1] + (ws[0],), dtype=dtype)
    assert torch.equal(skinny_gemm.linear(x, w), expected(x, w))
    assert torch.equal(skinny_gemm.linear(x, w, b), expected(x, w, b))
    assert torch.equal(skinny_gemm.linear(x, w, residual=r), expected(x, w, r=r))
    assert torch.equal(skinny_gemm.linear(x, w, b, r), expected(x, w, b, r))


def test_fallback_broadcasts_and_promotes_like_the_reference():
    x, w = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    r = torch.randn(4)  # broadcast, fp32: promotes
    y = skinny_gemm.linear(x, w, residual=r)
    assert y.dtype == torch.float32 and torch.equal(y, expected(x, w, r=r))


def test_strided_and_offset_views_fall_back_exactly():
    base = torch.randn(6, 130)
    x = base[::2, 1:129]
    w = torch.randn(64, 256)[:, ::2]
    assert torch.equal(skinny_gemm.linear(x, w), F.linear(x, w))


def test_exotic_tensors_fall_back_exactly():
    x, w = torch.randn(3, 8, dtype=torch.bfloat16), torch.randn(4, 8, dtype=torch.bfloat16)
    nx = torch._neg_view(x)
    assert torch.equal(skinny_gemm.linear(nx, w), F.linear(nx, w))
    sx = x.float().to_sparse()
    assert torch.equal(skinny_gemm.linear(sx, w.float()), F.linear(sx, w.float()))


def test_one_dimensional_weight_like_f_linear():
    x, w = torch.randn(2, 8), torch.randn(8)
    assert torch.equal(skinny_gemm.linear(x, w), F.linear(x, w))


def test_autograd_flows_through_the_fallback():
    x = torch.randn(2, 8, requires_grad=True)
    w = torch.randn(4, 8, requires_grad=True)
    skinny_gemm.linear(x, w).sum().backward()
    assert x.grad is not None and w.grad is not None


def same_error(fn_ours, fn_ref):
    with pytest.raises(Exception) as ref:
        fn_ref()
    with pytest.raises(type(ref.value)) as ours:
        fn_ours()
    assert str(ours.value) == str(ref.value)


@pytest.mark.parametrize(
    "xs, ws",
    [((2, 8), (4, 9)), ((8,), (4, 9)), ((), (4, 8)), ((2, 8), (2, 4, 8)), ((2, 8), (4,))],
)
def test_invalid_input_raises_f_linears_error(xs, ws):
    x, w = torch.randn(xs), torch.randn(ws)
    same_error(lambda: skinny_gemm.linear(x, w), lambda: F.linear(x, w))


def test_mixed_dtypes_raise_f_linears_error():
    x, w = torch.randn(2, 8, dtype=torch.bfloat16), torch.randn(4, 8)
    same_error(lambda: skinny_gemm.linear(x, w), lambda: F.linear(x, w))


def test_bad_residual_raises_the_references_error():
    x, w, r = torch.randn(2, 8), torch.randn(4, 8), torch.randn(3, 4)
    same_error(lambda: skinny_gemm.linear(x, w, residual=r), lambda: F.linear(x, w) + r)


def test_queries_without_gpu():
    assert skinny_gemm.plan_for(4096, 4096, 1) is None
    assert skinny_gemm.plan_for(4096, 4096, 1, device="cpu") is None
    assert skinny_gemm.planned_ms(4096, 4096) == ()
    assert skinny_gemm.manifest() is None


@pytest.fixture
def fake_gpu(monkeypatch, fresh, art):
    """One fake H200 seen by both torch (is_available, current_device) and the loader."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fresh()
    return art


def test_queries_read_the_loaded_table(fake_gpu):
    n, k, m = sorted(all_plans(fake_gpu))[0]
    cfg = skinny_gemm.plan_for(n, k, m)
    assert cfg is not None and cfg == skinny_gemm.plan_for(n, k, m, device="cuda:0") == skinny_gemm.plan_for(n, k, m, 0)
    assert skinny_gemm.plan_for(n, k, m, device="cuda:1") is None
    assert skinny_gemm.plan_for(n, k, 99) is None
    assert skinny_gemm.planned_ms(n, k) == tuple(sorted(mm for nn, kk, mm in all_plans(fake_gpu) if (nn, kk) == (n, k)))
    man = skinny_gemm.manifest()
    assert man == manifest_of(fake_gpu)
    man["variants"].clear()
    assert skinny_gemm.manifest()["variants"], "manifest() hands out a copy"


def test_queries_exclude_refused_variants(monkeypatch, fresh, art):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    data = manifest_of(art)
    v = data["variants"][0]
    (art / "sm_90a" / v["file"]).unlink()
    fresh()
    gone = [(p["n"], p["k"], p["m"]) for p in data["plans"] if p["variant"] == v["id"]]
    kept = [(p["n"], p["k"], p["m"]) for p in data["plans"] if p["variant"] != v["id"]]
    assert all(skinny_gemm.plan_for(*key) is None for key in gone)
    assert all(skinny_gemm.plan_for(*key) is not None for key in kept)


def test_queries_before_binding_use_the_library(monkeypatch, fresh, art):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fresh(active=[False])
    assert loader.DEVICES[0].table is None
    n, k, m = sorted(all_plans(art))[0]
    assert skinny_gemm.plan_for(n, k, m) is not None


def test_counters_read_reset_and_written_at_exit(tmp_path, monkeypatch):
    import json
    import os
    from collections import Counter

    from skinny_gemm.runtime import counters

    monkeypatch.setattr(counters, "LAUNCHES", Counter({(8, 16, 1): 2}))
    monkeypatch.setattr(counters, "FALLBACKS", Counter({(8, 16, 3, counters.NOT_PLANNED): 1}))
    expected = {"launches": [[8, 16, 1, 2]], "fallbacks": [[8, 16, 3, "not planned", 1]]}
    counters._write(str(tmp_path / "c-{pid}.json"))
    assert json.loads((tmp_path / f"c-{os.getpid()}.json").read_text()) == {"pid": os.getpid(), **expected}
    assert skinny_gemm.counters(reset=True) == expected
    assert skinny_gemm.counters() == {"launches": [], "fallbacks": []}
    # A file that cannot be written costs one printed line, never the process's exit.
    counters._write(str(tmp_path / "no-such-dir" / "c.json"))
