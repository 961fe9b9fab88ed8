"""Public API: linear, plan_for, planned_ms, manifest, counters.

Importing this module calls no CUDA API; it asks torch to load the artifacts
when torch initializes CUDA (runtime/loader.py says why and how).
"""

from __future__ import annotations

import copy

import torch

from ..kernels.config import KernelConfig
from . import counters as _counters
from . import loader, ops
from .devices import DeviceTable

loader.install_hook()
_counters.dump_at_exit()


def linear(x, weight, bias=None, residual=None):
    """Same result as F.linear(x, weight, bias) (+ residual); a planned cubin runs when one fits exactly.

    A bias runs on a plan whose config has ``bias`` (the kernel adds it in fp32 before rounding);
    a bias and a residual together always fall back to F.linear.

    The kernel may read ``weight`` before the kernel launched just before it on
    the stream has finished (programmatic dependent launch): the weight must not
    be written by that kernel, which holds for model parameters.
    """
    if not ops.tracing():
        return ops.run(x, weight, residual, bias)
    if ops.may_dispatch(x, weight, residual, bias):
        return torch.ops.skinny_gemm.linear(x, weight, residual, bias)
    return ops.fallback(x, weight, bias, residual)


def _device_table(device) -> DeviceTable | None:
    """The loaded table of ``device`` (None: torch's current CUDA device); initializes torch's CUDA if needed."""
    if device is not None:
        device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
        if device.type != "cuda":
            return None
    if not torch.cuda.is_available():
        return None
    index = device.index if device is not None and device.index is not None else torch.cuda.current_device()
    loader.ensure_loaded()
    return loader.DEVICES.get(index)


def _plans(device, n, k) -> dict:
    table = _device_table(device)
    return {} if table is None else table.plans(n, k)  # checks only the variants of (n, k)


def plan_for(n, k, m, device=None) -> KernelConfig | None:
    """The KernelConfig that would run for (n, k, m) on ``device``, or None."""
    variant = _plans(device, n, k).get((n, k, m))
    return None if variant is None else variant.config


def planned_ms(n, k, device=None) -> tuple[int, ...]:
    """The token counts M planned for weight shape (n, k) on ``device``."""
    return tuple(sorted(m for (pn, pk, m) in _plans(device, n, k) if (pn, pk) == (n, k)))


def manifest(device=None) -> dict | None:
    """The loaded manifest (dict) for ``device``'s arch, or None."""
    table = _device_table(device)
    if table is None or table.library is None or table.library.manifest is None:
        return None
    return copy.deepcopy(table.library.manifest.raw)


def counters(reset: bool = False) -> dict:
    """What ran in this process so far: ``{"launches": [[n, k, m, count]...], "fallbacks": [[n, k, m, reason,
    count]...]}``. A launch captured into a CUDA graph counts once (replays run no host code); ``reset`` zeroes
    the counts after reading them. The reasons are listed in skinny_gemm.runtime.counters."""
    found = _counters.snapshot()
    if reset:
        _counters.reset()
    return found
