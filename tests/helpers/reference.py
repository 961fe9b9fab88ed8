"""Correctness helpers for GPU tests (method: docs/perf.md "How it was measured"): a float64 reference, the elementwise
bound a correct BF16-output kernel meets at any input scale, output poisoning, random inputs with outliers.

The bound: ``|y - ref| <= 2^-8 |ref| + 2^-16 (|x| @ |W|^T)``: one bf16 rounding (unit roundoff 2^-8)
plus fp32 accumulation error, which scales with the sum of |x||w|. Where the product is rounded to
bf16 before a residual is added (F.linear + residual does that), one more ``2^-8 |x @ W^T|``.
"""

from __future__ import annotations

import torch

# One implementation of the reference, the bound and the random inputs serves
# the tuner and the tests: it ships in the wheel, so the GPU suite run from an
# installed wheel imports it from there.
from skinny_gemm.aot.measure import ACCUMULATION, BF16_UNIT, allowed, random_case, random_tensor, reference  # noqa: F401


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
