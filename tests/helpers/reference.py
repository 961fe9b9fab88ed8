"""Correctness helpers for GPU tests (DESIGN.md, "How to measure"): a float64 reference, the elementwise
bound a correct BF16-output kernel meets at any input scale, output poisoning, random inputs with outliers.

The bound: ``|y - ref| <= 2^-8 |ref| + 2^-16 (|x| @ |W|^T)``: one bf16 rounding (unit roundoff 2^-8)
plus fp32 accumulation error, which scales with the sum of |x||w|. Where the product is rounded to
bf16 before a residual is added (F.linear + residual does that), one more ``2^-8 |x @ W^T|``.
"""

from __future__ import annotations

import torch

BF16_UNIT = 2.0**-8
ACCUMULATION = 2.0**-16


def reference(x, w, residual=None):
    """(ref, mag, prod): float64 x @ w^T (+ residual), |x| @ |w|^T, and x @ w^T alone; x may have leading dims."""
    xd = x.reshape(-1, x.shape[-1]).double()
    wd = w.double()
    prod = xd @ wd.T
    mag = xd.abs() @ wd.abs().T
    ref = prod if residual is None else prod + residual.reshape(prod.shape).double()
    shape = tuple(x.shape[:-1]) + (w.shape[0],)
    return ref.reshape(shape), mag.reshape(shape), prod.reshape(shape)


def allowed(x, w, residual=None, rounded_before_residual=False):
    """(ref, bound): the float64 reference and the elementwise error each output may have."""
    ref, mag, prod = reference(x, w, residual)
    bound = BF16_UNIT * ref.abs() + ACCUMULATION * mag
    if rounded_before_residual and residual is not None:
        bound = bound + BF16_UNIT * prod.abs()
    return ref, bound


def assert_within_bound(y, x, w, residual=None, rounded_before_residual=False, what=""):
    """Fail with the worst element's numbers if any output breaks the bound."""
    ref, bound = allowed(x, w, residual, rounded_before_residual)
    err = (y.double() - ref).abs()
    bad = ~(err <= bound)
    if bool(bad.any()):
        idx = int(torch.nonzero(bad.reshape(-1))[0])
        raise AssertionError(
            f"{what}: {int(bad.sum())} of {y.numel()} outputs out of bound; first at flat index {idx}: "
            f"y={y.reshape(-1)[idx].item()!r} ref={ref.reshape(-1)[idx].item()!r} "
            f"err={err.reshape(-1)[idx].item():.3e} bound={bound.reshape(-1)[idx].item():.3e}"
        )


def poison_(t):
    """Fill an output with NaN so that an element the kernel never writes fails the bound."""
    return t.fill_(float("nan"))


def poison_allocator(shape, device, dtype=torch.bfloat16):
    """Leave a NaN-filled freed block of this size in torch's caching allocator, which the next
    allocation of the same size (an output made inside skinny_gemm.linear) most likely reuses."""
    torch.full(shape, float("nan"), dtype=dtype, device=device)


def random_tensor(shape, device, scale=1.0, outliers=True, generator=None, dtype=torch.bfloat16):
    """Gaussian values times ``scale``; with outliers, about 1 in 500 entries is 32x larger (sign kept)."""
    t = torch.randn(shape, device=device, generator=generator) * scale
    if outliers and t.numel():
        mask = torch.rand(shape, device=device, generator=generator) < 0.002
        t = torch.where(mask, t * 32, t)
    return t.to(dtype)


def random_case(m, n, k, device, scale=1.0, residual=False, generator=None, dtype=torch.bfloat16):
    """Tokens x [m, k] (scaled, outliers), weight w [n, k] (0.05 scale, outliers), residual [m, n] or None."""
    x = random_tensor((m, k), device, scale, generator=generator, dtype=dtype)
    w = random_tensor((n, k), device, 0.05, generator=generator, dtype=dtype)
    r = random_tensor((m, n), device, scale, generator=generator, dtype=dtype) if residual else None
    return x, w, r
