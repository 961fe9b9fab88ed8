"""The vLLM plugin's summary line: what was routed on a model, how often each routed (shape, M) launched our
kernel, every fallback to F.linear at a planned M with its reason, and every other BF16 projection with why it was
not routed. The counts are the dispatch's own (runtime/counters.py): a call counts only once it launched."""

from __future__ import annotations

from collections import defaultdict

import torch

from . import api, counters
from .manifest import ARCH_FOR_CAPABILITY
from .vllm_routes import NO_PLAN, OWN_KERNEL, ROUTED, ROUTER, layer_matches

LOG_PREFIX = "skinny-gemm vLLM plugin:"
# The loud part of the line: a routed layer ran F.linear at a planned M (the plugin then logs a warning).
FELL_BACK = "FELL BACK to F.linear at planned M"


def summary(model: torch.nn.Module, counts: dict | None = None) -> str:
    """The one log line: GPU and arch, routes and their launches so far, fallbacks at a planned M (loud), routes
    never launched, shapes without a plan, layers skipped and why, layers vLLM's own kernels claim, MoE routers
    left alone. ``counts``: a counters snapshot (default: this process's so far). Run it on demand in vLLM's
    workers with ``llm.apply_model(summary)``."""
    counts = counters.snapshot() if counts is None else counts
    matches = [m for _, m in layer_matches(model).values()]
    weight = next((p for p in model.parameters() if p.device.type != "meta"), None)
    device = weight.device if weight is not None else torch.device("cpu")
    groups = defaultdict(list)
    for m in matches:
        groups[m.outcome].append(m)
    routed = groups.pop(ROUTED, [])
    no_plan = groups.pop(NO_PLAN, [])
    routers = groups.pop(ROUTER, [])
    own = groups.pop(OWN_KERNEL, [])
    shapes = {(m.n, m.k): m.ms for m in routed}
    launched = {(n, k, m): c for n, k, m, c in counts["launches"] if m in shapes.get((n, k), ())}
    # Calls of a routed shape at one of its planned M that ran F.linear instead of our kernel.
    fell = {(n, k, m, r): c for n, k, m, r, c in counts["fallbacks"] if m in shapes.get((n, k), ())}
    never = [m for m in routed if not any((m.n, m.k) == key[:2] for key in launched)]
    candidates = len(matches) - len(routers)
    parts = [
        f"{LOG_PREFIX} {_describe_device(device)}: routed {len(routed)} of {candidates} unquantized layers"
        + (f": {_by_shape(routed, with_ms=True)}" if routed else ""),
        "launches (a CUDA graph's counted once, at capture): " + (_counts(launched) or "none"),
    ]
    if fell:
        parts.append(f"{FELL_BACK}: " + _counts(fell))
    else:
        parts.append("fallbacks at planned M: none")
    if never:
        parts.append(f"never launched: {_by_shape(never)}")
    forwards = [m for m in routed if m.own_forward]
    if forwards:
        parts.append(f"own forward (routed only where it calls apply): {_by_shape(forwards)}")
    parts.append("no plan: " + (_by_shape(no_plan, with_dtype=True) or "none"))
    for outcome, skipped in sorted(groups.items()):
        parts.append(f"skipped ({outcome}): {_by_shape(skipped)}")
    if own:
        parts.append(f"{OWN_KERNEL}: {_by_shape(own)}")
    if routers:
        parts.append(f"left alone ({ROUTER}): {_by_shape(routers, with_dtype=True)}")
    return "; ".join(parts)


def _describe_device(device: torch.device) -> str:
    if device.type != "cuda":
        return f"{device.type} (no GPU)"
    capability = torch.cuda.get_device_capability(device)
    arch = ARCH_FOR_CAPABILITY.get(capability, f"sm_{capability[0]}{capability[1]}: no skinny-gemm target")
    loaded = "manifest loaded" if api.manifest(device) is not None else "no manifest loaded"
    return f"{torch.cuda.get_device_name(device)} ({device}, {arch}, {loaded})"


def _largest_first(key):
    (n, k) = key[:2]
    return (-n * k, key)


def _counts(counted: dict) -> str:
    """``(N, K) M=1 x12, M=2 x4`` per shape, largest weight first; a fallback's reason in brackets."""
    per_shape = defaultdict(list)
    for key, count in sorted(counted.items()):
        n, k, m, *reason = key
        per_shape[(n, k)].append(f"M={m} x{count}" + (f" ({reason[0]})" if reason else ""))
    return ", ".join(f"({n}, {k}) " + ", ".join(per_shape[(n, k)]) for n, k in sorted(per_shape, key=_largest_first))


def _by_shape(matches, with_ms=False, with_dtype=False) -> str:
    """``(N, K) name xCOUNT [M=...] [dtype]`` per shape, largest weight first."""
    shapes = defaultdict(list)
    for m in matches:
        shapes[(m.n, m.k)].append(m)
    items = []
    for (n, k), group in sorted(shapes.items(), key=lambda kv: _largest_first(kv[0])):
        names = ",".join(sorted({g.name.rsplit(".", 1)[-1] for g in group}))
        text = f"({n}, {k}) {names} x{len(group)}"
        if with_ms:
            text += " M=" + ",".join(str(m) for m in sorted(group[0].ms))
        if with_dtype:
            text += " " + ",".join(sorted({g.dtype for g in group}))
        items.append(text)
    return ", ".join(items)
