"""The tuner's and the bench's CPU side: candidates, the plan it writes, the decode-step order, the report."""

import dataclasses
import json

import pytest
from helpers.fake_step import STEPS, cand, fake_step

from skinny_gemm.aot import candidates, decode_phase, plans
from skinny_gemm.aot.build import PACKAGE_ROOT
from skinny_gemm.aot.prepare import CELLS_FILE, prepare
from skinny_gemm.aot.report import geomean, markdown
from skinny_gemm.aot.results import MIN_SPEEDUP, isolated_winners, merge_results, results_files, write_plan
from skinny_gemm.aot.served import bench_served, load_peer, steps_build
from skinny_gemm.kernels.config import KernelConfig
from skinny_gemm.runtime import modelfile

# The committed H200 tuner results the sm_90a plan is derived from.
TUNING = PACKAGE_ROOT / "kernels" / "plans" / "tuning" / "sm_90a"

SHAPES = {
    "linears": {
        name: {"calls_per_step": calls, "tp": {"4": [n, k], "8": [n // 2, k]}}
        for name, calls, n, k in [
            ("kda_in_proj", 34, 6416, 4096),
            ("kda_f_b_proj", 34, 2048, 128),
            ("kda_g_b_proj", 34, 2048, 128),
            ("kda_o_proj", 34, 4096, 2048),
            ("mla_fused_qkv_a", 11, 2048, 4096),
            ("mla_q_b_proj", 11, 4096, 1536),
            ("indexer_wq_b", 11, 4096, 1536),
            ("indexer_wk", 11, 160, 4096),
            ("mla_o_proj", 11, 4096, 4096),
            ("lm_head", 1, 38720, 4096),
            ("shared_gate_up", 42, 1024, 4096),
            ("shared_down", 42, 4096, 512),
        ]
    },
    # The layer order is the committed GLM-5.3-Flash step (kernels/models/glm-5.3-flash.json).
    "step": json.loads((PACKAGE_ROOT / "kernels" / "models" / "glm-5.3-flash.json").read_text())["step"],
}
SEED_90A = [name for name in SHAPES["linears"] if not name.startswith("shared_")]


def test_candidates_are_valid_and_bounded():
    rows = [
        row
        for name in ("tune-sm_90a-h200-m12.json", "tune-sm_90a-h200-m34.json")
        for row in json.loads((TUNING / name).read_text())["cells"]
    ]
    counts = [len(candidates.candidates(row["n"], row["k"], row["m"])) for row in rows]
    assert len(counts) == 52 and 1 <= min(counts) and max(counts) <= candidates.max_candidates()
    for n, k, m in [(160, 4096, 1), (2048, 128, 4), (4096, 4096, 3), (38720, 4096, 2)]:
        cands = candidates.candidates(n, k, m)
        assert len(set(cands)) == len(cands)
        for cfg in cands:
            cfg.check(n=n, k=k)
            assert cfg.m == m
        kinds = {c.kind for c in cands}
        assert kinds - {"wgmma"} == {"simt", "mma"}, "bulk picks slow the whole decode step (~50 us on H200 TP8 M=4)"
        assert ("wgmma" in kinds) == (m >= 4), "the wgmma space starts at M = 4"
        assert any(c.groups > 1 and c.kind == "mma" for c in cands) == (m >= 2)
        assert any(c.split > 1 and c.kind == "mma" for c in cands) == (k >= 1024), (
            "cluster-split mma wherever K can be split"
        )


def test_slice_candidates_are_short_valid_ctas():
    """Sliced candidates: valid, every slice count the cell's M allows, at most SLICE_MAX_TRIPS trips, rows down to one."""
    for m, allowed in ((1, {2, 4, 8}), (2, {2, 4, 8}), (3, {2, 4}), (4, {2, 4})):
        found = candidates.slice_candidates(6416, 4096, m)
        assert {c.slices for c in found} == allowed
        for c in found:
            c.check(n=6416, k=4096)
            assert (
                4096 // c.k_step
                <= dict(next(s for s in candidates.spaces()["spaces"] if s["name"] == "slice")["rules"])["max_k_trips"]
                and c.m * c.slices <= 16
            )
        assert min(c.cols_per_cta for c in found) == 8 // max(allowed)
    assert candidates.slice_candidates(2048, 128, 1) == []  # K=128 is shorter than any sliced step


def test_persistent_grids_fit_at_once_on_the_h200():
    """A walk whose CTAs cannot all be resident would run in waves, which is what it exists to avoid."""
    cands = candidates.persist_candidates(6416, 4096, 1)
    assert cands and all(c.persist <= candidates.spaces()["sms"] * candidates.resident_ctas(c) for c in cands)
    assert all(6416 // c.cols_per_cta > c.persist for c in cands), "a cap that does not cap is a plain grid"
    heavy = dataclasses.replace(cands[0], cols=2, unroll=4)
    assert candidates.resident_ctas(heavy) < candidates.resident_ctas(dataclasses.replace(heavy, unroll=2))


def test_tune_cli_rejects_bad_requests_in_one_line(tmp_path, capsys):
    from skinny_gemm.aot import cli

    shapes = tmp_path / "shapes.json"
    seed = {"tp": [4, 8], "linears": sorted(SEED_90A), "planned_M": [1, 2, 3, 4]}
    shapes.write_text(json.dumps({**SHAPES, "seed_plan_sets": {"sm_90a": seed}}))
    assert cli.main(["tune", "prepare", "--shapes", str(shapes), "--out", str(tmp_path / "c"), "--m", "5"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "M=[5] is not in the sm_90a seed set" in err
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"arch": "sm_90a", "gpu": "g", "date": "d", "method": "m", "cells": []}))
    assert cli.main(["tune", "write", str(empty)]) == 2
    assert "no measured cells" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["tune", "measure", str(tmp_path), "--results", str(tmp_path / "r.json"), "--decode-passes", "0"])
    assert "--decode-passes: 0 is not >= 1" in capsys.readouterr().err


def test_committed_plan_is_the_tuners_output(tmp_path):
    """kernels/plans/sm_90a.json is exactly what `tune write` makes of the committed H200 results.

    The runs and their order are data (kernels/plans/tuning/sm_90a/runs.json, with what each
    run is); a later run's cells replace an earlier one's.
    """
    runs = results_files([], TUNING / "runs.json")
    out = tmp_path / "sm_90a.json"
    _path, planned, skipped = write_plan(runs, out=out)
    assert out.read_text() == plans.plan_path("sm_90a").read_text()
    _, entries = plans.load(out)
    assert planned == len(entries) and planned + skipped == len(merge_results(runs))
    files = [r[0] if isinstance(r, tuple) else r for r in runs]  # a run with "ms" is (file, its token counts)
    floors = {json.loads(f.read_text()).get("decode_min_speedup", MIN_SPEEDUP) for f in files}
    near_ties = 0
    for e in entries:
        assert e.provenance["kind"] == "measured" and e.provenance["gpu"] == "NVIDIA H200"
        if e.provenance["speedup"] < MIN_SPEEDUP:
            # a near-tie: planned only where its served step chose it, down to the lowest floor a run admitted
            assert e.provenance.get("chosen_in") == "decode step" and e.provenance["speedup"] >= min(floors)
            near_ties += 1
    header = json.loads(out.read_text())["header"]["source"]
    assert f"near-ties the served decode step chose and confirmed: {near_ties};" in header


def test_write_plan_keeps_only_cells_that_win(tmp_path):
    results = {
        "arch": "sm_90a",
        "gpu": "test GPU",
        "date": "2026-11-29",
        "method": "synthetic",
        "cells": [
            {
                "n": 4096,
                "k": 4096,
                "m": 1,
                "cublas_us": 10.0,
                "candidates": {
                    "a": {"config": candidates.candidates(4096, 4096, 1)[0].to_json(), "bad_elements": 0, "us": 9.9}
                },
            },
            {
                "n": 4096,
                "k": 4096,
                "m": 2,
                "cublas_us": 10.0,
                "candidates": {
                    "a": {"config": candidates.candidates(4096, 4096, 2)[0].to_json(), "bad_elements": 3, "us": 5.0}
                },
            },
            {
                "n": 4096,
                "k": 4096,
                "m": 3,
                "cublas_us": 10.0,
                "candidates": {
                    "a": {"config": candidates.candidates(4096, 4096, 3)[0].to_json(), "bad_elements": 0, "us": 8.0}
                },
            },
        ],
    }
    src = tmp_path / "results.json"
    src.write_text(json.dumps(results))
    _, planned, skipped = write_plan(src, out=tmp_path / "plan.json")
    assert (planned, skipped) == (1, 2)  # 1.01x is under 1.05x; a wrong result never wins
    _, entries = plans.load(tmp_path / "plan.json")
    assert [(e.m, e.provenance["speedup"]) for e in entries] == [(3, 1.25)]


def test_write_plan_merges_results_later_files_replace_cells(tmp_path):
    """Re-tuning one M (`tune prepare --m 1`) and writing both files: the later file's cells win, the rest stay."""
    cfg = lambda m: candidates.candidates(4096, 4096, m)[0].to_json()
    cell = lambda m, us: {
        "n": 4096,
        "k": 4096,
        "m": m,
        "cublas_us": 10.0,
        "candidates": {"a": {"config": cfg(m), "bad_elements": 0, "us": us}},
    }
    run = lambda date, cells: {"arch": "sm_90a", "gpu": "test GPU", "date": date, "method": "synthetic", "cells": cells}
    first, second = tmp_path / "all.json", tmp_path / "m1.json"
    first.write_text(json.dumps(run("2026-11-28", [cell(1, 8.0), cell(2, 9.0)])))
    second.write_text(json.dumps(run("2026-11-29", [cell(1, 5.0)])))
    _, planned, skipped = write_plan([first, second], out=tmp_path / "plan.json")
    assert (planned, skipped) == (2, 0)
    _header, entries = plans.load(tmp_path / "plan.json")
    assert [(e.m, e.provenance["plan_us"], e.provenance["date"]) for e in entries] == [
        (1, 5.0, "2026-11-29"),
        (2, 9.0, "2026-11-28"),
    ]
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**run("2026-11-29", [cell(1, 5.0)]), "arch": "sm_121"}))
    with pytest.raises(ValueError, match="sm_121"):
        write_plan([first, other], out=tmp_path / "plan.json")


def test_write_plan_prefers_the_decode_step_choice(tmp_path):
    cands = candidates.candidates(4096, 4096, 1)[:3]
    row = {
        "n": 4096,
        "k": 4096,
        "m": 1,
        "cublas_us": 10.0,
        "candidates": {
            c.name: {"config": c.to_json(), "bad_elements": 0, "us": us} for c, us in zip(cands, (8.0, 8.5, 9.9))
        },
    }
    for chosen, expect in ((cands[1].name, cands[1]), (cands[2].name, cands[0]), ("gone", cands[0])):
        # A decode-step pick wins only if it is itself a >= 1.05x isolated winner.
        src = tmp_path / "results.json"
        src.write_text(
            json.dumps(
                {
                    "arch": "sm_90a",
                    "gpu": "test GPU",
                    "date": "2026-11-29",
                    "method": "synthetic",
                    "cells": [{**row, "decode": {"chosen": chosen, "step_us": {}}}],
                }
            )
        )
        write_plan(src, out=tmp_path / "plan.json")
        _, (entry,) = plans.load(tmp_path / "plan.json")
        assert entry.config == expect
        assert (entry.provenance.get("chosen_in") == "decode step") == (expect.name == chosen)


def test_decode_phase_picks_the_lowest_step_time(monkeypatch):
    """The decode phase re-ranks winners by whole-step time (summed over TPs), not by their isolated time."""
    import torch

    # In the step, "a" (isolated fastest) costs more than "b"; "c" loses everywhere.
    step_cost = {"a": 5.0, "b": 2.0, "c": 9.0, "x": 1.0, "cublas": 100.0}
    lib = fake_step(monkeypatch, lambda names: sum(step_cost[name] for name in names))
    rows = [
        {"n": 64, "k": 32, "m": 1, "cublas_us": 10.0, "candidates": {"a": cand(5.0), "b": cand(6.0), "c": cand(7.0)}},
        {"n": 32, "k": 64, "m": 1, "cublas_us": 10.0, "candidates": {"x": cand(5.0), "slow": cand(9.9)}},
    ]
    decode_phase.decode_phase(lib, rows, STEPS, torch.device("cpu"), top=12, trials=1, progress=False)
    first = rows[0]["decode"]
    assert first["chosen"] == "b"
    # cuBLAS competes too (here it runs both (64, 32) calls of the TP4 step, 100 each)
    assert first["step_us"] == {"a": {"4": 11.0}, "b": {"4": 5.0}, "c": {"4": 19.0}, "cublas": {"4": 201.0}}
    # Its only other candidate is under 1.05x: its one winner is timed against cuBLAS alone.
    assert rows[1]["decode"]["chosen"] == "x" and set(rows[1]["decode"]["step_us"]) == {"x", "cublas"}
    # Without cuBLAS as a candidate a cell with one winner has nothing to re-rank.
    for row in rows:
        row.pop("decode")
    decode_phase.decode_phase(lib, rows, STEPS, torch.device("cpu"), top=12, trials=1, progress=False, cublas=False)
    assert set(rows[0]["decode"]["step_us"]) == {"a", "b", "c"} and "decode" not in rows[1]


def test_decode_phase_second_pass_revisits_earlier_cells(monkeypatch):
    """A cell picked while a later cell sat on its isolated choice is re-picked once that cell has moved."""
    import torch

    cost = {"a1": 3.0, "a2": 4.0, "y1": 3.0, "y2": 1.0, "cublas": 100.0}
    # a1 and y1 slow each other down in the same step (+5).
    lib = fake_step(
        monkeypatch, lambda names: sum(cost[n] for n in names) + (5.0 if {"a1", "y1"} <= set(names) else 0.0)
    )

    def run(passes):
        rows = [
            {"n": 64, "k": 32, "m": 1, "cublas_us": 10.0, "candidates": {"a1": cand(5.0), "a2": cand(6.0)}},
            {"n": 32, "k": 64, "m": 1, "cublas_us": 10.0, "candidates": {"y1": cand(5.0), "y2": cand(6.0)}},
        ]
        decode_phase.decode_phase(
            lib, rows, STEPS, torch.device("cpu"), top=12, trials=1, progress=False, passes=passes
        )
        return [r["decode"]["chosen"] for r in rows]

    # One pass: a1 is judged next to y1 (its isolated pick) and loses; y then moves to y2.
    assert run(1) == ["a2", "y2"]
    # The second pass judges a1 next to y2, where it is the faster.
    assert run(2) == ["a1", "y2"]


def test_decode_phase_swaps_out_a_family_that_slows_the_whole_step(monkeypatch):
    """Two cells on a family whose mere presence costs the step (as bulk did) leave it together."""
    import torch

    def kcand(us, kind):
        return {**cand(us), "config": {"kind": kind, "split": 1, "persist": 0}}

    cost = {"b1": 1.0, "m1": 2.0, "b2": 1.0, "m2": 2.0, "cublas": 100.0}
    # Any bulk launch in a step adds 10, however many: no single swap can remove it.
    lib = fake_step(
        monkeypatch, lambda names: sum(cost[n] for n in names) + (10.0 if {"b1", "b2"} & set(names) else 0.0)
    )
    rows = [
        {
            "n": 64,
            "k": 32,
            "m": 1,
            "cublas_us": 10.0,
            "candidates": {"b1": kcand(5.0, "bulk"), "m1": kcand(6.0, "mma")},
        },
        {
            "n": 32,
            "k": 64,
            "m": 1,
            "cublas_us": 10.0,
            "candidates": {"b2": kcand(5.0, "bulk"), "m2": kcand(6.0, "mma")},
        },
    ]
    # One step holding both cells: from either cell alone, bulk stays cheaper (12 against 13).
    steps = [{"tp": 4, "calls": [[64, 32], [32, 64]]}]
    decode_phase.decode_phase(lib, rows, steps, torch.device("cpu"), top=12, trials=1, progress=False, passes=2)
    assert [r["decode"]["chosen"] for r in rows] == ["m1", "m2"]
    check = rows[0]["decode"]["family_check"]
    assert check == {"family": "bulk", "swapped": True, "step_us": {"kept": {"4": 12.0}, "swapped": {"4": 4.0}}}
    assert rows[1]["decode"]["step_us"]["b2"] == {"4": 12.0}, "the passes alone kept bulk"
    assert decode_phase.family({"kind": "mma", "split": 2, "persist": 0}) == "mma+split"
    # the walks and the rings are families of their own
    assert decode_phase.family({"kind": "mma", "persist": 132}) == "mma+persist"
    assert decode_phase.family({"kind": "mma", "ring": True}) == "mma+ring"


def test_isolated_winners_rank_correct_fast_candidates():
    row = {
        "cublas_us": 10.0,
        "candidates": {
            "slow": {"bad_elements": 0, "us": 9.8},
            "fast": {"bad_elements": 0, "us": 7.0},
            "wrong": {"bad_elements": 1, "us": 1.0},
            "mid": {"bad_elements": 0, "us": 9.0},
            "untimed": {"bad_elements": 0, "us": None},
        },
    }
    assert isolated_winners(row) == ["fast", "mid"]


# a 4096x4096 M = 16 mma ring with PDL (the committed pick of 2026-12-04) and variants of it
RING = KernelConfig.from_json(
    {
        "kind": "mma",
        "m": 16,
        "threads": 256,
        "k_threads": 128,
        "cols": 16,
        "vec": 8,
        "unroll": 1,
        "static_k": 0,
        "pdl": True,
        "prefetch": False,
        "stages": 8,
        "early": False,
        "fetch": 128,
        "split": 1,
        "persist": 0,
        "slices": 1,
        "ring": True,
    }
)


def _twin_row():
    """A cell whose PDL winner's no-PDL twin is under the floor alone, beside candidates the step must not time."""
    a, b = RING, dataclasses.replace(RING, stages=4)
    a_twin = decode_phase.twin(a)
    other = dataclasses.replace(a_twin, stages=2)

    def timed(cfg, us, bad=0):
        return cfg.name, {"bad_elements": bad, "us": us, "config": cfg.to_json()}

    row = {
        "n": 4096,
        "k": 4096,
        "m": 16,
        "cublas_us": 14.0,
        "candidates": dict(
            [
                timed(a, 10.0),  # 1.40x
                timed(b, 11.0),  # 1.27x
                timed(a_twin, 13.6),  # 1.03x alone: under MIN_SPEEDUP, yet the PDL winner's twin
                timed(other, 13.5),  # 1.04x, without PDL, and no winner's twin
                timed(decode_phase.twin(b), 9.0, bad=2),  # b's twin, but wrong
            ]
        ),
    }
    assert MIN_SPEEDUP > 14.0 / 13.6 and a.pdl and not a_twin.pdl
    return row, a, b, a_twin, other


def test_the_step_times_a_winners_no_pdl_twin_whatever_its_alone_speedup():
    """The alone chain flatters PDL (docs/experiments/pdl_alone_bias.py), so a winner's no-PDL twin under the floor
    alone is still timed in the step beside it; candidates that are no winner's twin, or are wrong, are not."""
    row, a, b, a_twin, _ = _twin_row()
    assert decode_phase.entry_choices(row, top=2) == [a.name, b.name, a_twin.name]
    assert decode_phase.entry_choices(row, top=1) == [a.name, a_twin.name]
    # a PDL sibling of b under the floor (``early``: the same no-PDL twin) is flattered alone too: not timed
    sibling = dataclasses.replace(b, early=True)
    assert decode_phase.twin(sibling) == decode_phase.twin(b) and sibling.name != b.name
    row["candidates"][sibling.name] = {"bad_elements": 0, "us": 13.7, "config": sibling.to_json()}
    row["candidates"][decode_phase.twin(b).name]["bad_elements"] = 0  # b's twin now exact (and a winner: 1.56x)
    assert decode_phase.entry_choices(row, top=2) == [decode_phase.twin(b).name, a.name, b.name, a_twin.name]


@pytest.mark.parametrize("chosen", ["twin", "other"])
def test_tune_write_plans_a_confirmed_twin_under_the_floor(tmp_path, chosen):
    """A twin the step chose and the confirm step kept is planned, with its own (lower) alone speedup and
    `chosen_in`; a candidate under the floor that is no winner's twin is not: the cell takes the alone-fastest."""
    row, a, _, a_twin, other = _twin_row()
    pick = {"twin": a_twin, "other": other}[chosen]
    row["decode"] = {
        "chosen": pick.name,
        "step_us": {a.name: {"1": 1000.0}, pick.name: {"1": 990.0}, "cublas": {"1": 1010.0}},
        "confirm": {"kept": True, "step_us": {"decode": {"1": 990.0}, "alone": {"1": 1000.0}}},
    }
    src = tmp_path / "results.json"
    src.write_text(json.dumps({"arch": "sm_90a", "gpu": "g", "date": "d", "method": "m", "cells": [row]}))
    write_plan(src, out=tmp_path / "plan.json")
    header, (entry,) = plans.load(tmp_path / "plan.json")
    if chosen == "twin":
        assert entry.config == a_twin and entry.provenance["chosen_in"] == "decode step"
        assert entry.provenance["speedup"] == round(14.0 / 13.6, 3)
        assert "near-ties the served decode step chose and confirmed: 1" in header["source"]
    else:
        assert entry.config == a and "chosen_in" not in entry.provenance


def test_decode_steps_follow_the_seed_set(tmp_path):
    path = tmp_path / "shapes.json"
    path.write_text(
        json.dumps(
            {
                **SHAPES,
                "seed_plan_sets": {
                    "sm_90a": {"tp": [4, 8], "linears": SEED_90A, "planned_M": [1, 2, 3, 4]},
                    "sm_121": {"tp": 2, "linears": ["kda_in_proj", "shared_down"], "planned_M": [1, 2, 4]},
                },
            }
        )
    )
    steps = plans.decode_steps("sm_90a", path)
    assert sorted(steps) == [4, 8] and all(len(v) == 192 for v in steps.values())
    assert steps[8][0] == (3208, 4096) and steps[4][-1] == (38720, 4096)
    assert plans.decode_steps("sm_121", path) == {}, "the step is stated for TP 4 and 8, not the sm_121 set's TP 2"


def test_decode_order_is_one_step():
    for tp in (4, 8):
        order = plans.decode_order({**SHAPES, "seed_plan_sets": {"sm_90a": {"linears": SEED_90A}}}, tp)
        assert len(order) == 192
        counts = {}
        for name, _, _ in order:
            counts[name] = counts.get(name, 0) + 1
        assert counts == {name: v["calls_per_step"] for name, v in SHAPES["linears"].items() if name in SEED_90A}
        assert order[-1][0] == "lm_head"


def test_report_renders_the_committed_bench():
    data = json.loads((PACKAGE_ROOT / "docs" / "results" / "bench-h200.json").read_text())
    text = markdown(data)
    assert f"{len(data['entries'])} cells" in text and "| 128256 | 4096 | 4 |" in text
    # the same bench ran the served step and startup (one process: docs/perf.md)
    assert "Served decode step: GLM-5.3-Flash" in text and "Startup" in text and "| 8 | 16 |" in text
    assert abs(geomean([2.0, 8.0]) - 4.0) < 1e-12


def test_served_step_calls_put_the_ops_between_the_gemms():
    """The served step's launch list is the built step op by op: each GEMM where the step has it, ops between."""
    import torch
    from helpers.fake_step import HAND_MODEL

    from skinny_gemm.aot import measure as ms
    from skinny_gemm.aot import steps

    ops = steps.build(HAND_MODEL, 2, 2)
    data = ms.step_data(ops, 2, torch.device("cpu"))
    seen = []
    data.calls = {i: (lambda op=op: seen.append(op.kind)) for i, op in enumerate(ops) if not op.is_gemm}
    for call in ms.step_calls(data, lambda x, w, out, n, k: seen.append(("gemm", n, k))):
        call()
    assert seen == [("gemm", op.n, op.k) if op.is_gemm else op.kind for op in ops]
    seen.clear()
    for call in ms.step_calls(data, None):
        call()
    assert seen == [op.kind for op in ops if not op.is_gemm], "the ops alone: the same graph without projections"
    seen.clear()
    for call in ms.step_calls(data, lambda x, w, out, n, k: seen.append(("gemm", n, k)), with_ops=False):
        call()
    assert seen == [("gemm", op.n, op.k) for op in ops if op.is_gemm], "the bare chain"


def test_served_stand_ins_read_their_bytes_on_cpu():
    """Every stand-in runs (here on the CPU) and each read op reads a slice of exactly its rows of the arena."""
    import torch
    from helpers.fake_step import HAND_MODEL

    from skinny_gemm.aot import measure as ms
    from skinny_gemm.aot import steps

    ops = steps.build(HAND_MODEL, 2, 4)
    data = ms.step_data(ops, 4, torch.device("cpu"))
    for call in ms.step_calls(data, lambda x, w, out, n, k: torch.mm(x, w.T, out=out)):
        call()
    x, w, out = data.gemms[1]
    assert x.shape == (4, 64) and w.shape == (48, 64) and out.shape == (4, 48)


def _fake_bench(monkeypatch, planned):
    import skinny_gemm
    from skinny_gemm.aot import measure as ms

    def capture(calls):
        for call in calls:  # run the stand-ins: they must work on any device
            call()
        return len(calls)

    cost = {"ops": 10.0, "cublas+step": 30.0, "ours+step": 25.0, "cublas+bare": 20.0, "ours+bare": 10.0}
    monkeypatch.setattr(ms, "capture", capture)
    monkeypatch.setattr(ms, "time_graphs", lambda graphs, per, trials: {g: cost[g] for g in graphs})
    monkeypatch.setattr(skinny_gemm, "planned_ms", lambda n, k: planned)
    monkeypatch.setattr(skinny_gemm, "linear", lambda x, w: torch_mm(x, w))
    from skinny_gemm.runtime import ops

    monkeypatch.setattr(ops, "plan", lambda x, w: "a plan")


def torch_mm(x, w):
    return x @ w.T


def test_bench_served_reports_share_step_and_bare_and_no_plan(monkeypatch, tmp_path):
    import torch
    from helpers.fake_step import HAND_MODEL

    _fake_bench(monkeypatch, (1,))
    built = [(tp, m, steps_build(HAND_MODEL, tp, m)) for tp in (1, 2) for m in (1, 8)]
    rows = bench_served(HAND_MODEL, built, trials=1, progress=False, device=torch.device("cpu"))
    one = rows[0]
    assert (one["tp"], one["m"], one["planned_gemms"], one["gemms"]) == (1, 1, 3, 3)
    assert one["share_us"] == {"cublas": 20.0, "ours": 15.0}
    assert one["speedup"] == {"step": {"ours": 1.2}, "share": {"ours": 20.0 / 15.0}, "bare": {"ours": 2.0}}
    eight = rows[1]
    assert eight["ours"] == "no plan" and "ours+step" not in eight["us"], "an M without plans is not timed as ours"
    text = markdown(
        {
            "date": "d",
            "command": "c",
            "served": rows,
            "served_about": {"model": "hand", "file": "hand.json", "about": "two handmade layers"},
        }
    )
    assert "Served decode step: hand (hand.json)" in text and "Step: two handmade layers" in text
    assert "| 1 | 8 | 0/3 |" in text and "no plan" in text and "1.33x" in text and "Bare chain" in text


def test_bench_stops_on_a_bad_step_file_before_the_gpu(tmp_path, capsys):
    from skinny_gemm.aot import cli

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"linears": {}, "step": {"about": "x", "tp": [1], "sequence": [{"op": "gemm"}]}}))
    assert cli.main(["bench", "--sections", "decode", "--model", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{bad}: step.sequence[0]: unknown op 'gemm'" in err
    assert not (tmp_path / "o").exists()


def test_a_missing_peer_folder_skips_the_peer_in_one_line(tmp_path, capsys):
    assert load_peer(tmp_path / "nothing") is None
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("bench: peer section skipped: no peer artifacts in")


def test_no_pdl_twins_are_valid_new_configs():
    cands = candidates.candidates(4096, 4096, 1)
    twins = decode_phase.no_pdl_twins(cands, 4096, 4096)
    assert twins and not set(twins) & set(cands) and len(set(twins)) == len(twins)
    for t in twins:
        t.check(n=4096, k=4096)
        assert not t.pdl and not t.early and not t.persist
    assert any(c.persist for c in cands), "persistent candidates have twins too: the plain grid"
    assert decode_phase.no_pdl_twins(twins, 4096, 4096) == [], "a twin is its own twin"


def test_served_steps_hold_the_ops_between_the_gemms():

    path = modelfile.MODELS_DIR / "glm-5.3-flash.json"
    served = decode_phase.served_steps("sm_90a", path, [1, 4])
    assert [s["tp"] for s in served] == [4, 8]
    for entry in served:
        assert [tuple(c) for c in entry["calls"]] == plans.decode_steps("sm_90a", path)[entry["tp"]]
        for m in ("1", "4"):
            ops = entry["step"][m]
            assert [op[1:] for op in ops if isinstance(op, list)] == entry["calls"]
            assert len(ops) == 657 and not isinstance(ops[0], list), "the step starts with a norm, not a GEMM"

        def moe(m, entry=entry):
            return [op["bytes"] for op in entry["step"][m] if isinstance(op, dict) and op["op"] == "moe"]

        assert moe("4")[-1] == 4 * moe("1")[-1], "4 tokens read 4 x 8 of the 128 experts"


def test_decode_phase_times_pdl_on_and_off_in_every_cell(monkeypatch):
    """After a norm as after a GEMM, a cell's PDL-on candidates and their no-PDL twins all compete in the step."""
    import torch

    from skinny_gemm.kernels.config import KernelConfig

    on = KernelConfig(m=1, kind="simt", threads=64, k_threads=32, cols=1, unroll=1)
    fast_on = KernelConfig(m=1, kind="simt", threads=64, k_threads=16, cols=1, unroll=1)
    off, fast_off = decode_phase.twin(on), decode_phase.twin(fast_on)

    def cands():
        return {
            c.name: {"config": c.to_json(), "bad_elements": 0, "us": us}
            for c, us in ((fast_on, 4.0), (on, 5.0), (fast_off, 6.0), (off, 7.0))
        }

    # Step cost by launch position: after the norm PDL-on is the faster, after the GEMM its no-PDL twin.
    first = {fast_on.name: 2.0, on.name: 3.5, fast_off.name: 3.0, off.name: 2.5, "cublas": 100.0}
    second = {fast_on.name: 3.0, on.name: 3.5, fast_off.name: 1.0, off.name: 2.5, "cublas": 100.0}
    lib = fake_step(monkeypatch, lambda names: first[names[0]] + second[names[1]])
    rows = [
        {"n": 64, "k": 32, "m": 1, "cublas_us": 10.0, "candidates": cands()},
        {"n": 32, "k": 64, "m": 1, "cublas_us": 10.0, "candidates": cands()},
    ]
    step = {
        "tp": 4,
        "calls": [[64, 32], [32, 64]],
        "step": {
            "1": [
                {"op": "rms_norm", "size": 8, "bytes": 16},
                ["gemm", 64, 32],
                ["gemm", 32, 64],
                {"op": "moe", "size": 0, "bytes": 4096},
            ]
        },
    }
    decode_phase.decode_phase(lib, rows, [step], torch.device("cpu"), top=12, trials=1, progress=False)
    after_op, after_gemm = rows[0]["decode"], rows[1]["decode"]
    every = {fast_on.name, on.name, fast_off.name, off.name, "cublas"}
    assert set(after_op["step_us"]) == every and set(after_gemm["step_us"]) == every
    assert after_op["chosen"] == fast_on.name and after_gemm["chosen"] == fast_off.name
    assert lib.launched, "our kernels ran inside the served step's graph"


class FakePeer:
    """A loaded peer that runs only (48, 64) and records its launches."""

    version = "0.32.0"

    def __init__(self):
        self.launched = []

    def variant_for(self, n, k, m, pdl):
        return f"v{'_pdl' if pdl else ''}" if (n, k) == (48, 64) else None

    def launch(self, vid, a, b, c, n, k):
        self.launched.append((vid, n, k))


def test_bench_served_runs_the_peer_pdl_off_and_on_where_it_has_a_variant(monkeypatch):
    import torch
    from helpers.fake_step import HAND_MODEL

    _fake_bench(monkeypatch, (1,))
    from skinny_gemm.aot import measure as ms

    cost = {
        "ops": 10.0,
        "cublas+step": 30.0,
        "ours+step": 25.0,
        "cublas+bare": 20.0,
        "ours+bare": 10.0,
        "peer+step": 28.0,
        "peer+bare": 18.0,
        "peer_pdl+step": 29.0,
        "peer_pdl+bare": 17.0,
    }
    monkeypatch.setattr(ms, "time_graphs", lambda graphs, per, trials: {g: cost[g] for g in graphs})
    fake = FakePeer()
    (row,) = bench_served(
        HAND_MODEL,
        [(2, 1, steps_build(HAND_MODEL, 2, 1))],
        trials=1,
        progress=False,
        peer_lib=fake,
        device=torch.device("cpu"),
    )
    # Two qkv calls per graph, in the step and the bare chain, PDL off then on; the head stays on cuBLAS.
    assert fake.launched == [("v", 48, 64)] * 4 + [("v_pdl", 48, 64)] * 4
    assert row["peer_gemms"] == 2 and row["speedup"]["share"]["peer"] == 20.0 / 18.0
    text = markdown({"date": "d", "command": "c", "served": [row], "served_about": {"peer_version": "0.32.0"}})
    assert "peer share speedup (pdl off / on)" in text and "1.11x / 1.05x" in text


def test_prepare_writes_the_served_step_and_the_no_pdl_twins(monkeypatch, tmp_path):
    """`tune prepare` on the GLM model file: cells.json holds each TP's served step per M, candidates their twins."""
    from skinny_gemm.aot import build

    compiled = {}

    def fake_build(arch, configs, mapping, out_dir, plan_file, jobs=None):
        compiled["configs"] = set(configs)

    monkeypatch.setattr(build, "build_configs", fake_build)
    monkeypatch.setattr(build, "main_summary", lambda result: "built")
    model = modelfile.MODELS_DIR / "glm-5.3-flash.json"
    line = prepare("sm_90a", model, tmp_path, ms=[2])
    spec = json.loads((tmp_path / CELLS_FILE).read_text())
    assert "no decode phase" not in line and [d["tp"] for d in spec["decode"]] == [4, 8]
    assert set(spec["decode"][0]["step"]) == {"2"} and len(spec["decode"][0]["step"]["2"]) == 657
    row = next(r for r in spec["cells"] if (r["n"], r["k"]) == (4096, 4096))
    cands = [KernelConfig.from_json(c) for c in row["candidates"]]
    base = candidates.candidates(4096, 4096, 2)
    assert cands[: len(base)] == base and cands[len(base) :] == decode_phase.no_pdl_twins(base, 4096, 4096)
    assert set(cands) <= compiled["configs"]
    # Without twins, or for a model file without a step: the candidates alone.
    prepare("sm_90a", model, tmp_path / "plain", ms=[2], twins=False)
    plain = json.loads((tmp_path / "plain" / CELLS_FILE).read_text())
    assert len(next(r for r in plain["cells"] if (r["n"], r["k"]) == (4096, 4096))["candidates"]) == len(base)


def test_bench_served_refuses_to_time_a_planned_cell_that_would_fall_back(monkeypatch):
    import torch
    from helpers.fake_step import HAND_MODEL

    from skinny_gemm.runtime import ops

    _fake_bench(monkeypatch, (1,))
    monkeypatch.setattr(ops, "plan", lambda x, w: None)
    with pytest.raises(SystemExit, match=r"\(96, 64, 1\) is planned but would not dispatch"):
        bench_served(
            HAND_MODEL, [(1, 1, steps_build(HAND_MODEL, 1, 1))], trials=1, progress=False, device=torch.device("cpu")
        )


def test_prepare_tunes_m8_beyond_the_seed_sets_token_counts(monkeypatch, tmp_path):
    """M=8 (a vLLM graph size the kernels run) on the seed set's shapes, with its served step."""
    from skinny_gemm.aot import build

    monkeypatch.setattr(build, "build_configs", lambda arch, configs, *a, **kw: None)
    monkeypatch.setattr(build, "main_summary", lambda result: "built")
    prepare("sm_90a", modelfile.MODELS_DIR / "glm-5.3-flash.json", tmp_path, ms=[4, 8], twins=False)
    spec = json.loads((tmp_path / CELLS_FILE).read_text())
    assert {r["m"] for r in spec["cells"]} == {4, 8} and len(spec["cells"]) == 26
    assert set(spec["decode"][0]["step"]) == {"4", "8"}
    assert all(r["candidates"] for r in spec["cells"])


def test_a_read_cap_shortens_the_stand_ins_only():
    import torch
    from helpers.fake_step import HAND_MODEL

    from skinny_gemm.aot import measure as ms
    from skinny_gemm.aot import steps

    ops = steps.build(HAND_MODEL, 1, 16)
    full, capped = ms.step_data(ops, 16, torch.device("cpu")), ms.step_data(ops, 16, torch.device("cpu"), read_cap=4096)
    assert [op.kind for op in capped.ops] == [op.kind for op in ops], "every op stays, in order"
    assert [op.bytes for op in capped.ops if op.kind == "attention"] == [4096, 4096]
    assert [op.bytes for op in full.ops if op.kind == "attention"] == [16 * 10 * 40] * 2
    assert [op.bytes for op in capped.ops if op.kind == "add_rms_norm"] == [
        op.bytes for op in ops if op.kind == "add_rms_norm"
    ]
