"""Candidate spaces as data (kernels/candidates.json): valid configs, the same sets the H200 runs timed, one filter."""

import dataclasses
import json

import pytest

from skinny_gemm.aot import candidates
from skinny_gemm.aot.build import PACKAGE_ROOT
from skinny_gemm.aot.prepare import cell_rows
from skinny_gemm.kernels.config import KernelConfig

TUNING = PACKAGE_ROOT / "kernels" / "plans" / "tuning" / "sm_90a"


@pytest.mark.parametrize("run", ["tune-sm_90a-h200-m1.json", "tune-sm_90a-h200-m2.json", "tune-sm_90a-h200-m4.json"])
def test_the_spaces_give_exactly_what_the_latest_h200_runs_timed(run):
    """The runs made with today's candidate generator (the wider sliced tiles): each cell's set is the same
    (the "wgmma" space came after these runs: its configs are left out)."""
    for row in json.loads((TUNING / run).read_text())["cells"]:
        found = [c for c in candidates.candidates(row["n"], row["k"], row["m"]) if c.kind != "wgmma"]
        assert {c.name for c in found} == set(row["candidates"]), (row["n"], row["k"], row["m"])
        timed = {name: KernelConfig.from_json(c["config"]) for name, c in row["candidates"].items()}
        assert {c.name: c for c in found} == timed


@pytest.mark.parametrize(
    "n, k, m", [(160, 4096, 1), (2048, 128, 4), (3336, 4096, 3), (4096, 14336, 2), (8192, 3584, 8), (128256, 4096, 1)]
)
def test_every_candidate_is_valid_for_its_cell(n, k, m):
    found = candidates.candidates(n, k, m)
    assert found and len(set(found)) == len(found)
    for cfg in found:
        cfg.check(n=n, k=k)
        assert cfg.m == m and cfg.kind in ("simt", "mma", "wgmma")


def test_when_ranges_pick_values_per_cell():
    simt = lambda n, k, m: candidates.space_candidates("simt", n, k, m)  # noqa: E731
    assert {c.threads for c in simt(4096, 4096, 1)} == {128, 256, 512}
    assert {c.threads for c in simt(4096, 4096, 2)} == {256}, "128/512-thread SIMT CTAs only at M=1"
    assert {c.unroll for c in simt(4096, 4096, 1)} == {2, 4}
    assert {c.unroll for c in simt(4096, 1536, 1)} == {2}
    assert {c.unroll for c in simt(2048, 128, 1)} == {1}
    assert candidates.space_candidates("group", 4096, 4096, 1) == [], "row groups only from M=2"
    assert candidates.space_candidates("persist", 4096, 4096, 3) == [], "persistent walks only up to M=2"
    assert all(c.threads <= 512 for c in candidates.space_candidates("group", 4096, 4096, 4))


def test_the_one_filter_applies_the_named_rules():
    cfg = KernelConfig(
        m=1, kind="simt", threads=256, k_threads=256, cols=1, unroll=2, prefetch=False, early=True, persist=528
    )
    assert candidates.admissible(cfg, 6416, 4096, [["persist_caps_grid", True]])
    assert not candidates.admissible(cfg, 256, 4096, [["persist_caps_grid", True]]), "a cap that does not cap"
    assert not candidates.admissible(cfg, 6416, 4095), "the config check comes first"
    wide = KernelConfig(m=1, kind="mma", threads=1024, k_threads=256, cols=8, unroll=1, prefetch=False, stages=2)
    assert candidates.admissible(wide, 4096, 4096) and not candidates.admissible(
        wide, 4096, 4096, [["max_threads", 512]]
    )


def test_a_malformed_space_file_is_refused_naming_space_and_field(tmp_path):
    data = json.loads(candidates.SPACES_FILE.read_text())
    data["spaces"][0]["axes"].append(["warp_count", [1]])
    path = tmp_path / "candidates.json"
    path.write_text(json.dumps(data))
    with pytest.raises(candidates.CandidateError, match=r"space 'mma': unknown config fields \['warp_count'\]"):
        candidates.spaces(path)
    data["spaces"][0]["axes"].pop()
    data["spaces"][0]["rules"] = [["fastest_only", 1]]
    path.write_text(json.dumps(data))
    with pytest.raises(candidates.CandidateError, match="unknown rule 'fastest_only'"):
        candidates.spaces(path)


def test_cell_rows_report_cells_without_candidates():
    rows, skipped = cell_rows([(4096, 4096, 1), (4096, 4095, 1), (1280, 8192, 1, True)])
    planned = {(r["n"], r["k"], r["m"]): r for r in rows}
    assert (4096, 4096, 1) in planned and (4096, 4095, 1) not in planned
    assert "no candidate passes" in skipped[(4096, 4095, 1)] and "rule 'k" in skipped[(4096, 4095, 1)]
    if "bias" not in candidates.CONFIG_FIELDS:
        assert skipped[(1280, 8192, 1)].startswith("bias")
    else:
        assert all(c["bias"] for c in planned[(1280, 8192, 1)]["candidates"]), "a biased cell's candidates add it"
        assert not any(c.get("bias") for c in planned[(4096, 4096, 1)]["candidates"]), "to_json leaves an off bias out"


def test_the_cost_model_cut_keeps_the_best_and_each_family():
    rows, _ = cell_rows([(6416, 4096, 1)], top=8, per_family=2)
    (row,) = rows
    cut = [KernelConfig.from_json(c) for c in row["candidates"]]
    full = candidates.candidates(6416, 4096, 1)
    assert set(cut) < set(full) and 8 <= len(cut) <= 8 + 2 * 5
    from skinny_gemm.aot.costmodel import family

    assert {family(c) for c in cut} == {family(c) for c in full}


def test_cell_rows_extend_hook_runs_after_the_cut():
    """The decode phase's no-PDL twins (or any other addition) are timed on top of the cost-model cut."""
    import dataclasses

    twins = lambda cands, n, k: cands + [dataclasses.replace(c, pdl=False) for c in cands[:2]]  # noqa: E731
    (cut,), _ = cell_rows([(4096, 4096, 2)], top=4, per_family=0)
    (row,), _ = cell_rows([(4096, 4096, 2)], top=4, per_family=0, extend=twins)
    assert row["candidates"][: len(cut["candidates"])] == cut["candidates"]
    assert len(row["candidates"]) == len(cut["candidates"]) + 2
    assert [c["pdl"] for c in row["candidates"]].count(False) == 2


def test_the_wgmma_and_ring_spaces_are_sm_90a_only_and_a_family_the_model_never_saw_is_timed_whole():
    """Kind "wgmma" compiles for sm_90a alone, and the mma ring was measured there alone. The committed cost
    model has timings of both (the 2026-12-03 ring runs timed the wgmma probe configs too), so both are cut
    like the others; a model fitted without a family keeps every candidate of it."""
    import copy

    from skinny_gemm.aot import costmodel

    wg = candidates.space_candidates("wgmma", 4096, 4096, 8)
    ring = candidates.space_candidates("ring", 4096, 4096, 8)
    assert wg and all(c.kind == "wgmma" for c in wg)
    assert ring and all(c.kind == "mma" and c.ring for c in ring)
    every = candidates.candidates(4096, 4096, 8)
    assert set(wg) | set(ring) <= set(every)
    assert not any(c.kind == "wgmma" or c.ring for c in candidates.candidates(4096, 4096, 8, arch="sm_121"))
    assert not candidates.space_candidates("ring", 4096, 4096, 4)  # from M = 8
    model = costmodel.load()
    assert {"wgmma", "mma+ring"} <= set(model["fit"]["families"])
    # every family of the spaces has timings (the walk's since 2026-12-03), so all are cut to 4
    walk = candidates.space_candidates("walk", 4096, 4096, 8)
    assert walk and all(c.walk for c in walk) and "mma+walk" in model["fit"]["families"]
    assert len(costmodel.select(model, every, 4096, 4096, top=4, per_family=0)) == 4
    for fam, space in (("wgmma", wg), ("mma+ring", ring), ("mma+walk", walk)):
        unseen = copy.deepcopy(model)
        del unseen["fit"]["families"][fam]
        cut = costmodel.select(unseen, every, 4096, 4096, top=4, per_family=0)
        assert set(space) <= set(cut) and len(cut) <= 4 + len(space)


def test_tune_prepare_model_writes_the_cut_cells_and_builds_them(tmp_path, capsys):
    from skinny_gemm.aot import cli, models
    from skinny_gemm.runtime.manifest import parse

    out = tmp_path / "cand"
    argv = [
        "tune",
        "prepare",
        "--model",
        "llama-3.1-8b",
        "--tp",
        "8",
        "--m",
        "1",
        "--top",
        "2",
        "--per-family",
        "0",
        "--out",
        str(out),
        "--jobs",
        "2",
    ]
    assert cli.main(argv) == 0
    # The model's served step at TP 8 gives the decode phase: the 2 cut candidates and their no-PDL twins.
    assert capsys.readouterr().out.startswith("5 cells, 25 timings with cuBLAS")
    spec = json.loads((out / "cells.json").read_text())
    assert {(r["n"], r["k"]) for r in spec["cells"]} == set(models.shapes(models.load("llama-3.1-8b"), 8))
    assert all(len(r["candidates"]) == 4 and r["m"] == 1 for r in spec["cells"])
    assert [d["tp"] for d in spec["decode"]] == [8] and set(spec["decode"][0]["step"]) == {"1"}
    man = parse(out / "sm_90a" / "manifest.json", expected_arch="sm_90a")
    assert set(man.variants) == {KernelConfig.from_json(c).name for r in spec["cells"] for c in r["candidates"]}
    assert cli.main(["tune", "prepare", "--model", "llama-3.1-70b", "--tp", "1", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no shapes at TP 1" in err


@pytest.mark.parametrize("model", ["llama-3.1-8b", "qwen3-8b", "mistral-small-24b"])
def test_the_spaces_hold_the_sliced_m8_winners(model):
    """What the 2026-12-03 sliced sweeps chose inside the served step (a no-PDL pick through its PDL config, whose twin
    `tune prepare` adds) is a candidate of its cell: long-K cells need the slice-long space (CTAs of 5-32 K trips)."""
    rows = json.loads((TUNING / f"tune-sm_90a-h200-{model}-tp1-sliced.json").read_text())["cells"]
    checked = 0
    for row in rows:
        decode = row.get("decode", {})
        for name in {decode.get("chosen"), decode.get("passes_chosen")} & set(row["candidates"]):
            cfg = KernelConfig.from_json(row["candidates"][name]["config"])
            if row["m"] != 8 or cfg.slices == 1:
                continue
            space = {c.name for c in candidates.candidates(row["n"], row["k"], 8)}
            assert dataclasses.replace(cfg, pdl=True).name in space, (row["n"], row["k"], name)
            checked += 1
    assert checked >= 3
    long_k = candidates.space_candidates("slice-long", 4096, 14336, 2)
    assert long_k and all(5 <= 14336 // c.k_step <= 32 for c in long_k)
    assert not set(long_k) & set(candidates.space_candidates("slice", 4096, 14336, 2))
    assert candidates.space_candidates("slice-long", 28672, 4096, 8) == [], "K = 4096 winners had at most 4 trips"
