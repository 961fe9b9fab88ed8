"""Tuner results: read and merge `tune measure` results files, and turn them into a plan table.

A results file holds, per (n, k, m) cell, every candidate's timing and correctness against cuBLAS
and, after the decode phase, the candidate chosen inside the served step. ``write_plan`` keeps per
cell that choice (where the confirm step kept it) or else the fastest correct candidate, if it beats cuBLAS by
``MIN_SPEEDUP``; a cell whose decode choice is cuBLAS (``CUBLAS``) gets no entry.
"""

from __future__ import annotations

from pathlib import Path

from ..kernels.config import MAX_M, ConfigError, KernelConfig
from ..runtime.files import plain_name
from ..runtime.jsonfile import Fields, InputError, printable, read_json
from ..runtime.manifest import CAPABILITY_FOR_ARCH, config_of
from . import plans

MIN_SPEEDUP = 1.05
# The decode phase's name for cuBLAS as a cell's candidate: a cell whose kernels all lose inside the served step
# stays on cuBLAS (no plan entry), while the other cells of its M keep theirs.
CUBLAS = "cublas"
# The confirm step: an M's decode choices must make the whole step (summed over TPs) this much faster than the
# fallback set. Fitted to the H200's spread (docs/experiments/confirm_noise.py, docs/results/confirm-noise.json):
# 30 pairs of timings of one choice set within a run (19 runs) differ by 0.083% rms, at most 0.22%; 3 x rms
# rounded up to 0.05%. The first guess, 0.5%, threw away choices 0.3-0.49% faster (4-6 x that spread).
CONFIRM_MARGIN = 0.0025


def confirmed(step_us: dict) -> bool:
    """The confirm step's rule on its timings ({"decode": {tp: us}, "alone": {tp: us}}): decode under (1 - margin) x alone."""
    return sum(step_us["decode"].values()) < (1 - CONFIRM_MARGIN) * sum(step_us["alone"].values())


def fallback_pick(row: dict, pick):
    """One cell's pick in the confirm step's fallback set: cuBLAS where the passes chose it (``pick``) or where the
    cell's alone-fastest candidate was no faster than cuBLAS in the cell's own step timing, else that candidate.

    The fallback exists to undo kernel-against-kernel picks within the noise, not to plan a kernel the step found
    slower than cuBLAS (on the H200, 2026-12-03: Mistral-Small-24B's 5120x4096 and 6144x5120 at M = 8, Llama-3.1-8B's
    down_proj ring at M = 16, 7666.3 against 7663.2 us)."""
    if pick in (CUBLAS, None):  # None: a cell with no candidate in the step, on cuBLAS all along
        return pick
    alone = (isolated_winners(row) or [None])[0]
    if alone is None:  # a near-tie the step admitted (decode_phase's min_speedup): no kernel to fall back to
        return CUBLAS
    timed = row.get("decode", {}).get("step_us", {})
    if alone in timed and CUBLAS in timed and sum(timed[CUBLAS].values()) <= sum(timed[alone].values()):
        return CUBLAS
    return alone


def step_choice(row: dict) -> tuple[str | None, bool]:
    """(a cell's decode-phase choice, whether the confirm step stands behind it) under today's CONFIRM_MARGIN.

    A results file records the confirm step's timings, its verdict under the margin of its day and, where that
    verdict reverted the passes' choices, ``passes_chosen``. The verdict is taken again from the timings, so a
    margin fitted since applies to every committed run: kept now, the passes' choice; reverted now, the fallback.
    """
    decode = row.get("decode", {})
    chosen = decode.get("chosen")
    confirm = decode.get("confirm", {})
    if not confirm.get("step_us"):  # no confirm step, or the choices were the fallback set already
        return chosen, confirm.get("kept", True)
    kept = confirmed(confirm["step_us"])
    if kept == confirm["kept"]:
        return chosen, kept
    return (decode["passes_chosen"], True) if kept else (fallback_pick(row, chosen), False)


def isolated_winners(row: dict, min_speedup: float = MIN_SPEEDUP) -> list[str]:
    """A cell's correct candidates that beat cuBLAS by ``min_speedup`` in its own chain, fastest first."""
    timed = [(c["us"], name) for name, c in row["candidates"].items() if c["bad_elements"] == 0 and c["us"]]
    return [name for us, name in sorted(timed) if row["cublas_us"] / us >= min_speedup]


def candidate_config(row: dict, name: str) -> KernelConfig | None:
    """The config of candidate ``name`` of a results row, or None where the row has no whole config (synthetic)."""
    try:
        return KernelConfig.from_json(row["candidates"][name].get("config") or {})
    except ConfigError:  # a synthetic result row without a whole config
        return None


def twin_of_a_winner(row: dict, name: str, min_speedup: float) -> bool:
    """Whether candidate ``name`` is exact, timed, without PDL, and the no-PDL twin of a PDL winner at ``min_speedup``.

    The decode phase times such a twin whatever its own alone speedup, and a confirmed choice of it is planned: the
    alone chain repeats one kernel, so a PDL launch starts under the one before it, which no vLLM op before a
    projection allows (docs/perf.md, "PDL: alone against in the step": PDL took a median 1.06 us a call off the alone
    time and added 0.29 us in the step behind vLLM's ops, over the committed runs' 494 twin pairs there)."""
    cand = row["candidates"].get(name)
    cfg = candidate_config(row, name) if cand and cand["bad_elements"] == 0 and cand["us"] else None
    if cfg is None or cfg.pdl:
        return False
    return any(
        (w := candidate_config(row, winner)) is not None and w.pdl and w.without_pdl() == cfg
        for winner in isolated_winners(row, min_speedup)
    )


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
    floor = data.get("decode_min_speedup", MIN_SPEEDUP)
    if type(floor) not in (int, float) or not 0 < floor < float("inf"):
        f.fail("field 'decode_min_speedup'", floor, "a positive number")
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
        _check_confirm(f, place, decode)
    return data


def _check_confirm(f: Fields, place: str, decode: dict) -> None:
    """A cell's confirm record, as `step_choice` reads it: with timings, a verdict, the same TPs on both sides, and
    where the verdict reverted, the passes' choice."""
    confirm = f.obj(decode.get("confirm", {}), f"{place} decode field 'confirm'")
    timed = confirm.get("step_us")
    if "kept" in confirm or timed:  # timings need their verdict
        f.boolean(f.get(confirm, "kept", f"{place} decode.confirm "), f"{place} decode.confirm field 'kept'")
    if not timed:
        return
    f.obj(timed, f"{place} decode.confirm field 'step_us'")
    sides = {}
    for label in ("decode", "alone"):
        sides[label] = f.obj(
            f.get(timed, label, f"{place} decode.confirm.step_us "), f"{place} decode.confirm.step_us field {label!r}"
        )
        for tp, us in sides[label].items():
            if type(us) not in (int, float) or not us > 0:
                f.fail(f"{place} decode.confirm.step_us.{label} field {tp!r}", us, "a positive number")
    if set(sides["decode"]) != set(sides["alone"]):
        f.fail(
            f"{place} decode.confirm.step_us field 'alone'",
            sorted(sides["alone"]),
            f"the TPs of 'decode' {sorted(sides['decode'])}",
        )
    if confirm["kept"] is False and type(decode.get("passes_chosen")) is not str:
        f.fail(
            f"{place} decode field 'passes_chosen'",
            decode.get("passes_chosen"),
            "the passes' choice (a reverted confirm)",
        )


def _step_won(data: dict, row: dict, chosen, kept: bool, min_speedup: float) -> bool:
    """Whether a cell's decode choice is planned under ``min_speedup`` alone: a correct kernel that its run admitted
    to the step below the plan's speedup (`tune measure --decode-min-speedup`, ``decode_min_speedup`` in the results
    file), picked there over cuBLAS and kept by a timed confirm step, at or above that floor or the no-PDL twin of a
    winner at it (`twin_of_a_winner`: the step times it beside that winner). A run without the field admitted nothing
    under the plan's rule, so ``min_speedup`` stays its floor (the rule before near-ties)."""
    cand = row["candidates"].get(chosen) if chosen not in (None, CUBLAS) else None
    if not (kept and cand and cand["bad_elements"] == 0 and cand["us"]):
        return False
    if not row.get("decode", {}).get("confirm", {}).get("step_us"):  # no confirm step timed it against cuBLAS
        return False
    floor = min(min_speedup, data.get("decode_min_speedup", min_speedup))
    return row["cublas_us"] / cand["us"] >= floor or twin_of_a_winner(row, chosen, floor)


def write_plan(results, min_speedup: float = MIN_SPEEDUP, out: Path | None = None) -> tuple[Path, int, int]:
    """Turn measured results (one file or a list, merged) into kernels/plans/<arch>.json (or ``out``).

    Returns (path, cells planned, cells left on cuBLAS).
    """
    merged = merge_results(results if isinstance(results, (list, tuple)) else [results])
    if not merged:
        raise ValueError(f"no measured cells in {results}: nothing to write")
    arch = merged[0][0]["arch"]
    entries, skipped, in_step, near = [], 0, 0, 0
    for data, row in merged:
        winners = isolated_winners(row, min_speedup)
        chosen, kept = step_choice(row)
        won = chosen not in winners and _step_won(data, row, chosen, kept, min_speedup)
        near += won
        if chosen == CUBLAS or not (winners or won):
            skipped += 1
            in_step += bool(winners)
            continue
        name = chosen if chosen in winners or won else winners[0]
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
        if name == chosen and kept:
            prov["chosen_in"] = "decode step"
        entries.append(plans.PlanEntry(row["n"], row["k"], row["m"], cfg, prov))
    runs = sorted({(d["gpu"], d["date"]) for d, _ in merged})
    header = {
        "arch": arch,
        "capability": list(CAPABILITY_FOR_ARCH[arch]),
        "dtype": "bfloat16",
        "source": f"skinny-gemm tune on {', '.join(f'{g}, {day}' for g, day in runs)}; "
        f"cells under {min_speedup}x stay on cuBLAS"
        + (f" but near-ties the served decode step chose and confirmed: {near}" if near else "")
        + (f"; cells whose served decode step chose cuBLAS stay on it: {in_step}" if in_step else ""),
    }
    path = plans.plan_target(arch, out)
    if not entries:
        # Written, it would replace a table with one that plans nothing: every shape would fall back.
        why = f" ({in_step} of them beat it alone but chose it in the decode step)" if in_step else ""
        raise ValueError(
            f"no cell of {len(merged)} beats cuBLAS by {min_speedup}x{why}: "
            f"refusing to write an empty plan table to {path}"
        )
    plans.write_table(path, header, entries)
    return path, len(entries), skipped


def results_files(results: list[Path], runs: Path | None) -> list[Path]:
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
