"""Shared by this folder's H200 experiments (run as scripts from the repository root, so a sibling import):
per-kernel CUPTI durations of a CUDA graph's replays, weight copies (wall times: aot/measure.time_graphs)."""

import statistics

import torch


def kernel_events(graph, replays: int = 3) -> list:
    """(start us, end us, name) of every kernel of ``replays`` replays (after one untimed), in start order."""
    graph.replay()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            graph.replay()
        torch.cuda.synchronize()
    events = [ev for ev in prof.events() if ev.device_type == torch.autograd.DeviceType.CUDA]
    return sorted((ev.time_range.start, ev.time_range.end, ev.name) for ev in events)


def kernels(graph, replays: int = 3, width: int = 70) -> dict:
    """Per kernel name (cut to ``width``): [median CUPTI duration in us, launches per replay]."""
    by: dict = {}
    for start, end, name in kernel_events(graph, replays):
        by.setdefault(name[:width], []).append(end - start)
    return {k: [round(statistics.median(v), 2), len(v) // replays] for k, v in sorted(by.items())}


def copies(n: int, k: int, total: int, gen) -> list:
    """Weight (n, k) bf16 copies filling ``total`` bytes (at least 2): two random ones, the rest clones."""
    base = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16() for _ in range(2)]
    return base + [base[i % 2].clone() for i in range(2, max(2, total // (n * k * 2)))]
