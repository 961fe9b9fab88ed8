"""Shared by this folder's H200 experiments (run as scripts from the repository root, so a sibling import):
per-kernel CUPTI durations of a CUDA graph's replays, interleaved wall times of several graphs, weight copies."""

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


def time_graphs(graphs: dict, trials: int = 7, reps: int = 3) -> dict:
    """Median wall us per replay of each graph: ``trials`` rounds in a rotating order, ``reps`` replays each."""
    out: dict = {k: [] for k in graphs}
    names = list(graphs)
    for t in range(trials):
        for k in names[t % len(names) :] + names[: t % len(names)]:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            for _ in range(reps):
                graphs[k].replay()
            b.record()
            b.synchronize()
            out[k].append(a.elapsed_time(b) * 1e3 / reps)
    return {k: statistics.median(v) for k, v in out.items()}


def copies(n: int, k: int, total: int, gen) -> list:
    """Weight (n, k) bf16 copies filling ``total`` bytes (at least 2): two random ones, the rest clones."""
    base = [(torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16() for _ in range(2)]
    return base + [base[i % 2].clone() for i in range(2, max(2, total // (n * k * 2)))]
