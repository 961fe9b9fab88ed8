"""Tune plan tables: prepare candidates on the CPU machine, measure them on the GPU, write the plan table.

  skinny-gemm tune prepare --arch sm_90a --shapes kernels/models/glm-5.3-flash.json --out DIR   (CPU, compiles)
  skinny-gemm tune measure DIR --results results.json                             (GPU, no compiler)
  skinny-gemm tune write results.json                                             (CPU, writes kernels/plans/<arch>.json)

`prepare` generates candidate configs per (n, k, m) cell (or takes them from plan tables,
`--from-plans`) and compiles them with the normal build (one manifest, no plans); where the
model file (seed set) or the one catalogue model has a served step (its "step" key), every
candidate also gets its no-PDL twin, and the served step of each TP at each M goes into
cells.json (`--no-decode`: none). `measure` checks every candidate against a float64
reference and times it against cuBLAS with the cold-L2 graph method (aot/measure.py), each
cell in a chain of its own shape; then it re-ranks each cell's fastest winners inside the
served step (aot/decode_phase.py: one CUDA graph of the whole step per TP, the ops between
the projections included, the other cells on their current choice, passes in order of each
shape's share of the step, then each kernel family swapped out whole; PDL on and off compete
in every entry), and keeps an M's step choices only if a repeated whole-step comparison
against every cell on its alone-fastest candidate confirms them. `write` keeps, per cell, the
decode-step choice or else the fastest correct candidate, if it beats cuBLAS by at least 5%,
with measured provenance. Cells that do not win stay on cuBLAS.

Why the second phase: a same-shape chain flatters kernels that load weight
before the PDL wait. Short kernels then cascade (each launches the next at
its start, so many are resident at once, all streaming), which cannot
happen between the long GEMMs of a real step: plans picked alone summed to
1032 us per TP4 step yet ran it in 1101 us; picking in the step brought
that to 1017 us (H200, GLM-5.3-Flash).
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from pathlib import Path

from ..kernels.config import MAX_M, ConfigError, KernelConfig
from ..runtime.files import plain_name
from ..runtime.jsonfile import Fields, InputError, printable, read_json
from ..runtime.manifest import CAPABILITY_FOR_ARCH, config_of, dumps
from . import candidates as _candidates
from .candidates import cell_rows, max_candidates, plan_configs, plan_rows, resident_ctas, spaces
from .decode_phase import (
    CONFIRM_MARGIN,
    CONFIRM_TRIALS,
    DECODE_PASSES,
    DECODE_TOP,
    confirm_replays,
    decode_phase,
    model_steps,
    no_pdl_twins,
    served_steps,
)

MIN_SPEEDUP = 1.05
CELLS_FILE = "cells.json"
# vLLM's decode CUDA-graph sizes up to 16 (a batch is padded up to one of them); the ones
# the kernels can run (config.py's MAX_M) may be tuned beyond a seed set's own token counts.
VLLM_GRAPH_MS = (1, 2, 4, 8, 16)
WIDE_MS = tuple(m for m in VLLM_GRAPH_MS if m <= MAX_M)


# Candidate generation lives in aot/candidates.py (the spaces are data: kernels/candidates.json);
# these names stay importable from here for the tuner's callers and tests.
MAX_CANDIDATES = max_candidates()
H200_SMS = spaces()["sms"]
SLICE_MAX_TRIPS = dict(next(s for s in spaces()["spaces"] if s["name"] == "slice")["rules"])["max_k_trips"]
_resident_ctas = resident_ctas
candidates = _candidates.candidates
slice_candidates = _candidates.slice_candidates
persist_candidates = _candidates.persist_candidates


# The H200's measuring rate in `tune measure`, for prepare's estimate: 2902-3307 timings took about 2 minutes per run.
TIMINGS_PER_S = 27


def _seed_cells(arch: str, shapes_file: Path, ms: list[int] | None) -> tuple[list, list]:
    """A seed set's (n, k, m) cells (``ms`` keeps only those token counts) and its decode steps."""
    from . import plans

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
    # The decode phase runs in the model file's served step (aot/decode_phase.py).
    decode = served_steps(arch, shapes_file, sorted({c[2] for c in cells}))
    return cells, decode


def _with_twins(cands: list, n: int, k: int) -> list:
    """The candidates and their no-PDL twins (PDL is a per-entry choice of the served-step decode phase)."""
    return cands + no_pdl_twins(cands, n, k)


def _catalogue_cells(model: str | None, tps: list[int] | None, every: bool, ms: list[int] | None) -> list:
    """Catalogue models' BF16 (n, k, m, bias) cells at ``ms`` (default M 1, 2, 4, 8, 16)."""
    from . import plans

    found = plans.catalogue_cells(plans.model_tps(model, tps, every), ms or plans.CATALOGUE_MS)
    return [(c.n, c.k, c.m, c.bias) for c in found]


def _catalogue_steps(arch: str, model: str | None, tps: list[int] | None, every: bool, cells: list) -> tuple[list, str]:
    """The decode entries of one catalogue model's served step (every asked TP it states), and a note on what has none."""
    from . import plans

    if every:
        return [], "no decode phase (--all: tune one --model at a time in its served step)"
    asked = sorted({tp for _, tp in plans.model_tps(model, tps, every)})
    return model_steps(arch, model, asked, sorted({c[2] for c in cells}))


def prepare(arch: str, shapes_file: Path | None, out: Path, jobs: int | None = None, ms: list[int] | None = None,
            model: str | None = None, tps: list[int] | None = None, every: bool = False, top: int | None = None,
            per_family: int = 2, twins: bool = True, from_plans: list[Path] | None = None,
            decode: bool = True) -> str:
    """Write ``out/cells.json`` and compile every candidate into ``out/<arch>/``; return a summary.

    The cells are an arch's seed set (``shapes_file``: a model file; a vLLM CUDA-graph size the kernels
    run, `WIDE_MS`, may be asked for beyond the seed set's own token counts) or catalogue models' BF16
    (n, k, m, bias) cells (``model``/``tps`` or ``every``; M 1, 2, 4, 8, 16 by default). ``ms`` keeps only
    the cells of those token counts (the decode phase ranks each M on its own); ``top`` cuts each cell's
    candidates with the cost model. The decode phase runs in the served step of the model file (seed
    set) or of the one catalogue model (every asked TP its step states); there each candidate kept
    also gets its no-PDL twin (``twins``). ``from_plans``: each cell's candidates are exactly the
    distinct configs those plan tables hold for it (no cut, no twins; a cell none holds is skipped).
    ``decode=False`` writes no decode steps: `tune measure` then times the cells alone.
    """
    from .build import build_configs, main_summary

    if from_plans and top:
        raise ValueError("--from-plans times the plans' configs as they are: --top does not apply")
    notes = []
    if model or every:
        cells = _catalogue_cells(model, tps, every, ms)
        steps, note = _catalogue_steps(arch, model, tps, every, cells) if decode else ([], "")
        notes.append(note)
    elif shapes_file:
        cells, steps = _seed_cells(arch, shapes_file, ms)
        if decode and not steps:
            notes.append(f"no decode phase ({Path(shapes_file).name} has no served step for the {arch} set)")
    else:
        raise ValueError("prepare needs --shapes FILE, --model SLUG or --all")
    if not decode:
        steps = []
        notes.append("no decode phase (--no-decode): the cells are timed alone")
    if from_plans:
        rows, skipped = plan_rows(cells, plan_configs(from_plans, arch))
    else:
        rows, skipped = cell_rows(cells, top, per_family, extend=_with_twins if steps and twins else None)
    configs = {KernelConfig.from_json(c) for r in rows for c in r["candidates"]}
    out.mkdir(parents=True, exist_ok=True)
    (out / CELLS_FILE).write_text(dumps({"arch": arch, "cells": rows, "decode": steps}))
    result = build_configs(arch, configs, [], out / arch, out / CELLS_FILE, jobs=jobs)
    timings = sum(len(r["candidates"]) + 1 for r in rows)  # + cuBLAS per cell
    lines = [f"{len(rows)} cells, {timings} timings with cuBLAS (about {timings / TIMINGS_PER_S / 60:.1f} min of "
             f"H200 time before any decode phase); " + main_summary(result) + "".join(f"; {n}" for n in notes if n)]
    lines += [f"  no candidates ({n}, {k}) m={m}: {why}" for (n, k, m), why in sorted(skipped.items())]
    return "\n".join(lines)


def measure(
    cand_dir: Path,
    results: Path,
    trials: int = 5,
    progress: bool = True,
    decode_top: int = DECODE_TOP,
    decode_passes: int = DECODE_PASSES,
    read_cap_mb: int | None = None,
    confirm_trials: int | None = None,
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
    confirms = confirm_replays(trials, confirm_trials)
    if in_step:
        decode_phase(lib, out_rows, spec["decode"], device, decode_top, trials, progress, decode_passes,
                     None if read_cap_mb is None else read_cap_mb << 20, confirms)
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
            "(PDL on and off compete in every cell) timed inside one CUDA graph of the "
            "whole served decode step per TP (the model file's step: projections with the ops between them; "
            "other cells on their current choice), interleaved, median of "
            f"{trials} trials; the lowest sum over the TPs whose step contains the shape is chosen; "
            f"{decode_passes} pass(es) over the cells, the last decides; then each kernel family holding two or "
            "more cells is swapped out whole for their best other candidates, kept if the steps get 1% faster"
            + (f"; then per M the whole steps with these choices against every cell on its alone-fastest "
               f"candidate, interleaved, median of {confirms} trials: the choices are kept only if their sum over "
               f"the TPs is {CONFIRM_MARGIN:.1%} lower, else that M goes back to the alone-fastest"
               if confirms else "; no confirm step")
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


def merge_results(paths: list) -> list[tuple[dict, dict]]:
    """(results file, cell row) per cell over several results files of one arch; a later file's cell replaces an earlier one's.

    An item may be ``(path, ms)``: only that run's cells of those token counts are used (runs.json's
    ``ms``: a run whose other cells lost in their model's served step).

    Each file is one `tune measure` run: its cells were timed against cuBLAS in that run,
    and its decode phase ranked each M inside the whole step, so whole token counts can be
    re-tuned alone (`tune prepare --m`) and merged.
    """
    cells: dict = {}
    arch = None
    for item in paths:
        path, ms = item if isinstance(item, tuple) else (item, None)
        data = read_results(path)
        if arch not in (None, data["arch"]):
            raise ValueError(f"{path}: results for {data['arch']}, the others are for {arch}")
        arch = data["arch"]
        for row in data["cells"]:
            if ms is None or row["m"] in ms:
                cells[(row["n"], row["k"], row["m"])] = (data, row)
    return [cells[key] for key in sorted(cells)]


def read_results(path) -> dict:
    """A `tune measure` results file through the one bounded reader, every field `write_plan` uses typed and
    ranged; ValueError (one line naming the file and the field) otherwise."""
    try:
        data = read_json(path, "tuner results")
    except InputError as exc:
        raise ValueError(str(exc)) from None
    f = Fields(path, ValueError)
    f.obj(data, "the results file")
    if f.get(data, "arch") not in CAPABILITY_FOR_ARCH:
        f.fail("field 'arch'", data["arch"], f"one of {sorted(CAPABILITY_FOR_ARCH)}")
    for key in ("gpu", "date", "method"):
        f.text(f.get(data, key), f"field {key!r}")
    for i, row in enumerate(f.lst(f.get(data, "cells"), "field 'cells'")):
        place = f"cells[{i}]"
        f.obj(row, place)
        n, k, _ = (f.pos_int(f.get(row, x, f"{place} "), f"{place} field {x!r}") for x in ("n", "k", "m"))
        if type(f.get(row, "cublas_us", f"{place} ")) not in (int, float) or not row["cublas_us"] > 0:
            f.fail(f"{place} field 'cublas_us'", row["cublas_us"], "a positive number")
        for name, c in f.obj(f.get(row, "candidates", f"{place} "), f"{place} field 'candidates'").items():
            where = f"{place} candidate {ascii(name)}"
            f.obj(c, where)
            us = f.get(c, "us", f"{where} ")
            if us is not None and (type(us) not in (int, float) or us < 0):
                f.fail(f"{where} field 'us'", us, "a number >= 0 or null")
            bad = f.get(c, "bad_elements", f"{where} ")
            if type(bad) is not int or bad < 0:
                f.fail(f"{where} field 'bad_elements'", bad, "an int >= 0")
            try:
                config_of(f.obj(f.get(c, "config", f"{where} "), f"{where} field 'config'"), n=n, k=k)
            except ConfigError as exc:
                raise ValueError(f"{f.name}: {where}: {exc}") from None
        decode = f.obj(row.get("decode", {}), f"{place} field 'decode'")
        if "chosen" in decode and type(decode["chosen"]) is not str:
            f.fail(f"{place} decode field 'chosen'", decode["chosen"], "a candidate name")
        confirm = f.obj(decode.get("confirm", {}), f"{place} decode field 'confirm'")
        if "kept" in confirm:
            f.boolean(confirm["kept"], f"{place} decode.confirm field 'kept'")
    return data


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
        decode = row.get("decode", {})
        chosen = decode.get("chosen")
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
        if name == chosen and decode.get("confirm", {}).get("kept", True):
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
    path = plans.plan_target(arch, out)
    if not entries:
        # Written, it would replace a table with one that plans nothing: every shape would fall back.
        raise ValueError(f"no cell of {len(merged)} beats cuBLAS by {min_speedup}x: refusing to write an empty "
                         f"plan table to {path}")
    path.write_text(plans.render(header, entries))
    return path, len(entries), skipped


def add_arguments(p) -> None:
    """Register `tune`'s sub-verbs."""
    sub = p.add_subparsers(dest="phase", metavar="PHASE")
    sub.required = True
    pr = sub.add_parser("prepare", help="generate and compile candidates (CPU, needs nvidia-cutlass-dsl)")
    pr.add_argument("--arch", default="sm_90a")
    pr.add_argument("--shapes", type=Path,
                    help="the model file (kernels/models/glm-5.3-flash.json): its seed set gives the cells, its "
                    "served step (the 'step' key) the decode phase; a file without a step skips that phase")
    pr.add_argument("--no-pdl-twins", dest="twins", action="store_false",
                    help="do not add each candidate's no-PDL twin (added by default where the model file has a "
                    "served step: PDL is then a per-entry choice of the decode phase)")
    pr.add_argument("--from-plans", type=Path, nargs="+", metavar="PLAN",
                    help="each cell's candidates are exactly the distinct configs these plan tables "
                    "(kernels/plans/*.json format) hold for its (n, k, m): no cost-model cut, no twins; a cell "
                    "none holds is skipped")
    pr.add_argument("--no-decode", dest="decode", action="store_false",
                    help="write no decode steps: `tune measure` only times (and checks) each cell alone")
    pr.add_argument("--model", help="instead: a catalogue slug (kernels/models/<slug>.json), its BF16 cells; "
                    "its served step (if it has one) at every asked TP the step states gives the decode phase")
    pr.add_argument("--all", action="store_true", help="instead: every catalogue model at every TP it lists")
    pr.add_argument("--tp", type=int, nargs="+", help="with --model/--all: only these TP sizes")
    pr.add_argument("--top", type=int, metavar="N",
                    help="time only each cell's N best candidates by the cost model (plus the best of each family)")
    pr.add_argument("--per-family", type=int, default=2, metavar="F",
                    help="with --top: also each kernel family's F best predicted (default 2)")
    pr.add_argument("--out", required=True, type=Path, help="candidate directory to create")
    pr.add_argument("--jobs", type=int)
    pr.add_argument("--m", type=int, nargs="+", metavar="M",
                    help="only the cells of these token counts (default: every M of the seed set; catalogue: 1 2 4 8 16)")
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
    me.add_argument("--confirm-trials", type=_at_least_zero, metavar="N",
                    help=f"replays per graph of the confirm step, which keeps an M's decode choices only if the "
                    f"whole step beats every cell on its alone-fastest by {CONFIRM_MARGIN * 100:g}%% (default "
                    f"{CONFIRM_TRIALS} x --trials; 0 skips it and keeps the passes' choices)")
    mf = sub.add_parser("model-fit", help="refit the cost model on the committed H200 timings (CPU, numpy)")
    mf.add_argument("--out", type=Path, help="model JSON to write (default: the committed one next to the timings)")
    mc = sub.add_parser("model-check", help="how well the cost model predicts held-out timings (held out by shape)")
    mc.add_argument("--json", type=Path, help="also write the per-cell results here")
    mc.add_argument("--by", choices=("shape", "m"), default="shape",
                    help="hold out each (N, K) (default) or each token count M (how it extrapolates in M)")
    wr = sub.add_parser("write", help="write kernels/plans/<arch>.json from measured results")
    wr.add_argument("results", type=Path, nargs="*",
                    help="results of `tune measure`; with several, a later file's cells replace an earlier one's")
    wr.add_argument("--runs", type=Path, metavar="RUNS_JSON",
                    help="instead: the runs listed in a runs.json, in its order (the committed plan: "
                    "kernels/plans/tuning/sm_90a/runs.json)")
    wr.add_argument("--min-speedup", type=float, default=MIN_SPEEDUP)
    wr.add_argument("--out", type=Path, help="the plan table to write (required: never the installed package's; in a "
                    "source checkout kernels/plans/<arch>.json regenerates the committed one)")
    p.set_defaults(func=main)


def _write_inputs(results: list[Path], runs: Path | None) -> list[Path]:
    """`tune write`'s results files: those named, or a runs.json's list (files beside it, in its order; a run
    with ``ms`` contributes only its cells of those token counts)."""
    if runs is None:
        if not results:
            raise ValueError("write needs results files or --runs RUNS_JSON")
        return results
    if results:
        raise ValueError("write takes results files or --runs, not both")
    try:
        data = read_json(runs, "runs list")
    except InputError as exc:
        raise ValueError(str(exc)) from None
    f = Fields(runs, ValueError)
    found = []
    for i, run in enumerate(f.lst(f.get(f.obj(data, "the runs list"), "runs"), "field 'runs'")):
        f.obj(run, f"runs[{i}]")
        name = f.get(run, "file", f"runs[{i}] ")
        if not (plain_name(name) and printable(name)):
            f.fail(f"runs[{i}] field 'file'", name, "a plain file name beside the runs list")
        if "ms" in run:
            ms = {f.pos_int(m, f"runs[{i}] field 'ms'", MAX_M) for m in f.lst(run["ms"], f"runs[{i}] field 'ms'")}
            found.append((runs.parent / name, ms))
        else:
            found.append(runs.parent / name)
    return found


def _at_least_zero(text: str) -> int:
    """argparse type: an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not >= 0")
    return value


def _at_least_one(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def main(args) -> int:
    """Run one tuning phase; a bad request (unknown M, results of two archs, no cells) is one line on stderr, exit 2."""
    from .build import BuildError

    try:
        if args.phase == "prepare":
            print(prepare(args.arch, args.shapes, args.out, args.jobs, args.m, args.model, args.tp, args.all,
                          args.top, args.per_family, args.twins, args.from_plans, args.decode))
        elif args.phase in ("model-fit", "model-check"):
            from . import costmodel

            if args.phase == "model-fit":
                print(costmodel.main(args.phase, args.out))
            else:
                print(costmodel.main(args.phase, args.json, args.by))
        elif args.phase == "measure":
            data = measure(args.dir, args.results, args.trials, decode_top=args.decode_top,
                           decode_passes=args.decode_passes, read_cap_mb=args.decode_read_cap,
                           confirm_trials=args.confirm_trials)
            print(f"measured {len(data['cells'])} cells on {data['gpu']} -> {args.results}")
        else:
            path, planned, skipped = write_plan(_write_inputs(args.results, args.runs), args.min_speedup, args.out)
            print(f"wrote {path}: {planned} cells planned, {skipped} left on cuBLAS")
    except (ValueError, OSError, BuildError) as exc:
        print(f"skinny-gemm tune {args.phase}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # prepare's compile workers import the kernels, which import cutlass
        if not (exc.name or "").startswith("cutlass"):
            raise
        print(f"skinny-gemm tune {args.phase}: error: needs nvidia-cutlass-dsl (pip install nvidia-cutlass-dsl==4.8.1)",
              file=sys.stderr)
        return 2
    return 0
