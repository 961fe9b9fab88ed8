"""The vLLM plugin's summary line: what was routed on a model, how often each routed (shape, M) was called, and
every other BF16 projection with why it was not routed."""

from __future__ import annotations

from collections import Counter, defaultdict

import torch

from . import api, vllm_routes
from .manifest import ARCH_FOR_CAPABILITY
from .vllm_routes import NO_PLAN, OWN_KERNEL, ROUTED, ROUTER, layer_matches

LOG_PREFIX = "skinny-gemm vLLM plugin:"


def summary(model: torch.nn.Module, calls: Counter | None = None) -> str:
    """The one log line: GPU and arch, routes and their calls so far, routes never called, shapes without a plan,
    layers skipped and why, layers vLLM's own kernels claim, MoE routers left alone."""
    calls = vllm_routes.CALLS if calls is None else calls
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
    called = {(n, k, m): c for (n, k, m), c in calls.items() if m in shapes.get((n, k), ())}
    never = [m for m in routed if not any((m.n, m.k) == key[:2] for key in called)]
    candidates = len(matches) - len(routers)
    parts = [
        f"{LOG_PREFIX} {_describe_device(device)}: routed {len(routed)} of {candidates} unquantized layers"
        + (f": {_by_shape(routed, with_ms=True)}" if routed else ""),
        "calls: " + (_calls(called) or "none"),
    ]
    if never:
        parts.append(f"never called: {_by_shape(never)}")
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


def _calls(called: dict) -> str:
    """``(N, K) M=1 x12, M=2 x4`` per shape, largest weight first."""
    per_shape = defaultdict(dict)
    for (n, k, m), count in called.items():
        per_shape[(n, k)][m] = count
    return ", ".join(
        f"({n}, {k}) " + ", ".join(f"M={m} x{c}" for m, c in sorted(per_shape[(n, k)].items()))
        for n, k in sorted(per_shape, key=_largest_first)
    )


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
