"""GPU measurement shared by tune and bench: cold-L2 graph timing and the float64 correctness check.

Method: a CUDA graph replays a chain of GEMMs over copies of the
weight adding up to at least 1 GiB, so every GEMM reads HBM; time per GEMM =
replay time / copies. Candidates and cuBLAS are timed interleaved in one
process, in a rotating order, and the median over trials is kept.
"""

from __future__ import annotations

import dataclasses
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


def cublas_call(x, w, out):
    """A zero-argument call of cuBLAS (torch.mm) for ``capture``: out = x @ w.T."""
    return lambda: torch.mm(x, w.T, out=out)


def kernel_call(lib, variant: str, x, w, out, n: int, k: int):
    """A zero-argument launch of a loaded variant for ``capture``: out = x @ w.T."""
    return lambda: lib.launch(variant, x, w, out, None, n, k)


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


# The bound a correct BF16-output kernel meets at any input scale:
# |y - ref| <= 2^-8 |ref| + 2^-16 (|x| @ |W|^T): one bf16 rounding plus fp32
# accumulation error, which scales with the sum of |x||w|. Where the product is
# rounded before a residual is added (F.linear + residual), one more 2^-8 |x @ W^T|.
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


def check_bf16_result(y, x, w, residual=None, rounded_before_residual=False) -> int:
    """Count outputs outside the bound; NaN (an unwritten, poisoned element) always counts."""
    ref, bound = allowed(x, w, residual, rounded_before_residual)
    return int((~((y.double() - ref).abs() <= bound)).sum().item())


def random_tensor(shape, device, scale=1.0, outliers=True, generator=None, dtype=torch.bfloat16):
    """Gaussian values times ``scale``; with outliers, about 1 in 500 entries is 32x larger (sign kept); never zeros."""
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


# The served step's stand-ins (aot/steps.py) read slices of one arena, handed out in order and
# wrapped at this size: a slice is read again only after gigabytes of other traffic, far more
# than the H200's 60 MB L2, so every stand-in reads HBM as its real counterpart would.
READ_ARENA_BYTES = 8 << 30
READ_ROW = 2048  # bf16 elements per row of a read slice (4 KB)


@dataclass
class StepData:
    """Device buffers of one built step at one M: per GEMM (x, w, out), per op a launch callable."""

    ops: list
    m: int
    gemms: dict  # op index -> (x, w, out)
    calls: dict  # op index -> zero-argument callable (non-GEMM ops)


def step_data(ops, m: int, device, read_cap: int | None = None) -> StepData:
    """Buffers and op stand-ins for a built step: distinct random weights per GEMM call, one read arena.

    ``read_cap`` (bytes) shortens every read stand-in to at most that much: the ops between the GEMMs
    stay (none triggers PDL), their HBM time shrinks, and with it the noise a step-level choice sees.
    """
    import torch.nn.functional as F

    gemms, calls = {}, {}
    if read_cap is not None:
        ops = [dataclasses.replace(op, bytes=min(op.bytes, read_cap)) if _reads(op) else op for op in ops]
    read_total = sum(-(-op.bytes // (2 * READ_ROW)) * 2 * READ_ROW for op in ops if _reads(op))
    arena = torch.zeros(max(1, min(read_total, READ_ARENA_BYTES) // 2), device=device, dtype=torch.bfloat16)
    acc = torch.empty(READ_ROW, device=device, dtype=torch.bfloat16)
    offset = 0
    for i, op in enumerate(ops):
        if op.is_gemm:
            w = (torch.randn(op.n, op.k, device=device) * 0.05).to(torch.bfloat16)
            x = torch.randn(m, op.k, device=device).to(torch.bfloat16)
            gemms[i] = (x, w, torch.empty(m, op.n, device=device, dtype=torch.bfloat16))
        elif _reads(op):
            rows = -(-op.bytes // (2 * READ_ROW))
            if offset + rows * READ_ROW > arena.numel():
                offset = 0
            view = (
                arena[offset : offset + rows * READ_ROW].view(rows, READ_ROW)
                if rows * READ_ROW <= arena.numel()
                else torch.zeros(rows, READ_ROW, device=device, dtype=torch.bfloat16)
            )
            offset += rows * READ_ROW
            calls[i] = lambda v=view: torch.sum(v, dim=0, out=acc)
        elif op.kind == "silu_and_mul":
            src = torch.randn(m, 2 * op.size, device=device).to(torch.bfloat16)
            dst = torch.empty(m, op.size, device=device, dtype=torch.bfloat16)
            calls[i] = lambda s=src, d=dst, h=op.size: torch.mul(F.silu(s[:, :h]), s[:, h:], out=d)
        else:
            h = torch.randn(m, op.size, device=device).to(torch.bfloat16)
            g = torch.ones(op.size, device=device, dtype=torch.bfloat16)
            if op.kind == "rms_norm":
                calls[i] = lambda h=h, g=g: F.rms_norm(h, (h.shape[1],), g)
            elif op.kind == "add_rms_norm":
                r = torch.randn(m, op.size, device=device).to(torch.bfloat16)
                calls[i] = lambda h=h, g=g, r=r: F.rms_norm(h.add_(r), (h.shape[1],), g)
            else:  # rotary: one elementwise pass over q and k of the rank
                calls[i] = lambda h=h: h.mul_(0.9999)
    return StepData(ops, m, gemms, calls)


def _reads(op) -> bool:
    """Stand-ins that only read bytes: attention, recurrent, moe, another dtype's weight, the all-reduce placeholder."""
    return op.kind in ("attention", "recurrent", "moe", "weight_read", "all_reduce")


def step_calls(data: StepData, gemm=None, with_ops: bool = True) -> list:
    """The launch callables of a step in order: ``gemm(x, w, out, n, k)`` per GEMM (None: no GEMMs), the stand-ins."""
    calls = []
    for i, op in enumerate(data.ops):
        if op.is_gemm:
            if gemm is not None:
                x, w, out = data.gemms[i]
                calls.append(lambda x=x, w=w, out=out, n=op.n, k=op.k: gemm(x, w, out, n, k))
        elif with_ops:
            calls.append(data.calls[i])
    return calls
