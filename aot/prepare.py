"""`tune prepare`: the cells to tune, each cell's candidates, and one build of them all (CPU, compiles).

The cells are a model file's seed set or catalogue models' BF16 cells; a cell's candidates come
from the spaces (aot/candidates.py), cut by the cost model (aot/costmodel.py) with ``top``, or are
exactly the configs given plan tables hold (and the fastest ones given results files timed). Where the
model has a served step, its decode steps go into cells.json for the decode phase (aot/decode_phase.py)
and each candidate gets its no-PDL twin.
"""

from __future__ import annotations

from pathlib import Path

from ..kernels.config import VLLM_GRAPH_MS, ConfigError, KernelConfig
from ..runtime.manifest import dumps
from . import candidates, costmodel, plans
from .decode_phase import model_steps, no_pdl_twins, served_steps
from .results import isolated_winners, read_results

CELLS_FILE = "cells.json"
# --from-results: each cell's this many fastest exact candidates, unless --best says otherwise
FROM_RESULTS_BEST = 6
# vLLM's decode CUDA-graph sizes (a batch is padded up to one of them; config.py's VLLM_GRAPH_MS, all within
# the kernels' MAX_M) may be tuned beyond a seed set's own token counts.
WIDE_MS = VLLM_GRAPH_MS
# The H200's measuring rate in `tune measure`, for prepare's estimate: 2902-3307 timings took about 2 minutes per run.
TIMINGS_PER_S = 27


def _seed_cells(arch: str, shapes_file: Path, ms: list[int] | None) -> tuple[list, list]:
    """A seed set's (n, k, m) cells (``ms`` keeps only those token counts) and its decode steps."""
    seed = plans.seed_shapes(arch, shapes_file)
    seed_ms = {c[2] for c in seed}
    wide = sorted(set(ms or ()) & set(WIDE_MS) - seed_ms)
    unknown = sorted(set(ms or ()) - seed_ms - set(wide))
    if unknown:
        raise ValueError(
            f"M={unknown} is not in the {arch} seed set's token counts {sorted(seed_ms)}"
            f" nor a vLLM graph size the kernels run {list(WIDE_MS)}"
        )
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
    found = plans.catalogue_cells(plans.model_tps(model, tps, every), ms or plans.CATALOGUE_MS)
    return [(c.n, c.k, c.m, c.bias) for c in found]


def _catalogue_steps(arch: str, model: str | None, tps: list[int] | None, every: bool, cells: list) -> tuple[list, str]:
    """The decode entries of one catalogue model's served step (every asked TP it states), and a note on what has none."""
    if every:
        return [], "no decode phase (--all: tune one --model at a time in its served step)"
    asked = sorted({tp for _, tp in plans.model_tps(model, tps, every)})
    return model_steps(arch, model, asked, sorted({c[2] for c in cells}))


def prepare(
    arch: str,
    shapes_file: Path | None,
    out: Path,
    jobs: int | None = None,
    ms: list[int] | None = None,
    model: str | None = None,
    tps: list[int] | None = None,
    every: bool = False,
    top: int | None = None,
    per_family: int = 2,
    twins: bool = True,
    from_plans: list[Path] | None = None,
    decode: bool = True,
    from_results: list[Path] | None = None,
    best: int | None = None,
) -> str:
    """Write ``out/cells.json`` and compile every candidate into ``out/<arch>/``; return a summary.

    The cells are an arch's seed set (``shapes_file``: a model file; a vLLM CUDA-graph size the kernels
    run, `WIDE_MS`, may be asked for beyond the seed set's own token counts) or catalogue models' BF16
    (n, k, m, bias) cells (``model``/``tps`` or ``every``; M 1, 2, 4, 8, 16 by default). ``ms`` keeps only
    the cells of those token counts (the decode phase ranks each M on its own); ``top`` cuts each cell's
    candidates with the cost model. The decode phase runs in the served step of the model file (seed
    set) or of the one catalogue model (every asked TP its step states); there each candidate kept
    also gets its no-PDL twin (``twins``). ``from_plans``: each cell's candidates are the distinct
    configs those plan tables hold for it (no cut; their twins as above; a cell none holds is skipped).
    ``from_results`` adds, per cell, the configs of the ``best`` (FROM_RESULTS_BEST) fastest exact candidates those `tune measure`
    results timed for it (the previous run's front beside a new sweep, so one run compares them).
    ``decode=False`` writes no decode steps: `tune measure` then times the cells alone.
    """
    from .build import build_configs, main_summary

    if (from_plans or from_results) and top:
        raise ValueError("--from-plans / --from-results time given configs as they are: --top does not apply")
    if best is not None and not from_results:
        raise ValueError("--best counts each cell's candidates taken from --from-results: give that too")
    best = FROM_RESULTS_BEST if best is None else best
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
    if from_plans or from_results:
        by_cell = result_configs(from_results or [], arch, best, plan_configs(from_plans or [], arch))
        rows, skipped = plan_rows(cells, by_cell, extend=_with_twins if steps and twins else None)
    else:
        rows, skipped = cell_rows(cells, top, per_family, extend=_with_twins if steps and twins else None, arch=arch)
    configs = {KernelConfig.from_json(c) for r in rows for c in r["candidates"]}
    out.mkdir(parents=True, exist_ok=True)
    (out / CELLS_FILE).write_text(dumps({"arch": arch, "cells": rows, "decode": steps}))
    result = build_configs(arch, configs, [], out / arch, out / CELLS_FILE, jobs=jobs)
    timings = sum(len(r["candidates"]) + 1 for r in rows)  # + cuBLAS per cell
    lines = [
        f"{len(rows)} cells, {timings} timings with cuBLAS (about {timings / TIMINGS_PER_S / 60:.1f} min of "
        f"H200 time before any decode phase); " + main_summary(result) + "".join(f"; {n}" for n in notes if n)
    ]
    lines += [f"  no candidates ({n}, {k}) m={m}: {why}" for (n, k, m), why in sorted(skipped.items())]
    return "\n".join(lines)


def cell_rows(
    cells, top: int | None = None, per_family: int = 2, extend=None, arch: str = "sm_90a"
) -> tuple[list[dict], dict]:
    """`tune prepare`'s rows: per (n, k, m[, bias]) cell its candidates, cut by the cost model with ``top``.

    With ``top`` a cell keeps its ``top`` best predicted candidates plus the ``per_family``
    best of each kernel family (aot/costmodel.py). A cell that needs a bias asks every
    candidate for one (the config field ``bias``); a cell no candidate serves asks for the
    tail path (field ``tail``) where the config has one. ``extend(cands, n, k)``, if given,
    returns the list to time after the cut (e.g. the candidates plus their no-PDL twins). Returns (rows, {(n, k, m): why} for cells
    left without a candidate).
    """
    model = costmodel.load() if top else None
    rows, skipped = [], {}
    for cell in cells:
        n, k, m = cell[:3]
        bias = len(cell) > 3 and cell[3]
        if bias and "bias" not in candidates.CONFIG_FIELDS:
            skipped[(n, k, m)] = "bias: no config in this tree has a bias epilogue"
            continue
        extra = {"bias": True} if bias else {}
        try:
            cands = candidates.candidates(n, k, m, extra or None, arch)
            if not cands and "tail" in candidates.CONFIG_FIELDS:
                # a K or N that no unrolled step divides: the kernels' tail path (config field `tail`) serves it
                cands = candidates.candidates(n, k, m, {**extra, "tail": True}, arch)
        except ConfigError as exc:
            skipped[(n, k, m)] = str(exc)
            continue
        if model and cands:
            cands = costmodel.select(model, cands, n, k, top, per_family)
        if extend and cands:
            cands = extend(cands, n, k)
        if not cands:
            skipped[(n, k, m)] = f"no candidate passes the config rules ({candidates.rejections(n, k, m)})"
            continue
        rows.append({"n": n, "k": k, "m": m, "candidates": [c.to_json() for c in cands]})
    return rows, skipped


def plan_configs(paths, arch: str) -> dict[tuple[int, int, int], list[KernelConfig]]:
    """(n, k, m) -> the distinct configs plan tables (kernels/plans/*.json format) hold for it, in the tables' order."""
    found: dict = {}
    for path in paths:
        header, entries = plans.load(path)
        if header["arch"] != arch:
            raise candidates.CandidateError(f"{path}: a plan table for {header['arch']}, not {arch}")
        for entry in entries:
            have = found.setdefault((entry.n, entry.k, entry.m), [])
            if entry.config not in have:
                have.append(entry.config)
    return found


def result_configs(paths, arch: str, best: int, found: dict) -> dict[tuple[int, int, int], list[KernelConfig]]:
    """``found`` ((n, k, m) -> configs, e.g. `plan_configs`'s) with, appended per cell where new, the configs of the
    ``best`` fastest exact candidates `tune measure` results timed for it, fastest first (each file in turn)."""
    for path in paths:
        data = read_results(path)
        if data["arch"] != arch:
            raise candidates.CandidateError(f"{path}: tuner results for {data['arch']}, not {arch}")
        for row in data["cells"]:
            have = found.setdefault((row["n"], row["k"], row["m"]), [])
            # every exact, timed candidate fastest first (no speedup floor: a front, not winners)
            for name in isolated_winners(row, min_speedup=0.0)[:best]:
                cfg = KernelConfig.from_json(row["candidates"][name]["config"])
                if cfg not in have:
                    have.append(cfg)
    return found


def plan_rows(cells, by_cell: dict, extend=None) -> tuple[list[dict], dict]:
    """`tune prepare --from-plans`'s rows: per (n, k, m[, bias]) cell the configs ``by_cell`` holds for it (no
    cost-model cut), then what ``extend(cands, n, k)`` adds (the no-PDL twins where there is a decode phase); returns
    (rows, {(n, k, m): why} for cells no table or results file holds)."""
    rows, skipped = [], {}
    for cell in cells:
        key = tuple(cell[:3])
        if key in by_cell:
            cands = extend(by_cell[key], key[0], key[1]) if extend else by_cell[key]
            rows.append({"n": key[0], "k": key[1], "m": key[2], "candidates": [c.to_json() for c in cands]})
        else:
            skipped[key] = "no plan table or results file given holds it"
    return rows, skipped
