"""The tuner's decode phase: re-rank each cell's fastest isolated winners inside the served decode step.

The step is the model file's (aot/steps.py): the projections with the non-GEMM ops a
vLLM step runs between them, one CUDA graph per TP, at the M being tuned. Why in the
step: a same-shape chain flatters kernels that load weight before the PDL wait
(docs/perf.md "What won"), and the bare chain of projections flatters them again, since no
server runs one. PDL is a per-entry choice: every candidate has a no-PDL twin
(`no_pdl_twins`) and both compete in every cell. An earlier rule timed only the twins
where no GEMM precedes the cell. On the H200 (2026-12-02, GLM served step, share over
cuBLAS) its M=8/16 picks against the same plan with their PDL back on: TP4 M8 1.260 /
1.262, M16 1.087 / 1.035, TP8 M8 1.487 / 1.486, M16 1.257 / 1.268, while alone the
PDL-on configs were much faster on most cells (4096x2048 M16 1.25x against 1.05x); its
M=1/2 re-tune had lost in the served step the day before.

Step differences of 5-20 us in 5600 are inside the noise of one timing, so the passes'
choices for an M are kept only if a repeated whole-step comparison against every cell
on its alone-fastest candidate confirms them (`_confirm`); else that M goes back to the
alone-fastest, except the cells the passes put on cuBLAS, which stay on it.

A step entry of cells.json is ``{"tp", "calls": [[n, k], ...], "step": {"<m>": ops}}``;
without "step" (fake steps in the tests, older candidate dirs) the calls run back to back.
"""

from __future__ import annotations

from ..kernels.config import ConfigError, KernelConfig
from ..runtime import modelfile
from ..runtime.jsonfile import InputError
from .results import (
    CUBLAS,
    MIN_SPEEDUP,
    candidate_config,
    confirmed,
    fallback_pick,
    isolated_winners,
    twin_of_a_winner,
)

# Per cell, how many of the fastest isolated winners are re-timed inside the decode step
# (each with its no-PDL twin: `entry_choices`).
DECODE_TOP = 12
# Passes over the cells in that phase: the second re-times each cell with every other cell
# on its first-pass choice (costs as much GPU time again as the first, ~20 s on the H200).
DECODE_PASSES = 2
# A family swap must make the steps this much faster: its first H200 run (M=2) swapped three
# cells for 0.3 us in 1810, inside the noise, where the effect it exists for was 50 us in 750.
FAMILY_MARGIN = 0.01
# The confirm step: the passes' choices for an M must beat the alone-fastest set by CONFIRM_MARGIN (aot/results.py,
# which `tune write` applies again to every committed run) of the step summed over TPs, timed interleaved with
# CONFIRM_TRIALS times the phase's trials.
CONFIRM_TRIALS = 3


def confirm_replays(trials: int, confirm_trials: int | None) -> int:
    """The confirm step's replays per graph: ``confirm_trials``, default CONFIRM_TRIALS x the phase's ``trials`` (0: none)."""
    return CONFIRM_TRIALS * trials if confirm_trials is None else confirm_trials


def twin(cfg: KernelConfig) -> KernelConfig:
    """``cfg`` launched without PDL (`KernelConfig.without_pdl`)."""
    return cfg.without_pdl()


def no_pdl_twins(cands: list[KernelConfig], n: int, k: int) -> list[KernelConfig]:
    """The valid no-PDL twins of ``cands`` that are not already among them, in order (`tune prepare` adds them
    where the cells have a served step: a seed set's or a catalogue model's)."""
    have, out = set(cands), []
    for cfg in cands:
        t = twin(cfg)
        if t in have:
            continue
        try:
            t.check(n=n, k=k)
        except ConfigError:
            continue
        have.add(t)
        out.append(t)
    return out


def served_steps(arch: str, model_file, ms) -> list[dict]:
    """cells.json's decode entries: per TP of the seed set, its GEMM calls and the served step per M ([] if none)."""
    from pathlib import Path

    from . import plans

    calls = plans.decode_steps(arch, Path(model_file))
    if not calls:
        return []
    model = modelfile.read(model_file)  # read and checked by decode_steps just before
    return [step_entry(model, arch, tp, ms, tp_calls) for tp, tp_calls in sorted(calls.items())]


def model_steps(arch: str, slug: str, tps, ms) -> tuple[list[dict], str]:
    """cells.json's decode entries for a catalogue model at the asked ``tps`` its step states, and a note on what
    has none ("" if every TP has its step). The GEMMs are the model's BF16 linears, as its catalogue cells are
    (a seed set's other linears included: the catalogue tunes them too)."""

    from . import steps

    path = modelfile.path_of(slug)
    try:
        model = modelfile.read(path)
    except InputError as exc:
        raise steps.StepError(str(exc)) from None
    if not steps.has_step(model):
        return [], f"no decode phase ({slug} has no served step)"
    steps.validate(model, str(path))
    stated = [tp for tp in sorted(set(tps)) if tp in model["step"]["tp"]]
    missing = sorted(set(tps) - set(stated))
    note = f"no decode phase at TP {missing} ({slug}'s step is stated for TP {model['step']['tp']})" if missing else ""
    gemms = steps.gemm_linears(model)
    return [step_entry(model, arch, tp, ms, gemms=gemms) for tp in stated], note


def step_entry(model: dict, arch: str, tp: int, ms, calls=None, gemms=None) -> dict:
    """One TP's decode entry: its GEMM calls (``calls``, default the step's own) and the served step per M
    (``gemms``: the linears run as GEMMs, default aot/steps.py's choice for ``arch``)."""
    from . import steps

    built = {m: steps.build(model, tp, m, gemms, arch=arch) for m in ms}
    if calls is None:
        calls = [(n, k) for _, n, k in steps.gemm_calls(next(iter(built.values())))] if built else []
    return {
        "tp": tp,
        "calls": [list(c) for c in calls],
        "step": {str(m): steps.to_json(ops) for m, ops in built.items()},
    }


def entry_choices(row: dict, top: int, min_speedup: float = MIN_SPEEDUP) -> list[str]:
    """The candidates a cell is timed with in the step: its ``top`` fastest isolated winners (at ``min_speedup``
    over cuBLAS alone) and their variants, PDL on and off, fastest alone first: the winners among them, and the
    no-PDL twin of a PDL winner whatever its own alone speedup (`results.twin_of_a_winner`: the alone chain flatters
    PDL, so a twin under the floor alone can be the faster one in the step; `tune write` plans it if the step
    confirms it)."""
    winners = isolated_winners(row, min_speedup)
    timed = isolated_winners(row, min_speedup=0.0)  # every exact, timed candidate, fastest first

    def base(name):
        cfg = candidate_config(row, name)
        return name if cfg is None else twin(cfg)  # a result row without a whole config (synthetic): its own base

    bases = []
    for name in winners:
        b = base(name)
        if b not in bases:
            bases.append(b)
    chosen, won = set(bases[:top]), set(winners)
    return [
        name for name in timed if base(name) in chosen and (name in won or twin_of_a_winner(row, name, min_speedup))
    ]


def decode_phase(
    lib,
    rows: list,
    steps: list,
    device,
    top: int,
    trials: int,
    progress: bool,
    passes: int = 1,
    read_cap: int | None = None,
    confirm_trials: int | None = None,
    cublas: bool = True,
    min_speedup: float = MIN_SPEEDUP,
) -> None:
    """Re-rank each cell's candidates (`entry_choices`) inside whole served steps; adds row["decode"] in place.

    A later pass re-times every cell with all the others on their previous-pass choice
    (the first pass sees the cells after it still on their isolated pick); the last pass decides.
    Then the family check, then per M the confirm step (``confirm_trials`` replays per graph,
    default CONFIRM_TRIALS x ``trials``; 0 skips it and keeps the passes' choices).
    ``read_cap`` shortens the step's read stand-ins (measure.step_data); None keeps the served step's bytes.
    With ``cublas`` each cell's candidates include cuBLAS itself (``CUBLAS``): alone a kernel may beat cuBLAS and
    lose to it inside the step, and then that cell alone stays on cuBLAS.
    ``min_speedup`` admits a cell's candidates to the step (its alone speedup over cuBLAS); under the plan's
    ``MIN_SPEEDUP`` it lets near-ties in, so a cell whose kernels only tie cuBLAS alone is still tried with its
    neighbours on ours (the kernel before one of ours changes its time in the step; docs/perf.md). The confirm
    step's fallback set stays the alone-fastest at ``MIN_SPEEDUP``, so such a cell must win in the step.
    """
    import torch
    from tqdm import tqdm

    confirm_trials = confirm_replays(trials, confirm_trials)
    cells = {(r["n"], r["k"], r["m"]): r for r in rows}
    alone = {key: (isolated_winners(r) or [None])[0] for key, r in cells.items()}
    choice = dict(alone)
    work: dict = {}  # m -> [(n, k, names)], the biggest share of the steps first
    for m in sorted({key[2] for key in cells}):
        # A shape's share of the steps (calls x its cuBLAS time, a proxy for bytes) sets the order:
        # the big terms settle first.
        share: dict = {}
        for step in steps:
            for n, k in step["calls"]:
                row = cells.get((n, k, m))
                if row is not None:
                    share[(n, k)] = share.get((n, k), 0.0) + row["cublas_us"]
        for n, k in sorted(share, key=lambda s: -share[s]):
            names = entry_choices(cells[(n, k, m)], top, min_speedup)
            if names and cublas:
                names.append(CUBLAS)
            if len(names) > 1:
                work.setdefault(m, []).append((n, k, names))
    bar = tqdm(total=passes * sum(len(v) for v in work.values()), desc="decode", unit="cell", disable=not progress)
    for m, group in work.items():
        bufs = {step["tp"]: _step_data(step, m, device, read_cap) for step in steps}
        for n, k, names in [cell for _ in range(passes) for cell in group]:
            tps = [tp for tp, data in bufs.items() if any((op.n, op.k) == (n, k) for op in data.ops if op.is_gemm)]
            per = _time_steps(lib, bufs, m, {name: {**choice, (n, k, m): name} for name in names}, tps, trials)
            best = min(names, key=lambda nm: sum(per[nm].values()))
            choice[(n, k, m)] = best
            cells[(n, k, m)]["decode"] = {
                "chosen": best,
                "step_us": {name: {str(tp): us for tp, us in v.items()} for name, v in per.items()},
            }
            bar.update(1)
        _family_check(lib, bufs, m, group, cells, choice, trials)
        if confirm_trials:
            _confirm(lib, bufs, m, [(n, k, m) for n, k, _ in group], cells, choice, confirm_trials)
        del bufs
        if getattr(device, "type", "cuda") == "cuda":
            torch.cuda.empty_cache()
    bar.close()


def _confirm(lib, bufs: dict, m: int, keys: list, cells: dict, choice: dict, trials: int) -> None:
    """Keep the passes' choices at ``m`` only if the whole step (summed over its TPs) is CONFIRM_MARGIN faster with
    them than with the fallback set (`fallback_pick`: every cell on its alone-fastest candidate, or on cuBLAS where
    the step found that faster); else every cell of ``m`` goes back to that set.

    Both sets are timed interleaved, ``trials`` replays each: one timing of a step that the passes
    saw 5-20 us apart in 5600 cannot tell them apart (H200, 2026-12-02).
    """
    at_m = {key: pick for key, pick in choice.items() if key[2] == m}
    alone_m = {key: fallback_pick(cells[key], pick) for key, pick in at_m.items()}
    if at_m == alone_m:
        record = {"kept": True, "step_us": {}, "note": "the decode choices are the fallback set"}
    else:
        tps = sorted(bufs)
        per = _time_steps(lib, bufs, m, {"decode": dict(choice), "alone": {**choice, **alone_m}}, tps, trials)
        kept = confirmed(per)
        record = {"kept": kept, "step_us": {lb: {str(tp): us for tp, us in v.items()} for lb, v in per.items()}}
        if not kept:
            choice.update(alone_m)
    for key in keys:
        decode = cells[key]["decode"]
        decode["confirm"] = record
        if not record["kept"]:
            decode["passes_chosen"] = decode["chosen"]
            decode["chosen"] = alone_m[key]


def _step_data(step: dict, m: int, device, read_cap: int | None = None):
    """Buffers of one TP's step at ``m``: the served step if the entry has one, else its calls back to back."""
    from . import measure as ms
    from . import steps

    ops_json = step.get("step", {}).get(str(m))
    ops = (
        steps.from_json(ops_json)
        if ops_json is not None
        else [steps.Op("gemm", "", n=n, k=k) for n, k in step["calls"]]
    )
    return ms.step_data(ops, m, device, read_cap)


def _time_steps(lib, bufs: dict, m: int, picks: dict, tps: list, trials: int) -> dict:
    """Whole-step time per TP for each named choice set ({label: {(n, k, m): variant, None or CUBLAS}}; those two
    run cuBLAS), timed interleaved."""
    from . import measure as ms

    def gemm(pick):
        return lambda x, w, out, n, k: (
            ms.kernel_call(lib, pick[(n, k, m)], x, w, out, n, k)
            if pick.get((n, k, m)) not in (None, CUBLAS)
            else ms.cublas_call(x, w, out)
        )()

    graphs = {
        (label, tp): ms.capture(ms.step_calls(bufs[tp], gemm(pick))) for label, pick in picks.items() for tp in tps
    }
    times = ms.time_graphs({str(key): g for key, g in graphs.items()}, {str(key): 1 for key in graphs}, trials)
    return {label: {tp: times[str((label, tp))] for tp in tps} for label in picks}


def family(config: dict) -> str:
    """A candidate's kernel family for the decode phase's last check: its kind, and ring, split or persist if set."""
    extra = ""
    if config.get("ring"):
        extra = "+ring"
    elif config.get("split", 1) > 1:
        extra = "+split"
    elif config.get("persist", 0):
        extra = "+persist"
    return f"{config.get('kind', '?')}{extra}"


def _family_check(lib, bufs: dict, m: int, group: list, cells: dict, choice: dict, trials: int) -> None:
    """Swap each kernel family holding two or more cells out whole, keeping the swap if the steps get 1% faster.

    The passes change one cell at a time, so a cost that only goes away when every
    cell of a family leaves it survives them: on the H200 any bulk cell slowed the whole
    TP8 M=4 step by ~50 us, and two bulk cells kept each other in the plan.
    Each cell's replacement is its fastest other-family candidate of its last pass (cuBLAS among them); cells on
    cuBLAS form no family.
    """

    def fam(key, name):
        return CUBLAS if name == CUBLAS else family(cells[key]["candidates"][name]["config"])

    keys = [(n, k, m) for n, k, _ in group]
    for fam_name in sorted({fam(key, choice[key]) for key in keys} - {CUBLAS}):  # cuBLAS is the baseline
        members = [key for key in keys if fam(key, choice[key]) == fam_name]
        if len(members) < 2:
            continue
        swap = {}
        for key in members:
            others = {
                nm: sum(v.values()) for nm, v in cells[key]["decode"]["step_us"].items() if fam(key, nm) != fam_name
            }
            if others:
                swap[key] = min(others, key=others.get)
        if not swap:
            continue
        tps = sorted(
            {
                tp
                for tp, data in bufs.items()
                for op in data.ops
                if op.is_gemm
                for key in swap
                if (op.n, op.k) == key[:2]
            }
        )
        per = _time_steps(lib, bufs, m, {"kept": dict(choice), "swapped": {**choice, **swap}}, tps, trials)
        swapped = sum(per["swapped"].values()) < (1 - FAMILY_MARGIN) * sum(per["kept"].values())
        record = {
            "family": fam_name,
            "swapped": swapped,
            "step_us": {lb: {str(tp): us for tp, us in v.items()} for lb, v in per.items()},
        }
        for key, other in swap.items():
            cells[key]["decode"]["family_check"] = record
            if swapped:
                choice[key] = cells[key]["decode"]["chosen"] = other
