"""Under a torch function or dispatch mode, ``skinny_gemm.linear`` gives F.linear's result or F.linear's error
type for any arguments, tensors or not (a fuzz of a few thousand random calls, CPU tensors)."""

from __future__ import annotations

import random

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import skinny_gemm
from skinny_gemm.runtime import ops


class PassThrough(TorchDispatchMode):
    """A dispatch mode that changes nothing: only its presence matters (ops.tracing() is then true)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))


def expected(x, w, b, r):
    y = F.linear(x, w, b)
    return y if r is None else y + r


def outcome(fn, *args):
    """("ok", result) or ("error", exception type)."""
    try:
        return "ok", fn(*args)
    except Exception as exc:  # noqa: BLE001  (the point is to compare whatever F.linear raises)
        return "error", type(exc)


def same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "error":
        return a[1] is b[1]
    x, y = a[1], b[1]
    if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor):
        return (
            x.shape == y.shape
            and x.dtype == y.dtype
            and torch.equal(x.isnan(), y.isnan())
            and torch.equal(x.nan_to_num(), y.nan_to_num())
        )
    return type(x) is type(y) and x == y


NOT_TENSORS = [None, 2.0, 3, "x", [1.0, 2.0], (4,), object()]
DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float64, torch.int32]


def random_args(rng: random.Random):
    k, n = rng.choice([1, 8, 16]), rng.choice([1, 4, 8])
    lead = rng.choice([(), (1,), (2,), (2, 3), (0,)])
    dtype = rng.choice(DTYPES)

    def tensor(shape, dt=None):
        dt = dt or (dtype if rng.random() < 0.8 else rng.choice(DTYPES))
        t = torch.randn(shape, dtype=torch.float64) * 4
        return t.to(dt)

    x = tensor((*lead, k if rng.random() < 0.85 else k + 1)) if rng.random() < 0.9 else rng.choice(NOT_TENSORS)
    w = (
        tensor((n, k) if rng.random() < 0.85 else rng.choice([(n,), (n, k, 1), (k, n)]))
        if rng.random() < 0.9
        else rng.choice(NOT_TENSORS)
    )
    b = (
        None
        if rng.random() < 0.6
        else (tensor((n,) if rng.random() < 0.8 else (n + 1,)) if rng.random() < 0.9 else rng.choice(NOT_TENSORS[1:]))
    )
    r_shape = (*lead, n) if rng.random() < 0.7 else rng.choice([(n,), (1, n), (n + 1,)])
    r = None if rng.random() < 0.4 else (tensor(r_shape) if rng.random() < 0.75 else rng.choice(NOT_TENSORS[1:]))
    return x, w, b, r


MODES = {"torch.device": lambda: torch.device("cpu"), "dispatch mode": PassThrough}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_fuzz_under_torch_modes_equals_f_linear(mode):
    rng = random.Random(12)
    checked = errors = 0
    for _ in range(1500):
        x, w, b, r = random_args(rng)
        with MODES[mode]():
            assert ops.tracing(), "the mode must route calls through the traced path"
            want = outcome(expected, x, w, b, r)
            got = outcome(skinny_gemm.linear, x, w, b, r)
        assert same(got, want), (mode, got, want, [type(a) for a in (x, w, b, r)])
        checked += 1
        errors += want[0] == "error"
    assert 0.2 * checked < errors < 0.9 * checked, "the fuzz exercises both results and errors"


def test_the_fuzz_can_fail():
    """Negative control: a linear that drops the residual is caught by the same comparison."""
    rng = random.Random(3)
    caught = 0
    for _ in range(200):
        x, w, b, r = random_args(rng)
        with torch.device("cpu"):
            want = outcome(expected, x, w, b, r)
            got = outcome(lambda x, w, b, r: F.linear(x, w, b), x, w, b, r)
        caught += not same(got, want)
    assert caught > 10


def test_non_tensor_residual_under_a_mode_is_not_an_attribute_error():
    x, w = torch.randn(2, 8), torch.randn(4, 8)
    with torch.device("cpu"):
        assert torch.equal(skinny_gemm.linear(x, w, residual=1.5), F.linear(x, w) + 1.5)
        with pytest.raises(TypeError):
            skinny_gemm.linear("not a tensor", w)
        with pytest.raises(TypeError):
            F.linear("not a tensor", w)
