"""The tuner's decode phase: re-rank each cell's fastest isolated winners inside the served decode step.

The step is the model file's (aot/steps.py): the projections with the non-GEMM ops a
vLLM step runs between them, one CUDA graph per TP, at the M being tuned. Why in the
step: a same-shape chain flatters kernels that load weight before the PDL wait
(docs/perf.md v4), and the bare chain of projections flatters them again, since no
server runs one: in the served step a PDL launch after a kernel that does not trigger
costs about 0.6 us and overlaps nothing (DESIGN.md, "The served step"). So PDL is a
per-entry choice here: every candidate has a no-PDL twin (`no_pdl_twins`), both are
timed where a GEMM (whose kernel may trigger) precedes the cell somewhere in the step,
and only the twins where nothing before the cell ever triggers.

A step entry of cells.json is ``{"tp", "calls": [[n, k], ...], "step": {"<m>": ops}}``;
without "step" (fake steps in the tests, older candidate dirs) the calls run back to back.
"""

from __future__ import annotations

import dataclasses

from ..kernels.config import ConfigError, KernelConfig

# Per cell, how many of the fastest isolated winners are re-timed inside the decode step
# (each with its no-PDL twin, where that twin is a winner too).
DECODE_TOP = 12
# Passes over the cells in that phase: the second re-times each cell with every other cell
# on its first-pass choice (costs as much GPU time again as the first, ~20 s on the H200).
DECODE_PASSES = 2
# A family swap must make the steps this much faster: its first H200 run (M=2) swapped three
# cells for 0.3 us in 1810, inside the noise, where the effect it exists for was 50 us in 750.
FAMILY_MARGIN = 0.01


def twin(cfg: KernelConfig) -> KernelConfig:
    """``cfg`` launched without PDL: ``early`` and ``persist`` need PDL, so they go too."""
    return dataclasses.replace(cfg, pdl=False, early=False, persist=0)


def no_pdl_twins(cands: list[KernelConfig], n: int, k: int) -> list[KernelConfig]:
    """The valid no-PDL twins of ``cands`` that are not already among them, in order (the lead may wire this
    into candidate generation; `tune prepare` adds them where the seed set has a served step)."""
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
    import json
    from pathlib import Path

    from . import plans, steps

    calls = plans.decode_steps(arch, Path(model_file))
    if not calls:
        return []
    model = json.loads(Path(model_file).read_text())
    return [
        {"tp": tp, "calls": [list(c) for c in tp_calls],
         "step": {str(m): steps.to_json(steps.build(model, tp, m, arch=arch)) for m in ms}}
        for tp, tp_calls in sorted(calls.items())
    ]


def preceded_by_gemm(step: dict, m: int) -> set[tuple[int, int]]:
    """The (n, k) with at least one call right after another GEMM in the served step at ``m`` (all, bare)."""
    ops = step.get("step", {}).get(str(m))
    if ops is None:
        return {tuple(c) for c in step["calls"]}
    found, prev_gemm = set(), False
    for op in ops:
        is_gemm = isinstance(op, list)
        if is_gemm and prev_gemm:
            found.add((op[1], op[2]))
        prev_gemm = is_gemm
    return found


def entry_choices(row: dict, top: int, pdl_useful: bool) -> list[str]:
    """The candidates a cell is timed with in the step: its ``top`` fastest isolated winners and their no-PDL
    twins (both winners); only the no-PDL ones where nothing before the cell triggers, if it has any."""
    from .tune import isolated_winners

    winners = isolated_winners(row)
    configs = {name: row["candidates"][name].get("config") or {} for name in winners}

    def base(name):
        try:
            return KernelConfig.from_json({**configs[name], "pdl": False, "early": False, "persist": 0})
        except ConfigError:  # a result row without a whole config (synthetic): its own base
            return name

    bases = []
    for name in winners:
        b = base(name)
        if b not in bases:
            bases.append(b)
    chosen = set(bases[:top])
    names = [name for name in winners if base(name) in chosen]
    if not pdl_useful:
        off = [name for name in names if configs[name].get("pdl") is False]
        names = off or names
    return names


def decode_phase(lib, rows: list, steps: list, device, top: int, trials: int, progress: bool, passes: int = 1,
                 read_cap: int | None = None) -> None:
    """Re-rank each cell's candidates (`entry_choices`) inside whole served steps; adds row["decode"] in place.

    A later pass re-times every cell with all the others on their previous-pass choice
    (the first pass sees the cells after it still on their isolated pick); the last pass decides.
    ``read_cap`` shortens the step's read stand-ins (measure.step_data); None keeps the served step's bytes.
    """
    import torch
    from tqdm import tqdm

    from .tune import isolated_winners

    cells = {(r["n"], r["k"], r["m"]): r for r in rows}
    choice = {key: (isolated_winners(r) or [None])[0] for key, r in cells.items()}
    work: dict = {}  # m -> [(n, k, names)], the biggest share of the steps first
    for m in sorted({key[2] for key in cells}):
        after_gemm = set().union(*(preceded_by_gemm(step, m) for step in steps)) if steps else set()
        # A shape's share of the steps (calls x its cuBLAS time, a proxy for bytes) sets the order:
        # the big terms settle first.
        share: dict = {}
        for step in steps:
            for n, k in step["calls"]:
                row = cells.get((n, k, m))
                if row is not None:
                    share[(n, k)] = share.get((n, k), 0.0) + row["cublas_us"]
        for n, k in sorted(share, key=lambda s: -share[s]):
            row = cells[(n, k, m)]
            names = entry_choices(row, top, (n, k) in after_gemm)
            if names and choice[(n, k, m)] not in names:
                # No kernel before this cell in the step triggers: its no-PDL twin stands in from the start.
                choice[(n, k, m)] = names[0]
                if len(names) == 1:
                    row["decode"] = {"chosen": names[0], "step_us": {},
                                     "note": "no kernel before it in the served step triggers: PDL off"}
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
        del bufs
        if getattr(device, "type", "cuda") == "cuda":
            torch.cuda.empty_cache()
    bar.close()


def _step_data(step: dict, m: int, device, read_cap: int | None = None):
    """Buffers of one TP's step at ``m``: the served step if the entry has one, else its calls back to back."""
    from . import measure as ms
    from . import steps

    ops_json = step.get("step", {}).get(str(m))
    ops = steps.from_json(ops_json) if ops_json is not None else [steps.Op("gemm", "", n=n, k=k) for n, k in step["calls"]]
    return ms.step_data(ops, m, device, read_cap)


def _time_steps(lib, bufs: dict, m: int, picks: dict, tps: list, trials: int) -> dict:
    """Whole-step time per TP for each named choice set ({label: {(n, k, m): variant}}), timed interleaved."""
    from . import measure as ms
    from .tune import _launch, _mm

    def gemm(pick):
        return lambda x, w, out, n, k: (_launch(lib, pick[(n, k, m)], x, w, out, n, k) if pick.get((n, k, m))
                                        else _mm(x, w, out))()

    graphs = {(label, tp): ms.capture(ms.step_calls(bufs[tp], gemm(pick))) for label, pick in picks.items() for tp in tps}
    times = ms.time_graphs({str(key): g for key, g in graphs.items()}, {str(key): 1 for key in graphs}, trials)
    return {label: {tp: times[str((label, tp))] for tp in tps} for label in picks}


def family(config: dict) -> str:
    """A candidate's kernel family for the decode phase's last check: its kind, and split or persist if set."""
    extra = "+split" if config.get("split", 1) > 1 else "+persist" if config.get("persist", 0) else ""
    return f"{config.get('kind', '?')}{extra}"


def _family_check(lib, bufs: dict, m: int, group: list, cells: dict, choice: dict, trials: int) -> None:
    """Swap each kernel family holding two or more cells out whole, keeping the swap if the steps get 1% faster.

    The passes change one cell at a time, so a cost that only goes away when every
    cell of a family leaves it survives them: in v9 any bulk cell slowed the whole TP8
    step by ~50 us, and two bulk cells kept each other in the plan (docs/perf.md v9).
    Each cell's replacement is its fastest other-family candidate of its last pass.
    """
    def fam(key, name):
        return family(cells[key]["candidates"][name]["config"])

    keys = [(n, k, m) for n, k, _ in group]
    for fam_name in sorted({fam(key, choice[key]) for key in keys}):
        members = [key for key in keys if fam(key, choice[key]) == fam_name]
        if len(members) < 2:
            continue
        swap = {}
        for key in members:
            others = {nm: sum(v.values()) for nm, v in cells[key]["decode"]["step_us"].items() if fam(key, nm) != fam_name}
            if others:
                swap[key] = min(others, key=others.get)
        if not swap:
            continue
        tps = sorted({tp for tp, data in bufs.items() for op in data.ops if op.is_gemm for key in swap
                      if (op.n, op.k) == key[:2]})
        per = _time_steps(lib, bufs, m, {"kept": dict(choice), "swapped": {**choice, **swap}}, tps, trials)
        swapped = sum(per["swapped"].values()) < (1 - FAMILY_MARGIN) * sum(per["kept"].values())
        record = {"family": fam_name, "swapped": swapped,
                  "step_us": {lb: {str(tp): us for tp, us in v.items()} for lb, v in per.items()}}
        for key, other in swap.items():
            cells[key]["decode"]["family_check"] = record
            if swapped:
                choice[key] = cells[key]["decode"]["chosen"] = other
