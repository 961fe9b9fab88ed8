"""The decode phase's confirm step on the CPU: an M's step choices stay only if the whole step confirms them."""

import json

import pytest
from helpers.fake_step import STEPS, cand, fake_step

from skinny_gemm.aot import candidates, decode_phase, plans
from skinny_gemm.aot import measure as ms
from skinny_gemm.aot.results import write_plan


def _rows(m):
    """Two cells at ``m``: "a"/"x" alone-fastest, "b"/"y" the runners-up (their step costs are each test's)."""
    return [
        {"n": 64, "k": 32, "m": m, "cublas_us": 10.0, "candidates": {f"a{m}": cand(5.0), f"b{m}": cand(6.0)}},
        {"n": 32, "k": 64, "m": m, "cublas_us": 10.0, "candidates": {f"x{m}": cand(5.0), f"y{m}": cand(6.0)}},
    ]


@pytest.fixture
def timed(monkeypatch):
    """A fake step whose cost is the sum of the launched variants' costs; records each timing's trials."""
    cost = {"cublas": 1000.0}  # cuBLAS, a candidate in every cell, is far slower in these steps
    lib = fake_step(monkeypatch, lambda names: sum(cost[n] for n in names))
    calls = []
    inner = ms.time_graphs

    def record(graphs, per, trials):
        calls.append((len(graphs), trials))
        return inner(graphs, per, trials)

    monkeypatch.setattr(ms, "time_graphs", record)
    return cost, calls, lib


def _run(lib, rows, **kw):
    import torch

    decode_phase.decode_phase(lib, rows, STEPS, torch.device("cpu"), top=12, trials=2, progress=False, **kw)


def test_a_clear_step_win_is_kept(timed):
    cost, calls, lib = timed
    # In the step b and y are 10% faster than the alone-fastest a and x.
    cost.update({"a1": 100.0, "b1": 90.0, "x1": 100.0, "y1": 90.0})
    rows = _rows(1)
    _run(lib, rows)
    assert [r["decode"]["chosen"] for r in rows] == ["b1", "y1"]
    confirm = rows[0]["decode"]["confirm"]
    assert confirm is rows[1]["decode"]["confirm"], "one comparison per M, recorded on each of its cells"
    # TP4 runs (64, 32) twice and (32, 64) once, TP8 (32, 64) once.
    assert confirm == {"kept": True, "step_us": {"decode": {"4": 270.0, "8": 90.0}, "alone": {"4": 300.0, "8": 100.0}}}
    assert calls[-1] == (4, decode_phase.CONFIRM_TRIALS * 2), "both sets at both TPs, 3x the phase's trials"


def test_a_win_within_the_margin_goes_back_to_the_alone_fastest(timed, tmp_path):
    cost, _, lib = timed
    # The passes see b and y faster, but the whole step by 0.1% only: inside CONFIRM_MARGIN.
    cost.update({"a1": 100.0, "b1": 99.9, "x1": 100.0, "y1": 99.9})
    rows = _rows(1)
    _run(lib, rows)
    decode = rows[0]["decode"]
    assert decode["confirm"]["kept"] is False
    assert [r["decode"]["chosen"] for r in rows] == ["a1", "x1"], "every cell of that M back on its alone-fastest"
    assert [r["decode"]["passes_chosen"] for r in rows] == ["b1", "y1"]
    # tune write takes decode.chosen, and says it was not a decode-step pick (the (32, 64) row, given valid configs).
    x_cfg, y_cfg = candidates.candidates(32, 64, 1)[:2]
    row = {
        **rows[1],
        "candidates": {"x1": {**cand(5.0), "config": x_cfg.to_json()}, "y1": {**cand(6.0), "config": y_cfg.to_json()}},
    }
    src = tmp_path / "results.json"
    for decode, config, chosen_in in (
        (rows[1]["decode"], x_cfg, None),
        ({**rows[1]["decode"], "chosen": "y1", "confirm": {"kept": True}}, y_cfg, "decode step"),
    ):
        src.write_text(
            json.dumps(
                {
                    "arch": "sm_90a",
                    "gpu": "test GPU",
                    "date": "2026-12-02",
                    "method": "synthetic",
                    "cells": [{**row, "decode": decode}],
                }
            )
        )
        write_plan(src, out=tmp_path / "plan.json")
        _, (entry,) = plans.load(tmp_path / "plan.json")
        assert entry.config == config and entry.provenance.get("chosen_in") == chosen_in


def test_each_m_is_confirmed_on_its_own(timed):
    cost, _, lib = timed
    cost.update({"a1": 100.0, "b1": 90.0, "x1": 100.0, "y1": 90.0, "a2": 100.0, "b2": 99.9, "x2": 100.0, "y2": 99.9})
    rows = _rows(1) + _rows(2)
    _run(lib, rows)
    assert [r["decode"]["chosen"] for r in rows] == ["b1", "y1", "a2", "x2"]
    assert [r["decode"]["confirm"]["kept"] for r in rows] == [True, True, False, False]


def test_no_confirm_step_keeps_the_passes_choices(timed):
    cost, calls, lib = timed
    cost.update({"a1": 100.0, "b1": 99.9, "x1": 100.0, "y1": 99.9})
    rows = _rows(1)
    _run(lib, rows, confirm_trials=0)
    assert [r["decode"]["chosen"] for r in rows] == ["b1", "y1"]
    assert not any("confirm" in r["decode"] for r in rows)
    assert all(trials == 2 for _, trials in calls)


def test_choices_equal_to_the_alone_fastest_need_no_timing(timed):
    cost, calls, lib = timed
    cost.update({"a1": 90.0, "b1": 100.0, "x1": 90.0, "y1": 100.0})
    rows = _rows(1)
    _run(lib, rows)
    assert [r["decode"]["chosen"] for r in rows] == ["a1", "x1"]
    assert rows[0]["decode"]["confirm"] == {
        "kept": True,
        "step_us": {},
        "note": "the decode choices are the fallback set",
    }
    assert all(trials == 2 for _, trials in calls), "no confirm timing"


def test_measure_cli_takes_confirm_trials(capsys, tmp_path):
    from skinny_gemm.aot import cli

    with pytest.raises(SystemExit):
        cli.main(["tune", "measure", str(tmp_path), "--results", str(tmp_path / "r.json"), "--confirm-trials", "-1"])
    assert "--confirm-trials: -1 is not >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["tune", "measure", "--help"])
    assert "alone-fastest by 0.25% (default 3 x --trials" in " ".join(capsys.readouterr().out.split())


def test_measure_without_a_gpu_is_one_line(capsys, tmp_path, monkeypatch):
    """On a machine whose torch sees no GPU (the CPU machine that prepares), measure refuses in one line, exit 2."""
    import torch

    from skinny_gemm.aot import cli

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    (tmp_path / "cells.json").write_text(json.dumps({"arch": "sm_90a", "cells": []}))
    assert cli.main(["tune", "measure", str(tmp_path), "--results", str(tmp_path / "r.json")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a CUDA GPU" in err and str(tmp_path) in err
    assert not (tmp_path / "r.json").exists()


def _valid_cells():
    """Two cells whose candidates are valid configs (so `tune write` can plan them): (128, 64) with a1 / b1, (64, 64)
    with x1 / y1, each first one alone-fastest; TP4 runs (128, 64) twice and (64, 64) once, TP8 (64, 64) once.
    Returns (rows, steps, x1's config)."""
    a_cfg, b_cfg = candidates.candidates(128, 64, 1)[:2]
    x_cfg, y_cfg = candidates.candidates(64, 64, 1)[:2]
    rows = [
        {"n": 128, "k": 64, "m": 1, "cublas_us": 10.0, "candidates": {"a1": a_cfg, "b1": b_cfg}},
        {"n": 64, "k": 64, "m": 1, "cublas_us": 10.0, "candidates": {"x1": x_cfg, "y1": y_cfg}},
    ]
    for row in rows:
        row["candidates"] = {
            nm: {**cand(5.0 + i), "config": c.to_json()} for i, (nm, c) in enumerate(row["candidates"].items())
        }
    steps = [{"tp": 4, "calls": [[128, 64], [64, 64], [128, 64]]}, {"tp": 8, "calls": [[64, 64]]}]
    return rows, steps, x_cfg


def test_a_cell_whose_kernels_lose_in_the_step_stays_on_cublas(timed, tmp_path):
    """Alone both cells' kernels beat cuBLAS; inside the step (128, 64)'s lose to it (as Llama's down_proj at M = 16
    on the H200): that cell alone goes to cuBLAS, the step confirms it, and tune write plans only the other cell."""
    import torch

    cost, _, lib = timed
    rows, steps, x_cfg = _valid_cells()
    # per call in the step: cuBLAS 50 beats a/b (60 / 70) at (128, 64) and loses to x/y (40 / 45) at (64, 64)
    cost.update({"a1": 60.0, "b1": 70.0, "x1": 40.0, "y1": 45.0, "cublas": 50.0})

    def run():
        decode_phase.decode_phase(lib, rows, steps, torch.device("cpu"), top=12, trials=2, progress=False)

    run()
    assert [r["decode"]["chosen"] for r in rows] == ["cublas", "x1"]
    assert rows[0]["decode"]["step_us"]["cublas"] == {"4": 140.0}  # TP4: 2 x cuBLAS + x1
    # the fallback keeps the passes' cuBLAS cell, so it is the decode set itself: nothing to time
    assert rows[0]["decode"]["confirm"] == {
        "kept": True,
        "step_us": {},
        "note": "the decode choices are the fallback set",
    }
    src = tmp_path / "results.json"
    src.write_text(
        json.dumps({"arch": "sm_90a", "gpu": "test GPU", "date": "2026-12-03", "method": "synthetic", "cells": rows})
    )
    _, planned, skipped = write_plan(src, out=tmp_path / "plan.json")
    header, entries = plans.load(tmp_path / "plan.json")
    assert (planned, skipped) == (1, 1) and [(e.n, e.k, e.m, e.config) for e in entries] == [(64, 64, 1, x_cfg)]
    assert "cells whose served decode step chose cuBLAS stay on it: 1" in header["source"]
    # the control: where cuBLAS is slower in the step, both cells keep a kernel
    for row in rows:
        row.pop("decode")
    cost["cublas"] = 80.0
    run()
    assert [r["decode"]["chosen"] for r in rows] == ["a1", "x1"]


def test_a_fallback_keeps_the_cells_the_passes_put_on_cublas(timed):
    """The confirm step goes back (the kernel picks win by 0.1% only), but a cell whose kernels all lost to cuBLAS in
    the step stays on cuBLAS: the fallback undoes picks between kernels, it does not plan a kernel the step found
    slower (Mistral-Small-24B M = 8 on the H200, 2026-12-03)."""
    cost, _, lib = timed
    # (64, 32): cuBLAS 99 per call beats a/b (99.2 / 101); (32, 64): y beats x by 0.05, both beat cuBLAS. Every
    # set is within the margin of the next, so the step falls back whichever fallback it has.
    cost.update({"a1": 99.2, "b1": 101.0, "x1": 98.0, "y1": 97.95, "cublas": 99.0})
    rows = _rows(1)
    _run(lib, rows)
    confirm = rows[1]["decode"]["confirm"]
    assert confirm["kept"] is False
    # the fallback set timed: cuBLAS at (64, 32), x at (32, 64); TP4 runs (64, 32) twice and (32, 64) once
    assert confirm["step_us"]["alone"] == {"4": 296.0, "8": 98.0}
    assert [r["decode"]["chosen"] for r in rows] == ["cublas", "x1"], "not a1, which lost to cuBLAS in the step"
    assert [r["decode"]["passes_chosen"] for r in rows] == ["cublas", "y1"]


def test_a_fallback_puts_a_cell_on_cublas_where_its_alone_fastest_lost_in_the_step(timed, tmp_path):
    """The passes put (128, 64) on b, which beat cuBLAS in the step, but its alone-fastest a lost to cuBLAS there
    (Llama-3.1-8B's down_proj ring at M = 16 on the H200): the fallback runs that cell on cuBLAS, not on a, and
    `tune write` plans only the other cell."""
    import torch

    cost, _, lib = timed
    rows, steps, x_cfg = _valid_cells()
    # every set within the margin of the next: the passes' b / y, the fallback's cuBLAS / x, the old one's a / x
    cost.update({"a1": 100.0, "b1": 98.9, "x1": 98.0, "y1": 97.95, "cublas": 99.0})
    decode_phase.decode_phase(lib, rows, steps, torch.device("cpu"), top=12, trials=2, progress=False)
    assert [r["decode"]["passes_chosen"] for r in rows] == ["b1", "y1"]
    assert rows[0]["decode"]["confirm"]["kept"] is False
    assert rows[0]["decode"]["confirm"]["step_us"]["alone"] == {"4": 296.0, "8": 98.0}
    assert [r["decode"]["chosen"] for r in rows] == ["cublas", "x1"]
    src = tmp_path / "results.json"
    src.write_text(
        json.dumps({"arch": "sm_90a", "gpu": "test GPU", "date": "2026-12-03", "method": "synthetic", "cells": rows})
    )
    _, planned, skipped = write_plan(src, out=tmp_path / "plan.json")
    _, entries = plans.load(tmp_path / "plan.json")
    assert (planned, skipped) == (1, 1) and [(e.n, e.k, e.config) for e in entries] == [(64, 64, x_cfg)]


def test_cells_on_cublas_form_no_family(timed):
    """Two cells choosing cuBLAS are not a kernel family for the family check: nothing swaps them back to kernels,
    and they get no family_check record."""
    cost, _, lib = timed
    cost.update({"a1": 60.0, "b1": 70.0, "x1": 60.0, "y1": 70.0, "cublas": 50.0})
    rows = _rows(1)
    for row in rows:
        row["candidates"] = {
            nm: {**c, "config": {"kind": "mma", "split": 1, "persist": 0}} for nm, c in row["candidates"].items()
        }
    _run(lib, rows, confirm_trials=0)
    assert [r["decode"]["chosen"] for r in rows] == ["cublas", "cublas"]
    assert not any("family_check" in r["decode"] for r in rows)


@pytest.mark.parametrize(
    "recorded_kept, decode_us, entry, chosen_in",
    [
        # reverted under the 0.5% of its day, 0.4% faster: kept under today's margin, the passes' choice stands
        (False, 996.0, "y1", "decode step"),
        # reverted, 0.1% faster (inside today's margin too): the fallback stays
        (False, 999.0, "x1", None),
        # kept, 0.1% faster (a record under a looser margin): reverted, the fallback (the alone-fastest)
        (True, 999.0, "x1", None),
        # kept, 0.4% faster: the passes' choice
        (True, 996.0, "y1", "decode step"),
    ],
)
def test_write_takes_the_confirm_verdict_again_under_todays_margin(
    recorded_kept, decode_us, entry, chosen_in, tmp_path
):
    """tune write re-decides each M's confirm step from its recorded timings with CONFIRM_MARGIN (0.25%), so a margin
    fitted after a run applies to it; the cases straddle the margin from both recorded verdicts."""
    from skinny_gemm.aot.results import CONFIRM_MARGIN

    assert CONFIRM_MARGIN == 0.0025
    x_cfg, y_cfg = candidates.candidates(32, 64, 1)[:2]
    confirm = {"kept": recorded_kept, "step_us": {"decode": {"1": decode_us}, "alone": {"1": 1000.0}}}
    decode = {"chosen": "y1" if recorded_kept else "x1", "confirm": confirm, "step_us": {}}
    if not recorded_kept:
        decode["passes_chosen"] = "y1"
    row = {
        "n": 32,
        "k": 64,
        "m": 1,
        "cublas_us": 10.0,
        "candidates": {"x1": {**cand(5.0), "config": x_cfg.to_json()}, "y1": {**cand(6.0), "config": y_cfg.to_json()}},
        "decode": decode,
    }
    src = tmp_path / "results.json"
    data = {"arch": "sm_90a", "gpu": "test GPU", "date": "2026-12-03", "method": "synthetic", "cells": [row]}
    src.write_text(json.dumps(data))
    write_plan(src, out=tmp_path / "plan.json")
    _, (planned,) = plans.load(tmp_path / "plan.json")
    assert planned.config == {"x1": x_cfg, "y1": y_cfg}[entry]
    assert planned.provenance.get("chosen_in") == chosen_in


def test_a_reverted_confirm_without_the_passes_choice_is_one_error(tmp_path):
    from skinny_gemm.aot.results import read_results

    x_cfg = candidates.candidates(32, 64, 1)[0]
    row = {
        "n": 32,
        "k": 64,
        "m": 1,
        "cublas_us": 10.0,
        "candidates": {"x1": {**cand(5.0), "config": x_cfg.to_json()}},
        "decode": {
            "chosen": "x1",
            "confirm": {"kept": False, "step_us": {"decode": {"1": 996.0}, "alone": {"1": 1e3}}},
        },
    }
    src = tmp_path / "results.json"
    src.write_text(json.dumps({"arch": "sm_90a", "gpu": "g", "date": "d", "method": "m", "cells": [row]}))
    with pytest.raises(ValueError, match="passes_chosen"):
        read_results(src)


def test_near_ties_enter_the_step_only_when_admitted_and_are_planned_where_it_keeps_them(monkeypatch, tmp_path):
    """(128, 64)'s kernel ties cuBLAS alone (10.0 against 10.1 us: under the plan's 1.05x), but in the step it makes
    the other cell's kernel faster after it (as Llama-3.1-8B's gate_up before down at M = 16 is suspected to on the
    H200). At the default threshold the tie cell never enters the step and stays on cuBLAS; at 0.97 it does, the step
    picks it, the confirm step keeps it against the fallback (that cell on cuBLAS), and `tune write` plans it under
    1.05x. The control: where it helps nothing, the confirm step does not keep it and the cell stays on cuBLAS."""
    import torch

    rows, steps, _ = _valid_cells()
    a_cfg = rows[0]["candidates"]["a1"]["config"]
    rows[0]["cublas_us"] = 10.1
    rows[0]["candidates"] = {"a1": {**cand(10.0), "config": a_cfg}}
    helps = {"x1": 10.0}  # what x1 saves per call in a step that runs a1

    def cost(names):
        base = {"a1": 50.0, "cublas": 50.0, "x1": 40.0, "y1": 45.0}
        return sum(base[n] - (helps.get(n, 0.0) if "a1" in names else 0.0) for n in names)

    lib = fake_step(monkeypatch, cost)

    def run(**kw):
        for row in rows:
            row.pop("decode", None)
        decode_phase.decode_phase(lib, rows, steps, torch.device("cpu"), top=12, trials=2, progress=False, **kw)
        src = tmp_path / "results.json"
        data = {"arch": "sm_90a", "gpu": "test GPU", "date": "2026-12-04", "method": "synthetic", "cells": rows}
        if "min_speedup" in kw:  # as `tune measure --decode-min-speedup` records it
            data["decode_min_speedup"] = kw["min_speedup"]
        src.write_text(json.dumps(data))
        write_plan(src, out=tmp_path / "plan.json")
        return {(e.n, e.k): e for e in plans.load(tmp_path / "plan.json")[1]}

    assert set(run()) == {(64, 64)} and "decode" not in rows[0], "the tie cell was not admitted to the step"
    planned = run(min_speedup=0.97)
    assert rows[0]["decode"]["chosen"] == "a1" and rows[0]["decode"]["confirm"]["kept"] is True
    # TP4, first pass: a1 twice with x1 helped (2 x 50 + 30) against cuBLAS twice with x1 unhelped (2 x 50 + 40)
    assert rows[0]["decode"]["step_us"] == {"a1": {"4": 130.0}, "cublas": {"4": 140.0}}
    assert set(planned) == {(128, 64), (64, 64)}
    entry = planned[(128, 64)]
    assert entry.config.to_json() == a_cfg and entry.provenance["chosen_in"] == "decode step"
    assert entry.provenance["speedup"] == 1.01
    # a stricter write (--min-speedup 1.2) does not plan a near-tie under it unless the run admitted it: it did here
    write_plan(tmp_path / "results.json", min_speedup=1.2, out=tmp_path / "plan.json")
    header, entries = plans.load(tmp_path / "plan.json")
    assert (128, 64) in {(e.n, e.k) for e in entries}
    assert "near-ties the served decode step chose and confirmed: 1" in header["source"]
    # without a timed confirm step (--confirm-trials 0) the passes' one timing does not plan a near-tie
    data = json.loads((tmp_path / "results.json").read_text())
    untimed = {**data, "cells": [{**c, "decode": {**c["decode"], "confirm": {}}} for c in data["cells"]]}
    (tmp_path / "untimed.json").write_text(json.dumps(untimed))
    write_plan(tmp_path / "untimed.json", out=tmp_path / "plan.json")
    assert {(e.n, e.k) for e in plans.load(tmp_path / "plan.json")[1]} == {(64, 64)}
    # the same results without the run's floor (a run that admitted nothing under 1.05x): not planned
    data = json.loads((tmp_path / "results.json").read_text())
    del data["decode_min_speedup"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    write_plan(tmp_path / "results.json", out=tmp_path / "plan.json")
    assert {(e.n, e.k) for e in plans.load(tmp_path / "plan.json")[1]} == {(64, 64)}
    helps.clear()  # a1 ties cuBLAS in the step too
    planned = run(min_speedup=0.97)
    assert rows[0]["decode"]["chosen"] == "cublas" or rows[0]["decode"]["confirm"]["kept"] is False
    assert set(planned) == {(64, 64)}


def test_measure_cli_takes_a_positive_decode_floor_and_results_files_check_it(capsys, tmp_path):
    from skinny_gemm.aot import cli
    from skinny_gemm.aot.results import read_results

    with pytest.raises(SystemExit):
        cli.main(["tune", "measure", str(tmp_path), "--results", str(tmp_path / "r.json"), "--decode-min-speedup", "0"])
    assert "--decode-min-speedup: 0.0 is not a finite number > 0" in capsys.readouterr().err
    src = tmp_path / "results.json"
    base = {"arch": "sm_90a", "gpu": "g", "date": "2026-12-04", "method": "m", "cells": []}
    src.write_text(json.dumps({**base, "decode_min_speedup": 0.97}))
    assert read_results(src)["decode_min_speedup"] == 0.97
    src.write_text(json.dumps({**base, "decode_min_speedup": "0.97"}))
    with pytest.raises(ValueError, match=r"results.json: field 'decode_min_speedup' is .*must be a positive number"):
        read_results(src)
