"""Tune plan tables: prepare candidates on the CPU machine, measure them on the GPU, write the plan table.

  skinny-gemm tune prepare --arch sm_90a --shapes kernels/models/glm-5.3-flash.json --out DIR   (CPU, compiles)
  skinny-gemm tune measure DIR --results results.json                             (GPU, no compiler)
  skinny-gemm tune write results.json                                             (CPU, writes kernels/plans/<arch>.json)

`prepare` generates candidate configs per (n, k, m) cell and compiles them with
the normal build (one manifest, no plans); where the model file has a served
step (its "step" key) for the arch's seed set, every candidate also gets its
no-PDL twin, and the served step of each TP at each M goes into cells.json.
`measure` checks every candidate against a float64 reference and times it
against cuBLAS with the cold-L2 graph method (aot/measure.py), each cell in a
chain of its own shape; then it re-ranks each cell's fastest winners inside
the served step (aot/decode_phase.py: one CUDA graph of the whole step per TP,
the ops between the projections included, the other cells on their current
choice, passes in order of each shape's share of the step, then each kernel
family swapped out whole; PDL is one of the choices per entry). `write`
keeps, per cell, the decode-step choice or else the fastest correct
candidate, if it beats cuBLAS by at least 5%, with measured provenance.
Cells that do not win stay on cuBLAS.

Why the second phase: a same-shape chain flatters kernels that load weight
before the PDL wait. Short kernels then cascade (each launches the next at
its start, so many are resident at once, all streaming), which cannot
happen between the long GEMMs of a real step: the v3 plans summed to
1032 us per TP4 step yet ran it in 1101 us; picking in the step brought
that to 1017 us (docs/perf.md v4).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from ..kernels.config import MAX_M, MMA_ROWS, SM_REGISTERS, ConfigError, KernelConfig
from ..runtime.manifest import dumps
from .decode_phase import (  # noqa: F401 (decode_phase, family and the constants are re-exported)
    DECODE_PASSES,
    DECODE_TOP,
    FAMILY_MARGIN,
    decode_phase,
    family,
    no_pdl_twins,
    served_steps,
)

MIN_SPEEDUP = 1.05
CELLS_FILE = "cells.json"
# vLLM's decode CUDA-graph sizes up to 16 (DESIGN.md: a batch is padded up to one of them); the ones
# the kernels can run (config.py's MAX_M) may be tuned beyond a seed set's own token counts.
VLLM_GRAPH_MS = (1, 2, 4, 8, 16)
WIDE_MS = tuple(m for m in VLLM_GRAPH_MS if m <= MAX_M)


# The mma kernel's pipelines, (cols, stages) at unroll 1: 4, 8 or 16 loads of 512 bytes
# (one 16-byte load per lane) in flight per warp, 40-140 registers on sm_90a.
# (32, 4) took 96-128 registers and spilled: dropped. (8, 16) lets one warp
# hold a whole 512-k range of its 8 rows, 15 loads of it issued before the PDL wait.
MMA_PIPES = ((8, 4), (8, 8), (8, 16), (16, 2), (16, 4), (32, 2))
# L2 fetch per weight load: 128 B beat v3's 256 B by 3-9% on 4096x2048..6416x4096,
# no hint won 4096x1536 (docs/perf.md v4). The L2 bulk prefetch never made a
# decode-step pick for the mma kernel in the v4 sweep: it is no longer timed there.
MMA_FETCH = (256, 128, 0)
# Most candidates `candidates` gives one cell of the sm_90a seed set (38720x4096 at M=1: 410).
MAX_CANDIDATES = 480
# SMs of the H200 (and H100 SXM), for the persistent grids below.
H200_SMS = 132
# Cluster-split mma (v6): K shared by the CTAs of a cluster. Its first sweep (8 cells,
# splits 2/4/8, K splits 64-512 threads) won with 2 or 4 CTAs of 64-256 threads; 8 never
# placed in a cell's top five (docs/perf.md v6).
SPLIT_PIPES = ((8, 4), (8, 8), (16, 2), (16, 4))
SPLIT_FETCH = (256, 128)


# Persistent SIMT (v7): grids of 4-8 CTAs per SM of the H200's 132 that walk the row groups.
# Its first sweep (M=1, 8 cells, grids of 2/4/6/8 per SM) won with 4 and 6 per SM, never 2.
PERSIST_GRIDS = (528, 660, 792, 924, 1056)


def persist_candidates(n: int, k: int, m: int, grids=PERSIST_GRIDS) -> list[KernelConfig]:
    """The persistent SIMT configs for one cell whose grid is capped and can be resident at once on the H200."""
    found = []
    for grid in grids:
        for k_threads in (64, 128, 256):
            for cols in (1, 2):
                for unroll in (2, 4):
                    cfg = KernelConfig(m=m, kind="simt", threads=256, k_threads=k_threads, cols=cols, unroll=unroll,
                                       prefetch=False, early=True, persist=grid)
                    capped = n // cfg.cols_per_cta > grid
                    if _valid(cfg, n, k) and capped and grid <= H200_SMS * _resident_ctas(cfg):
                        found.append(cfg)
    return found


def _resident_ctas(cfg: KernelConfig) -> int:
    """CTAs of ``cfg`` one sm_90 SM holds at once: 2048 threads, 64K registers (an estimate: the
    config's register rule plus 24 for addresses and indices, in ptxas's 8-register steps)."""
    regs = -(-(cfg.register_rule[0] + 24) // 8) * 8
    return min(2048 // cfg.threads, SM_REGISTERS // (cfg.threads * regs))


def split_candidates(n: int, k: int, m: int, splits=(2, 4), k_threads_set=(64, 128, 256)) -> list[KernelConfig]:
    """The cluster-split mma configs for one cell: every split, pipeline, K split and fetch size that is valid."""
    found = []
    for split in splits:
        for cols, stages in SPLIT_PIPES:
            for k_threads in k_threads_set:
                for fetch in SPLIT_FETCH:
                    cfg = KernelConfig(m=m, kind="mma", threads=k_threads, k_threads=k_threads, cols=cols, unroll=1,
                                       stages=stages, prefetch=False, fetch=fetch, split=split)
                    if _valid(cfg, n, k):
                        found.append(cfg)
    return found


# M >= 2 (v9): mma CTAs of 2 or 4 row groups (at most 512 threads), the mma analogue of v8's
# SIMT CTA shapes. (Clusters of 8 one- or two-warp CTAs, each with a whole 512-k slice in
# flight, were timed in the same run: 1.4-1.6x slower than the best mma on every K=4096 shape.)
MMA_GROUPS = (2, 4)
GROUP_FETCH = (256, 128)


def group_candidates(n: int, k: int, m: int) -> list[KernelConfig]:
    """The multi-group mma configs for one cell: per pipeline and K split, CTAs of 2 or 4 row groups."""
    found = []
    for cols, stages in MMA_PIPES:
        for k_threads in (32, 64, 128, 256):
            for groups in MMA_GROUPS:
                for fetch in GROUP_FETCH:
                    cfg = KernelConfig(m=m, kind="mma", threads=k_threads * groups, k_threads=k_threads, cols=cols,
                                       unroll=1, stages=stages, prefetch=False, fetch=fetch)
                    if cfg.threads <= 512 and _valid(cfg, n, k):
                        found.append(cfg)
    return found


# Sliced mma (v15): tiles of 8 / slices rows x slices K slices. Its first sweep (8 cells,
# 760 configs) won every K=4096 cell at M=1..4 with CTAs of at most 4 K-loop trips. A wider
# sweep of three M=1 cells (813 configs) then won with 4 tiles per CTA and 512 threads
# (4096x4096 8.47 -> 8.06 us), and fetch 0 or 128 B beat 256 on every sliced winner.
SLICE_CHOICES = (2, 4, 8)
SLICE_TILES = (1, 2, 4)
SLICE_K_THREADS = (64, 128, 256, 512)
SLICE_STAGES = (2, 4, 8)
SLICE_FETCH = (128, 0)
SLICE_MAX_TRIPS = 4


def slice_candidates(n: int, k: int, m: int) -> list[KernelConfig]:
    """The sliced mma configs for one cell: every slice count the cell's M allows, 1, 2 or 4 tiles of rows, short CTAs."""
    found = []
    for slices in SLICE_CHOICES:
        for cols in (MMA_ROWS // slices * tiles for tiles in SLICE_TILES):
            for k_threads in SLICE_K_THREADS:
                for stages in SLICE_STAGES:
                    for fetch in SLICE_FETCH:
                        cfg = KernelConfig(m=m, kind="mma", threads=k_threads, k_threads=k_threads, cols=cols,
                                           unroll=1, stages=stages, prefetch=False, fetch=fetch, slices=slices)
                        if _valid(cfg, n, k) and k // cfg.k_step <= SLICE_MAX_TRIPS:
                            found.append(cfg)
    return found


def candidates(n: int, k: int, m: int) -> list[KernelConfig]:
    """Candidate configs for one cell (at most MAX_CANDIDATES): the pipelined mma kernel (also cluster-split, sliced and, at M >= 2, several row groups per CTA), the SIMT kernel (also persistent).

    mma: per pipeline, every K split (warps per row tile) that divides K,
    each with every L2 fetch size in MMA_FETCH. Less K split leaves HBM idle; more
    shortens each warp's stream, which pays where the grid runs in several
    waves: a last, partial wave is latency-bound, so its warps should be
    short. (v3 kept four splits around the one putting 48 KB in flight per SM;
    the winners sat at both ends of that window, so now all are timed.) One
    row group per CTA keeps every N divisible by 8 valid (3336 = 8 * 417);
    at M >= 2 also 2 or 4 per CTA (group_candidates).
    """
    found = []
    for cols, stages in MMA_PIPES:
        for k_threads in (32, 64, 128, 256, 512):
            for fetch in MMA_FETCH:
                cfg = KernelConfig(m=m, kind="mma", threads=k_threads, k_threads=k_threads, cols=cols, unroll=1,
                                   stages=stages, prefetch=False, fetch=fetch)
                if _valid(cfg, n, k):
                    found.append(cfg)
    found += split_candidates(n, k, m)
    found += slice_candidates(n, k, m)
    if m >= 2:
        found += group_candidates(n, k, m)
    if m <= 2:
        found += persist_candidates(n, k, m)
    # The bulk-copy kernel (kind "bulk", v5) is not a candidate: any bulk pick made the whole
    # decode step ~50 us slower (TP8 M=4: one cell on bulk 799-800 us, none 741-747, both
    # 792; docs/perf.md v9), whatever its count of calls, and the decode phase, which changes
    # one cell at a time, cannot leave that state once two cells are on bulk.
    # The SIMT kernel wastes nothing on token padding and can give one CTA a
    # single column: it stays in the race at small M and for tiny N. (4
    # columns per group won 2 of 52 cells by under 2%: dropped.)
    # Each with one of three starts: L2 prefetch, nothing, or the first trip's
    # weight loads issued before the PDL wait (`early`).
    # At M=1, also 4 loads per thread in flight (twice the bytes per CTA of the default 2),
    # and CTAs of 128 and 512 threads: inside the decode step the CTA shape moved the TP8
    # step by up to 19 us at equal isolated speed (perf.md v7 sweep); 128 and 512 threads
    # took 10 of the 13 M=1 cells and 14 us off the TP4 step; 64 and 1024 took none (perf.md v8).
    simt = []
    unrolls = (2 if k >= 1024 else 1,) + ((4,) if m == 1 and k >= 2048 else ())
    for threads in (128, 256, 512) if m == 1 else (256,):
        for k_threads in (16, 32, 64, 128, 256):
            for cols in (1, 2):
                for unroll in unrolls:
                    for prefetch, early in ((True, False), (False, False), (False, True)):
                        cfg = KernelConfig(m=m, kind="simt", threads=threads, k_threads=k_threads, cols=cols,
                                           unroll=unroll, prefetch=prefetch, early=early)
                        if k_threads <= threads and _valid(cfg, n, k):
                            simt.append(cfg)
    # Too few CTAs leave most of the 132 SMs idle: keep configs within 4x of the
    # most CTAs any candidate reaches (all of them for tiny N such as 160).
    if simt:
        most = max(n // c.cols_per_cta for c in simt)
        found += [c for c in simt if n // c.cols_per_cta * 4 >= min(most, 528)]
    return found


def _valid(cfg: KernelConfig, n: int, k: int) -> bool:
    """Whether ``cfg`` passes the config check for this shape."""
    try:
        cfg.check(n=n, k=k)
    except ConfigError:
        return False
    return True


def prepare(arch: str, shapes_file: Path, out: Path, jobs: int | None = None, ms: list[int] | None = None,
            twins: bool = True) -> str:
    """Write ``out/cells.json`` and compile every candidate into ``out/<arch>/``; return a summary line.

    ``ms`` keeps only the cells of those token counts (the decode phase ranks each M on its own); a
    vLLM CUDA-graph size the kernels can run (`WIDE_MS`) may be asked for beyond the seed set's own.
    """
    from . import plans
    from .build import build_configs, main_summary

    seed = plans.seed_shapes(arch, shapes_file)
    seed_ms = {c[2] for c in seed}
    wide = sorted(set(ms or ()) & set(WIDE_MS) - seed_ms)
    too_wide = sorted(m for m in set(ms or ()) - seed_ms if m in VLLM_GRAPH_MS and m > MAX_M)
    if too_wide:
        raise ValueError(f"M={too_wide} is beyond the kernels' MAX_M={MAX_M} (kernels/config.py): such steps stay on cuBLAS")
    unknown = sorted(set(ms or ()) - seed_ms - set(wide))
    if unknown:
        raise ValueError(f"M={unknown} is not in the {arch} seed set's token counts {sorted(seed_ms)}"
                         f" nor a vLLM graph size the kernels run {list(WIDE_MS)}")
    cells = [c for c in seed if not ms or c[2] in ms]
    cells += sorted({(n, k, m) for n, k, _ in seed for m in wide})
    # The decode phase runs in the model file's served step (aot/decode_phase.py), where PDL is a
    # per-entry choice: every candidate then also has its no-PDL twin.
    decode = served_steps(arch, shapes_file, sorted({c[2] for c in cells}))
    rows, configs = [], set()
    for n, k, m in cells:
        cands = candidates(n, k, m)
        if decode and twins:
            cands = cands + no_pdl_twins(cands, n, k)
        rows.append({"n": n, "k": k, "m": m, "candidates": [c.to_json() for c in cands]})
        configs.update(cands)
    out.mkdir(parents=True, exist_ok=True)
    (out / CELLS_FILE).write_text(dumps({"arch": arch, "cells": rows, "decode": decode}))
    result = build_configs(arch, configs, [], out / arch, out / CELLS_FILE, jobs=jobs)
    note = "" if decode else f"; no decode phase ({Path(shapes_file).name} has no served step for the {arch} set)"
    return f"{len(rows)} cells, {sum(len(r['candidates']) for r in rows)} timings; " + main_summary(result) + note


def measure(
    cand_dir: Path,
    results: Path,
    trials: int = 5,
    progress: bool = True,
    decode_top: int = DECODE_TOP,
    decode_passes: int = DECODE_PASSES,
    read_cap_mb: int | None = None,
) -> dict:
    """On the GPU: check and time every candidate of every cell against cuBLAS; write and return the results."""
    import torch
    from tqdm import tqdm

    from ..runtime import loader
    from . import measure as ms

    spec = json.loads((cand_dir / CELLS_FILE).read_text())
    arch = spec["arch"]
    device = torch.device("cuda", torch.cuda.current_device())
    lib = loader.load_dir(cand_dir / arch, device)
    gpu = torch.cuda.get_device_name(device)
    by_shape: dict = {}
    for row in spec["cells"]:
        by_shape.setdefault((row["n"], row["k"]), []).append(row)
    out_rows = []
    bar = tqdm(total=sum(len(r["candidates"]) for r in spec["cells"]), desc="measure", unit="cand", disable=not progress)
    for (n, k), rows in sorted(by_shape.items()):
        inputs = ms.make_inputs(n, k, [r["m"] for r in rows], device)
        for row in rows:
            m = row["m"]
            x = inputs.tokens[m]
            graphs = {"cublas": ms.capture([_mm(x, w, o) for w, o in zip(inputs.weights, inputs.outs[m])])}
            per_graph = {"cublas": len(inputs.weights)}
            cands = {}
            for cfg_json in row["candidates"]:
                cfg = KernelConfig.from_json(cfg_json)
                bad = _check(lib, cfg, n, k, m, device, ms)
                cands[cfg.name] = {"config": cfg_json, "bad_elements": bad}
                if bad == 0:
                    graphs[cfg.name] = ms.capture(
                        [_launch(lib, cfg.name, x, w, o, n, k) for w, o in zip(inputs.weights, inputs.outs[m])]
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
    if in_step:
        decode_phase(lib, out_rows, spec["decode"], device, decode_top, trials, progress, decode_passes,
                     None if read_cap_mb is None else read_cap_mb << 20)
    data = {
        "arch": arch,
        "gpu": gpu,
        "date": datetime.date.today().isoformat(),
        "method": "cold L2: CUDA graph over >= 1 GiB of weight copies, interleaved with cuBLAS (torch.mm), "
        f"median of {trials} trials",
        "cells": out_rows,
    }
    if in_step:
        data["decode_method"] = (
            f"per cell, its {decode_top} fastest isolated winners (>= {MIN_SPEEDUP}x) and their no-PDL twins "
            "(only the twins where no GEMM precedes the cell in the step) timed inside one CUDA graph of the "
            "whole served decode step per TP (the model file's step: projections with the ops between them; "
            "other cells on their current choice), interleaved, median of "
            f"{trials} trials; the lowest sum over the TPs whose step contains the shape is chosen; "
            f"{decode_passes} pass(es) over the cells, the last decides; then each kernel family holding two or "
            "more cells is swapped out whole for their best other candidates, kept if the steps get 1% faster"
            + (f"; the step's read stand-ins capped at {read_cap_mb} MB each" if read_cap_mb is not None else "")
        )
    results.write_text(dumps(data))
    return data


def isolated_winners(row: dict, min_speedup: float = MIN_SPEEDUP) -> list[str]:
    """A cell's correct candidates that beat cuBLAS by ``min_speedup`` in its own chain, fastest first."""
    timed = [(c["us"], name) for name, c in row["candidates"].items() if c["bad_elements"] == 0 and c["us"]]
    return [name for us, name in sorted(timed) if row["cublas_us"] / us >= min_speedup]


def _mm(x, w, out):
    import torch

    return lambda: torch.mm(x, w.T, out=out)


def _launch(lib, variant: str, x, w, out, n: int, k: int):
    return lambda: lib.launch(variant, x, w, out, None, n, k)


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


def merge_results(paths: list[Path]) -> list[tuple[dict, dict]]:
    """(results file, cell row) per cell over several results files of one arch; a later file's cell replaces an earlier one's.

    Each file is one `tune measure` run: its cells were timed against cuBLAS in that run,
    and its decode phase ranked each M inside the whole step, so whole token counts can be
    re-tuned alone (`tune prepare --m`) and merged.
    """
    cells: dict = {}
    arch = None
    for path in paths:
        data = json.loads(Path(path).read_text())
        if arch not in (None, data["arch"]):
            raise ValueError(f"{path}: results for {data['arch']}, the others are for {arch}")
        arch = data["arch"]
        for row in data["cells"]:
            cells[(row["n"], row["k"], row["m"])] = (data, row)
    return [cells[key] for key in sorted(cells)]


def write_plan(results, min_speedup: float = MIN_SPEEDUP, out: Path | None = None) -> tuple[Path, int, int]:
    """Turn measured results (one file or a list, merged) into kernels/plans/<arch>.json (or ``out``).

    Returns (path, cells planned, cells left on cuBLAS).
    """
    from . import plans
    from .plans import PlanEntry

    merged = merge_results(results if isinstance(results, (list, tuple)) else [results])
    if not merged:
        raise ValueError(f"no measured cells in {results}: nothing to write")
    arch = merged[0][0]["arch"]
    entries, skipped = [], 0
    for data, row in merged:
        winners = isolated_winners(row, min_speedup)
        if not winners:
            skipped += 1
            continue
        chosen = row.get("decode", {}).get("chosen")
        name = chosen if chosen in winners else winners[0]
        best = row["candidates"][name]
        us = best["us"]
        speedup = row["cublas_us"] / us
        cfg = KernelConfig.from_json(best["config"])
        prov = {
            "kind": "measured",
            "gpu": data["gpu"],
            "date": data["date"],
            "cublas_us": round(row["cublas_us"], 3),
            "plan_us": round(us, 3),
            "speedup": round(speedup, 3),
            "method": data["method"],
        }
        if name == chosen:
            prov["chosen_in"] = "decode step"
        entries.append(PlanEntry(row["n"], row["k"], row["m"], cfg, prov))
    runs = sorted({(d["gpu"], d["date"]) for d, _ in merged})
    header = {
        "arch": arch,
        "capability": list(plans.CAPABILITY_FOR_ARCH[arch]),
        "dtype": "bfloat16",
        "source": f"skinny-gemm tune on {', '.join(f'{g}, {day}' for g, day in runs)}; "
        f"cells under {min_speedup}x stay on cuBLAS",
    }
    path = Path(out) if out else plans.plan_path(arch)
    path.write_text(plans.render(header, entries))
    return path, len(entries), skipped


def add_arguments(p) -> None:
    """Register `tune`'s sub-verbs."""
    sub = p.add_subparsers(dest="phase", metavar="PHASE")
    sub.required = True
    pr = sub.add_parser("prepare", help="generate and compile candidates (CPU, needs nvidia-cutlass-dsl)")
    pr.add_argument("--arch", default="sm_90a")
    pr.add_argument("--shapes", required=True, type=Path,
                    help="the model file (kernels/models/glm-5.3-flash.json): its seed set gives the cells, its "
                    "served step (the 'step' key) the decode phase; a file without a step skips that phase")
    pr.add_argument("--out", required=True, type=Path, help="candidate directory to create")
    pr.add_argument("--jobs", type=int)
    pr.add_argument("--m", type=int, nargs="+", metavar="M",
                    help="only the cells of these token counts (default: every M of the seed set)")
    pr.add_argument("--no-pdl-twins", dest="twins", action="store_false",
                    help="do not add each candidate's no-PDL twin (added by default where the model file has a "
                    "served step: PDL is then a per-entry choice of the decode phase)")
    me = sub.add_parser("measure", help="check and time candidates vs cuBLAS (GPU, from the installed wheel)")
    me.add_argument("dir", type=Path, help="a directory made by `tune prepare`")
    me.add_argument("--results", required=True, type=Path, help="results JSON to write")
    me.add_argument("--trials", type=int, default=5, help="timed replays per graph; the median is kept (default 5)")
    me.add_argument("--decode-top", type=int, default=DECODE_TOP, metavar="N",
                    help=f"re-time each cell's N fastest winners inside the whole decode step (default {DECODE_TOP}; "
                    "0 skips that phase)")
    me.add_argument("--decode-passes", type=_at_least_one, default=DECODE_PASSES, metavar="N",
                    help=f"passes of that phase over the cells; each pass re-times every cell with the others on "
                    f"their latest choice, the last pass decides (default {DECODE_PASSES})")
    me.add_argument("--decode-read-cap", type=_at_least_one, metavar="MB",
                    help="cap each read stand-in of the served step (attention, KDA, MoE, FP8 weights) at MB "
                    "megabytes: the ops stay between the GEMMs, their time and noise shrink (default: the step's bytes)")
    wr = sub.add_parser("write", help="write kernels/plans/<arch>.json from measured results")
    wr.add_argument("results", type=Path, nargs="+",
                    help="results of `tune measure`; with several, a later file's cells replace an earlier one's")
    wr.add_argument("--min-speedup", type=float, default=MIN_SPEEDUP)
    p.set_defaults(func=main)


def _at_least_one(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def main(args) -> int:
    """Run one tuning phase; a bad request (unknown M, results of two archs, no cells) is one line on stderr, exit 2."""
    try:
        if args.phase == "prepare":
            print(prepare(args.arch, args.shapes, args.out, args.jobs, args.m, args.twins))
        elif args.phase == "measure":
            data = measure(args.dir, args.results, args.trials, decode_top=args.decode_top,
                           decode_passes=args.decode_passes, read_cap_mb=args.decode_read_cap)
            print(f"measured {len(data['cells'])} cells on {data['gpu']} -> {args.results}")
        else:
            path, planned, skipped = write_plan(args.results, args.min_speedup)
            print(f"wrote {path}: {planned} cells planned, {skipped} left on cuBLAS")
    except ValueError as exc:
        print(f"skinny-gemm tune {args.phase}: error: {exc}", file=sys.stderr)
        return 2
    return 0
