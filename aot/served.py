"""The bench's served-step section: a model's decode step per (TP, M) as CUDA graphs, cuBLAS beside our plans
and the peer (vLLM's own kernel, aot/peer.py), and the row each (TP, M) reports (aot/bench.py runs it)."""

from __future__ import annotations

import sys


def build_served(model_file, ms, arch: str = "sm_90a") -> tuple[dict, list]:
    """The model file (validated) and its built steps [(tp, m, ops)]: everything is checked before any GPU work."""
    from . import steps

    model = steps.load(model_file)
    return model, [(tp, m, steps.build(model, tp, m, arch=arch)) for tp in model["step"]["tp"] for m in ms]


def steps_build(model: dict, tp: int, m: int, arch: str = "sm_90a") -> list:
    """One built step (aot/steps.py), the GEMMs being the arch's seed linears or the model's BF16 ones."""
    from . import steps

    return steps.build(model, tp, m, arch=arch)


def bench_served(model: dict, built: list, trials: int, progress: bool, peer_lib=None, device=None) -> list[dict]:
    """Per (TP, M): the served step, the ops alone and the bare chain as CUDA graphs, cuBLAS vs ours (vs the peer)."""
    import torch
    from tqdm import tqdm

    import skinny_gemm

    from ..runtime import ops as rt_ops
    from . import measure as ms

    device = device or torch.device("cuda", torch.cuda.current_device())
    rows = []
    bar = tqdm(total=len(built), desc="served", unit="step", disable=not progress)
    for tp, m, ops in built:
        gemm_ops = [op for op in ops if op.is_gemm]
        planned = sum(1 for op in gemm_ops if m in skinny_gemm.planned_ms(op.n, op.k))
        data = ms.step_data(ops, m, device)
        for i, op in enumerate(ops):
            x, w, _ = data.gemms.get(i, (None, None, None))
            if op.is_gemm and m in skinny_gemm.planned_ms(op.n, op.k) and rt_ops.plan(x, w) is None:
                # A silent fallback would be published as kernel time.
                raise SystemExit(
                    f"bench: ({op.n}, {op.k}, {m}) is planned but would not dispatch; see `skinny-gemm env`"
                )
        providers = {"cublas": lambda x, w, out, n, k: torch.mm(x, w.T, out=out)}
        if planned:
            providers["ours"] = lambda x, w, out, n, k: skinny_gemm.linear(x, w)
        if peer_lib is not None:
            for label, pdl in (("peer", False), ("peer_pdl", True)):
                providers[label] = _peer_gemm(peer_lib, m, pdl)
        graphs = {"ops": ms.capture(ms.step_calls(data, None))}
        for name, fn in providers.items():
            graphs[f"{name}+step"] = ms.capture(ms.step_calls(data, fn))
            graphs[f"{name}+bare"] = ms.capture(ms.step_calls(data, fn, with_ops=False))
        t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=trials)
        rows.append(served_row(model, tp, m, ops, planned, t, peer_lib))
        del graphs, data
        if device.type == "cuda":
            torch.cuda.empty_cache()
        bar.update(1)
    bar.close()
    return rows


def _peer_gemm(peer_lib, m: int, pdl: bool):
    """A GEMM callable that runs the peer's variant for the cell, cuBLAS where it has none."""
    import torch

    def gemm(x, w, out, n, k):
        vid = peer_lib.variant_for(n, k, m, pdl)
        if vid is None:
            torch.mm(x, w.T, out=out)
        else:
            peer_lib.launch(vid, x.data_ptr(), w.data_ptr(), out.data_ptr(), n, k)

    return gemm


def served_row(model: dict, tp: int, m: int, ops: list, planned: int, t: dict, peer_lib=None) -> dict:
    """One (TP, M) result: times, the projections' share (step - ops) and the speedups over cuBLAS."""
    gemm_ops = [op for op in ops if op.is_gemm]
    providers = sorted({key.split("+")[0] for key in t if "+" in key})
    share = {p: t[f"{p}+step"] - t["ops"] for p in providers}
    row = {
        "model": model.get("name", "?"),
        "tp": tp,
        "m": m,
        "gemms": len(gemm_ops),
        "planned_gemms": planned,
        "ops": len(ops) - len(gemm_ops),
        "weight_gb": sum(op.n * op.k * 2 for op in gemm_ops) / 1e9,
        "ops_gb": sum(op.bytes for op in ops if not op.is_gemm) / 1e9,
        "us": dict(sorted(t.items())),
        "share_us": share,
        "speedup": {
            "step": {p: t["cublas+step"] / t[f"{p}+step"] for p in providers if p != "cublas"},
            "share": {p: share["cublas"] / share[p] for p in providers if p != "cublas" and share[p] > 0},
            "bare": {p: t["cublas+bare"] / t[f"{p}+bare"] for p in providers if p != "cublas"},
        },
    }
    if not planned:
        row["ours"] = "no plan"
    if peer_lib is not None:
        row["peer_gemms"] = sum(1 for op in gemm_ops if peer_lib.variant_for(op.n, op.k, m, False))
    return row


def load_peer(folder):
    """The peer on this GPU, or None with one line saying why it is skipped."""
    from ..runtime.driver import DriverError
    from . import peer

    try:
        return peer.PeerLib(folder)
    except (peer.PeerError, DriverError, OSError, KeyError, TypeError, ValueError) as exc:
        print(f"bench: peer section skipped: {exc}", file=sys.stderr)
        return None
