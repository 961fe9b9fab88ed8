"""`tune measure` (GPU, no compiler): check every candidate of every cell, time it against cuBLAS alone, then
re-rank the winners inside the served step (aot/decode_phase.py) where cells.json has one."""

from __future__ import annotations

import datetime
import json
from pathlib import Path

from ..kernels.config import KernelConfig
from ..runtime.manifest import dumps
from .decode_phase import DECODE_PASSES, DECODE_TOP, confirm_replays, decode_phase
from .prepare import CELLS_FILE
from .results import CONFIRM_MARGIN, MIN_SPEEDUP


def measure(
    cand_dir: Path,
    results: Path,
    trials: int = 5,
    progress: bool = True,
    decode_top: int = DECODE_TOP,
    decode_passes: int = DECODE_PASSES,
    read_cap_mb: int | None = None,
    confirm_trials: int | None = None,
    decode_min_speedup: float = MIN_SPEEDUP,
) -> dict:
    """On the GPU: check and time every candidate of every cell against cuBLAS; write and return the results."""
    import torch
    from tqdm import tqdm

    from ..runtime import loader
    from . import measure as ms

    spec = json.loads((cand_dir / CELLS_FILE).read_text())
    arch = spec["arch"]
    if not torch.cuda.is_available():
        raise ValueError(
            f"{cand_dir}: measuring needs a CUDA GPU and this torch sees none (prepare it here, measure there)"
        )
    device = torch.device("cuda", torch.cuda.current_device())
    lib = loader.load_dir(cand_dir / arch, device)
    gpu = torch.cuda.get_device_name(device)
    by_shape: dict = {}
    for row in spec["cells"]:
        by_shape.setdefault((row["n"], row["k"]), []).append(row)
    out_rows = []
    bar = tqdm(
        total=sum(len(r["candidates"]) for r in spec["cells"]), desc="measure", unit="cand", disable=not progress
    )
    for (n, k), rows in sorted(by_shape.items()):
        inputs = ms.make_inputs(n, k, [r["m"] for r in rows], device)
        for row in rows:
            m = row["m"]
            x = inputs.tokens[m]
            graphs = {"cublas": ms.capture([ms.cublas_call(x, w, o) for w, o in zip(inputs.weights, inputs.outs[m])])}
            per_graph = {"cublas": len(inputs.weights)}
            cands = {}
            for cfg_json in row["candidates"]:
                cfg = KernelConfig.from_json(cfg_json)
                bad = _check(lib, cfg, n, k, m, device, ms)
                cands[cfg.name] = {"config": cfg_json, "bad_elements": bad}
                if bad == 0:
                    graphs[cfg.name] = ms.capture(
                        [ms.kernel_call(lib, cfg.name, x, w, o, n, k) for w, o in zip(inputs.weights, inputs.outs[m])]
                    )
                    per_graph[cfg.name] = len(inputs.weights)
                bar.update(1)
            times = ms.time_graphs(graphs, per_graph, trials=trials)
            del graphs
            for name, info in cands.items():
                info["us"] = times.get(name)
            out_rows.append({"n": n, "k": k, "m": m, "cublas_us": times["cublas"], "candidates": cands})
        del inputs
        torch.cuda.empty_cache()
    bar.close()
    in_step = decode_top > 1 and bool(spec.get("decode"))
    confirms = confirm_replays(trials, confirm_trials)
    if in_step:
        decode_phase(
            lib,
            out_rows,
            spec["decode"],
            device,
            decode_top,
            trials,
            progress,
            decode_passes,
            None if read_cap_mb is None else read_cap_mb << 20,
            confirms,
            min_speedup=decode_min_speedup,
        )
    data = {
        "arch": arch,
        "gpu": gpu,
        "date": datetime.date.today().isoformat(),
        "method": "cold L2: CUDA graph over >= 1 GiB of weight copies, interleaved with cuBLAS (torch.mm), "
        f"median of {trials} trials",
        "cells": out_rows,
    }
    if in_step:
        if decode_min_speedup != MIN_SPEEDUP:
            data["decode_min_speedup"] = decode_min_speedup  # tune write plans the step's picks down to it
        data["decode_method"] = (
            f"per cell, its {decode_top} fastest isolated winners (>= {decode_min_speedup}x) and their no-PDL twins "
            "(whatever the twins' alone speedup: PDL on and off compete in every cell), and cuBLAS itself (a cell choosing it gets no plan entry), "
            "timed inside one CUDA graph of the "
            "whole served decode step per TP (the model file's step: projections with the ops between them; "
            "other cells on their current choice), interleaved, median of "
            f"{trials} trials; the lowest sum over the TPs whose step contains the shape is chosen; "
            f"{decode_passes} pass(es) over the cells, the last decides; then each kernel family holding two or "
            "more cells is swapped out whole for their best other candidates, kept if the steps get 1% faster"
            + (
                "; then per M the whole steps with these choices against every cell on its alone-fastest "
                "candidate (cuBLAS where the passes chose it or found it faster than that candidate), interleaved, "
                f"median of {confirms} trials: the choices are kept only if their sum over the TPs is "
                f"{CONFIRM_MARGIN:.2%} lower, else that M goes back to that fallback set"
                if confirms
                else "; no confirm step"
            )
            + (f"; the step's read stand-ins capped at {read_cap_mb} MB each" if read_cap_mb is not None else "")
        )
    results.write_text(dumps(data))
    return data


def _check(lib, cfg: KernelConfig, n: int, k: int, m: int, device, ms) -> int:
    """Bad elements over two fresh random cases (one with a residual, one scaled 1e3), outputs poisoned."""
    import torch

    bad = 0
    for scale, with_res in ((1.0, False), (1e3, True)):
        x, w, res = ms.random_case(m, n, k, device, scale=scale, residual=with_res)
        y = torch.full((m, n), float("nan"), device=device, dtype=torch.bfloat16)
        lib.launch(cfg.name, x, w, y, res, n, k)
        torch.cuda.synchronize()
        bad += ms.check_bf16_result(y, x, w, res)
    return bad
