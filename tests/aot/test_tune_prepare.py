"""`tune prepare` on the CPU: candidates from plan tables, no decode steps, a catalogue model's served step."""

import dataclasses
import json

import pytest

from skinny_gemm.aot import build, candidates, cli, decode_phase, plans, steps
from skinny_gemm.aot.prepare import CELLS_FILE, prepare
from skinny_gemm.kernels.config import KernelConfig
from skinny_gemm.runtime import modelfile

GLM = modelfile.MODELS_DIR / "glm-5.3-flash.json"
# the H200's sliced M = 8 run of Llama-3.1-8B (2026-12-03): real tuner results for --from-results
LLAMA_SLICED = (
    build.PACKAGE_ROOT / "kernels" / "plans" / "tuning" / "sm_90a" / "tune-sm_90a-h200-llama-3.1-8b-tp1-sliced.json"
)


@pytest.fixture
def compiled(monkeypatch):
    """No compiler: record the configs prepare would build."""
    found = {}

    def fake_build(arch, configs, mapping, out_dir, plan_file, jobs=None):
        found["configs"] = set(configs)

    monkeypatch.setattr(build, "build_configs", fake_build)
    monkeypatch.setattr(build, "main_summary", lambda result: "built")
    return found


def _spec(out):
    return json.loads((out / CELLS_FILE).read_text())


def _flip_pdl(cfg):
    """Another valid config of the same cell: PDL flipped (``early`` and ``persist`` need PDL)."""
    return dataclasses.replace(cfg, pdl=not cfg.pdl, early=False, persist=0)


def _plans(tmp_path):
    """Two plan tables over GLM's M=8 cells: A holds all but one shape, B A's configs with PDL flipped and a copy of one."""
    header, entries = plans.load(plans.plan_path("sm_90a"))
    glm = {(n, k) for n, k, _ in plans.seed_shapes("sm_90a", GLM)}  # prepare's cells: the seed set's shapes
    at8 = [e for e in entries if e.m == 8 and (e.n, e.k) in glm]
    assert len(at8) >= 3, "the committed plan has M=8 entries"
    left_out = (at8[0].n, at8[0].k)
    a = [e for e in at8 if (e.n, e.k) != left_out]
    b = [dataclasses.replace(e, config=_flip_pdl(e.config)) for e in a[1:]] + [a[0]]
    paths = []
    for name, rows in (("a.json", a), ("b.json", b)):
        path = tmp_path / name
        path.write_text(plans.render(header, rows))
        paths.append(path)
    return paths, a, b, left_out


def test_from_plans_takes_exactly_the_plans_configs(compiled, tmp_path):
    (pa, pb), a, b, left_out = _plans(tmp_path)
    line = prepare("sm_90a", GLM, tmp_path / "out", ms=[8], from_plans=[pa, pb], decode=False)
    spec = _spec(tmp_path / "out")
    assert spec["decode"] == [] and "no decode phase (--no-decode)" in line
    want = {}
    for e in a + b:
        have = want.setdefault((e.n, e.k, e.m), [])
        if e.config.to_json() not in have:
            have.append(e.config.to_json())
    got = {(r["n"], r["k"], r["m"]): r["candidates"] for r in spec["cells"]}
    assert got == want, "per cell the plans' distinct configs, in their order: no cut, no twins"
    assert len(got[(a[0].n, a[0].k, 8)]) == 1, "a config both tables hold is one candidate"
    assert all(len(v) == 2 for key, v in got.items() if key != (a[0].n, a[0].k, 8))
    assert compiled["configs"] == {e.config for e in a + b}
    assert f"no candidates {left_out} m=8: no plan table or results file given holds it" in line
    assert (*left_out, 8) not in got


@pytest.mark.parametrize("twins", [True, False])
def test_from_plans_on_the_cli_with_the_served_step(compiled, tmp_path, capsys, twins):
    """Without --no-decode the served step is kept, and the plans' configs get their no-PDL twins (the decode phase
    picks PDL or not per cell: the alone chain flatters PDL); --no-pdl-twins leaves them out."""
    (pa, pb), a, b, _ = _plans(tmp_path)
    out = tmp_path / "out"
    args = ["tune", "prepare", "--arch", "sm_90a", "--shapes", str(GLM), "--m", "8"]
    args += ["--from-plans", str(pa), str(pb), "--out", str(out)] + ([] if twins else ["--no-pdl-twins"])
    assert cli.main(args) == 0
    spec = _spec(out)
    assert [d["tp"] for d in spec["decode"]] == [4, 8] and set(spec["decode"][0]["step"]) == {"8"}
    held: dict = {}
    for e in a + b:
        have = held.setdefault((e.n, e.k, e.m), [])
        if e.config not in have:
            have.append(e.config)
    got = {(r["n"], r["k"], r["m"]): [KernelConfig.from_json(c) for c in r["candidates"]] for r in spec["cells"]}
    want = {
        key: cfgs + (decode_phase.no_pdl_twins(cfgs, key[0], key[1]) if twins else []) for key, cfgs in held.items()
    }
    assert got == want
    if twins:
        assert sum(map(len, got.values())) > sum(map(len, held.values())), "some plan config had no twin held"


def test_from_plans_refuses_a_cut_and_another_archs_table(compiled, tmp_path, capsys):
    (pa, _), *_ = _plans(tmp_path)
    args = ["tune", "prepare", "--shapes", str(GLM), "--m", "8", "--out", str(tmp_path / "o")]
    assert cli.main([*args, "--from-plans", str(pa), "--top", "4"]) == 2
    assert "--top does not apply" in capsys.readouterr().err
    assert cli.main([*args, "--from-plans", str(plans.plan_path("sm_121"))]) == 2
    err = capsys.readouterr().err
    assert "a plan table for sm_121, not sm_90a" in err and err.count("\n") == 1


def test_no_decode_writes_no_steps_and_no_twins(compiled, tmp_path):
    line = prepare("sm_90a", GLM, tmp_path, ms=[2], decode=False)
    spec = _spec(tmp_path)
    assert spec["decode"] == [] and "no decode phase (--no-decode): the cells are timed alone" in line
    row = next(r for r in spec["cells"] if (r["n"], r["k"]) == (4096, 4096))
    assert row["candidates"] == [c.to_json() for c in candidates.candidates(4096, 4096, 2)]
    # Control: the same request with the decode phase has its steps and twins.
    prepare("sm_90a", GLM, tmp_path / "with", ms=[2])
    with_step = _spec(tmp_path / "with")
    assert with_step["decode"] and len(with_step["cells"][0]["candidates"]) > len(spec["cells"][0]["candidates"])


def test_a_catalogue_model_gets_its_served_step_at_every_asked_tp(compiled, tmp_path):
    line = prepare("sm_90a", None, tmp_path, ms=[1, 8], model="llama-3.1-8b", tps=[1, 8])
    spec = _spec(tmp_path)
    assert "no decode phase" not in line
    assert [d["tp"] for d in spec["decode"]] == [1, 8]
    model = steps.load("llama-3.1-8b")
    cell_shapes = {(r["n"], r["k"]) for r in spec["cells"]}
    for entry in spec["decode"]:
        assert set(entry["step"]) == {"1", "8"}
        built = steps.build(model, entry["tp"], 8)
        assert entry["step"]["8"] == steps.to_json(built)
        assert entry["calls"] == [[n, k] for _, n, k in steps.gemm_calls(built)]
        assert {tuple(c) for c in entry["calls"]} <= cell_shapes, "every GEMM of a dense BF16 step is a cell"
        assert len(entry["calls"]) == 32 * 4 + 1
    row = next(r for r in spec["cells"] if (r["n"], r["k"], r["m"]) == (4096, 4096, 1))
    base = candidates.candidates(4096, 4096, 1)
    cands = [KernelConfig.from_json(c) for c in row["candidates"]]
    assert cands == base + decode_phase.no_pdl_twins(base, 4096, 4096), "twins as for the seed set"


def test_a_catalogue_model_without_a_step_keeps_no_decode_phase(compiled, tmp_path):
    line = prepare("sm_90a", None, tmp_path, ms=[1], model="qwen3-30b-a3b", tps=[2])
    spec = _spec(tmp_path)
    assert spec["decode"] == [] and "no decode phase (qwen3-30b-a3b has no served step)" in line
    row = spec["cells"][0]
    assert len(row["candidates"]) == len(candidates.candidates(row["n"], row["k"], 1)), "no twins without a step"
    line = prepare("sm_90a", None, tmp_path / "all", ms=[1], every=True, tps=[8], top=2)
    assert _spec(tmp_path / "all")["decode"] == [] and "no decode phase (--all" in line


def test_a_tp_the_step_does_not_state_has_no_decode_entry(tmp_path):
    from helpers.fake_step import HAND_MODEL

    path = tmp_path / "hand.json"
    path.write_text(json.dumps(HAND_MODEL))
    entries, note = decode_phase.model_steps("sm_90a", str(path), [1, 2, 4], [1, 2])
    assert [e["tp"] for e in entries] == [1, 2]
    assert note == "no decode phase at TP [4] (hand.json's step is stated for TP [1, 2])".replace(
        "hand.json", str(path)
    )
    assert entries[1]["calls"] == [[48, 64], [48, 64], [250, 64]], "the down linear is FP8: a read, not a GEMM"
    assert decode_phase.model_steps("sm_90a", str(path), [2], [1])[1] == ""


def test_a_catalogue_step_runs_the_models_bf16_linears_as_gemms():
    """GLM as a catalogue model: its BF16 linears (the seed set's; the shared experts are FP8) are its step's GEMMs."""
    from skinny_gemm.aot import models

    (entry,), note = decode_phase.model_steps("sm_90a", "glm-5.3-flash", [4], [1])
    (seed, _) = decode_phase.served_steps("sm_90a", GLM, [1])
    assert note == "" and entry == seed
    assert {tuple(c) for c in entry["calls"]} == set(models.shapes(models.load("glm-5.3-flash"), 4))


def test_from_results_adds_each_cells_fastest_exact_candidates(compiled, tmp_path):
    """--from-results: per cell the --best fastest candidates with no bad element, beside the plans' configs."""
    data = json.loads(LLAMA_SLICED.read_text())
    row = next(r for r in data["cells"] if (r["n"], r["k"], r["m"]) == (28672, 4096, 8))
    _, entries = plans.load(plans.plan_path("sm_90a"))
    planned = next(e.config for e in entries if (e.n, e.k, e.m) == (28672, 4096, 8))
    ranked = sorted(row["candidates"], key=lambda nm: row["candidates"][nm]["us"])
    # the fastest candidate other than the plan's made wrong: it must not be taken (the plan's stays, so that
    # the second half exercises the de-duplication)
    wrong = next(nm for nm in ranked if KernelConfig.from_json(row["candidates"][nm]["config"]) != planned)
    row["candidates"][wrong]["bad_elements"] = 3
    ranked = [nm for nm in ranked if nm != wrong]
    results = tmp_path / "r.json"
    results.write_text(json.dumps(data))
    llama = {"ms": [8], "model": "llama-3.1-8b", "tps": [1], "from_results": [results], "best": 2, "twins": False}
    line = prepare("sm_90a", None, tmp_path / "out", **llama)
    got = {(r["n"], r["k"], r["m"]): r["candidates"] for r in _spec(tmp_path / "out")["cells"]}
    want = [row["candidates"][nm]["config"] for nm in ranked[:2]]
    assert [KernelConfig.from_json(c) for c in got[(28672, 4096, 8)]] == [KernelConfig.from_json(c) for c in want]
    assert all(len(v) <= 2 for v in got.values()) and "built" in line
    # beside --from-plans: the plan's config first, a results config it already holds not repeated
    prepare("sm_90a", None, tmp_path / "both", **llama, from_plans=[plans.plan_path("sm_90a")])
    both = {(r["n"], r["k"], r["m"]): r["candidates"] for r in _spec(tmp_path / "both")["cells"]}
    from_runs = [KernelConfig.from_json(c) for c in want]
    assert [KernelConfig.from_json(c) for c in both[(28672, 4096, 8)]] == [planned] + [
        c for c in from_runs if c != planned
    ]
    assert planned in from_runs, "the case exercises the de-duplication"


def test_from_results_refuses_a_cut_and_best_alone_in_one_line(compiled, tmp_path, capsys):
    args = ["tune", "prepare", "--model", "llama-3.1-8b", "--tp", "1", "--m", "8", "--out", str(tmp_path / "o")]
    assert cli.main([*args, "--from-results", str(LLAMA_SLICED), "--top", "4"]) == 2
    err = capsys.readouterr().err
    assert "--top does not apply" in err and err.count("\n") == 1
    assert cli.main([*args, "--best", "3"]) == 2
    err = capsys.readouterr().err
    assert "--best counts each cell's candidates taken from --from-results" in err and err.count("\n") == 1
