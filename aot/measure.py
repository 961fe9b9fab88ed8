"""GPU measurement shared by tune and bench: cold-L2 graph timing and the float64 correctness check.

Method (DESIGN.md): a CUDA graph replays a chain of GEMMs over copies of the
weight adding up to at least 1 GiB, so every GEMM reads HBM; time per GEMM =
replay time / copies. Candidates and cuBLAS are timed interleaved in one
process, in a rotating order, and the median over trials is kept.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

MIN_CHAIN_BYTES = 1 << 30
H200_PEAK_TBPS = 4.8


@dataclass
class Inputs:
    """One shape's device buffers: weight copies, tokens per M, one output per copy."""

    n: int
    k: int
    weights: list
    tokens: dict
    outs: dict


def weight_copies(n: int, k: int, device, min_bytes: int = MIN_CHAIN_BYTES) -> list:
    """Enough independent random bf16 copies of an (n, k) weight to exceed ``min_bytes``."""
    copies = max(2, -(-min_bytes // (n * k * 2)))
    return [(torch.randn(n, k, device=device) * 0.05).to(torch.bfloat16) for _ in range(copies)]


def make_inputs(n: int, k: int, ms, device) -> Inputs:
    """Buffers for timing shape (n, k) at every M in ``ms``."""
    weights = weight_copies(n, k, device)
    tokens = {m: torch.randn(m, k, device=device).to(torch.bfloat16) for m in ms}
    outs = {m: [torch.empty(m, n, device=device, dtype=torch.bfloat16) for _ in weights] for m in ms}
    return Inputs(n, k, weights, tokens, outs)


def capture(calls) -> torch.cuda.CUDAGraph:
    """Capture a list of zero-argument launch callables as one CUDA graph (after one eager warm-up)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for call in calls:
            call()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    graph.replay()
    torch.cuda.synchronize()
    return graph


def time_graphs(graphs: dict, per_graph: dict, trials: int = 7, reps: int = 3) -> dict:
    """Median microseconds per GEMM of each graph, replayed interleaved in a rotating order."""
    names = list(graphs)
    samples = {name: [] for name in names}
    for trial in range(trials):
        order = names[trial % len(names) :] + names[: trial % len(names)]
        for name in order:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                graphs[name].replay()
            stop.record()
            stop.synchronize()
            samples[name].append(start.elapsed_time(stop) * 1000.0 / reps / per_graph[name])
    return {name: statistics.median(v) for name, v in samples.items()}


def bandwidth_pct(n: int, k: int, us: float) -> float:
    """Weight bytes over time, as % of the H200's 4.8 TB/s datasheet bandwidth."""
    return n * k * 2 / (us * 1e-6) / (H200_PEAK_TBPS * 1e12) * 100.0


def random_case(m: int, n: int, k: int, device, scale: float = 1.0, residual: bool = False, seed: int | None = None):
    """Fresh random inputs with outliers (a few 30x columns/rows) at a given scale; never zeros."""
    gen = torch.Generator(device=device)
    gen.manual_seed(seed if seed is not None else torch.seed() % (1 << 62))
    x = torch.randn(m, k, device=device, generator=gen) * scale
    x[:, torch.randint(0, k, (max(1, k // 64),), device=device, generator=gen)] *= 30.0
    w = torch.randn(n, k, device=device, generator=gen) * 0.05 * scale
    w[torch.randint(0, n, (max(1, n // 64),), device=device, generator=gen)] *= 30.0
    res = torch.randn(m, n, device=device, generator=gen) * scale if residual else None
    to_bf16 = lambda t: None if t is None else t.to(torch.bfloat16)  # noqa: E731
    return to_bf16(x), to_bf16(w), to_bf16(res)


def check_bf16_result(y: torch.Tensor, x: torch.Tensor, w: torch.Tensor, residual=None, rounded_before_residual=False) -> int:
    """Count elements outside |y - ref| <= 2^-8|ref| + 2^-16(|x|@|W|^T) (+2^-8|x@W^T| if the product was rounded first).

    NaN (an unwritten, poisoned element) always counts as outside.
    """
    xd, wd = x.double(), w.double()
    prod = xd @ wd.T
    ref = prod + (residual.double() if residual is not None else 0.0)
    bound = 2.0**-8 * ref.abs() + 2.0**-16 * (xd.abs() @ wd.abs().T)
    if rounded_before_residual:
        bound = bound + 2.0**-8 * prod.abs()
    ok = (y.double() - ref).abs() <= bound
    return int((~ok).sum().item())
