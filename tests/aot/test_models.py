"""The model catalogue (kernels/models): every file parses and agrees with its arch; each check can fail."""

import copy
import json

import pytest

from skinny_gemm.aot import cli, models, plans
from skinny_gemm.runtime import modelfile


def test_every_model_file_parses_and_agrees_with_its_arch():
    assert models.catalogue_problems() == []
    assert len(modelfile.catalogue()) == 16  # the 15 popular models and the seed model


def _problems(tmp_path, slug, edit):
    """The check's lines for a copy of a catalogue file changed by ``edit``."""
    data = json.loads(modelfile.catalogue_path(slug).read_text())
    edit(data)
    path = tmp_path / f"{slug}.json"
    path.write_text(json.dumps(data))
    return models.check_file(path)


@pytest.mark.parametrize(
    "slug, edit, expect",
    [
        # KV heads: 8 per model over 8 ranks is one each, (4 + 2) x 128
        (
            "llama-3.1-8b",
            lambda d: d["linears"]["qkv_proj"]["tp"].update({"8": [1024, 4096]}),
            "linears.qkv_proj.tp.8: [1024, 4096] but arch gives [768, 4096]",
        ),
        # replicated KV heads: 4 KV heads on 8 ranks stay one per rank
        (
            "qwen3-30b-a3b",
            lambda d: d["arch"].update({"kv_heads": 8}),
            "linears.qkv_proj.tp.4: [1280, 2048] but arch gives [1536, 2048]",
        ),
        (
            "gemma-3-27b",
            lambda d: d["arch"].update({"vocab": 262144}),
            "linears.lm_head.tp.8: [32776, 5376] but arch gives [32768, 5376]",
        ),
        (
            "qwen2.5-72b",
            lambda d: d["linears"]["down_proj"]["tp"].update({"8": [8192, 3584]}),
            "linears.down_proj.tp.8: [8192, 3584] but arch gives [8192, 3696]",
        ),
        ("deepseek-v3", lambda d: d["arch"].update({"qk_rope": 128}), "linears.fused_qkv_a_proj.tp.8"),
        ("kimi-k2-thinking", lambda d: d["arch"].update({"heads": 128}), "linears.q_b_proj.tp.8"),
        ("glm-4.5", lambda d: d["arch"].update({"dense_intermediate": 10944}), "linears.dense_gate_up_proj.tp.8"),
        (
            "glm-5.3-flash",
            lambda d: d["linears"]["shared_down"]["tp"].update({"8": [4096, 512]}),
            "linears.shared_down.tp.8: [4096, 512] but arch gives [4096, 256]",
        ),
        (
            "qwen3-8b",
            lambda d: d["linears"]["o_proj"].update({"calls_per_step": 35}),
            "linears.o_proj.calls_per_step: 35 but arch gives 36",
        ),
        ("qwen3-235b-a22b", lambda d: d["experts"].update({"top_k": 4}), "experts.top_k: 4 but arch gives 8"),
        ("qwen3-30b-a3b", lambda d: d["experts"]["bytes_per_step_M1"].update({"8": 1}), "experts.bytes_per_step_M1.8"),
        ("llama-3.1-70b", lambda d: d.update({"weights_gb": 100.0}), "fits.2: ['H200'] but weights_gb 100.0 gives"),
        ("qwen3-32b", lambda d: d["linears"]["qkv_proj"].pop("dtype"), "linears.qkv_proj.dtype: None must be a str"),
        ("qwen3-32b", lambda d: d["linears"]["qkv_proj"]["tp"].update({"3": [1, 2]}), "linears.qkv_proj.tp: key '3'"),
        ("qwen3-32b", lambda d: d["linears"]["qkv_proj"]["tp"].update({"8": [1280, 0]}), "must be [N, K]"),
        ("qwen3-32b", lambda d: d.update({"corrections": ["oops"]}), "corrections: must be a list"),
    ],
)
def test_each_check_names_the_file_and_field(tmp_path, slug, edit, expect):
    problems = _problems(tmp_path, slug, edit)
    assert any(line.startswith(f"{slug}.json: ") and expect in line for line in problems), problems


def test_unreadable_and_unknown_models_are_one_line(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    (line,) = models.check_file(bad)
    assert "unreadable model file" in line and str(bad) in line
    with pytest.raises(models.ModelError, match="no such model file"):
        models.load("no-such-model")


def test_cells_per_tp_follow_the_sharding():
    llama = models.load("llama-3.1-8b")
    assert modelfile.tps(llama) == [1, 2, 4, 8]
    assert models.shapes(llama, 1) == {
        (6144, 4096): False,
        (4096, 4096): False,
        (28672, 4096): False,
        (4096, 14336): False,
        (128256, 4096): False,
    }
    gpt = models.load("gpt-oss-120b")
    # qkv and o_proj carry a bias; the router is no candidate; the experts are not linears
    assert models.shapes(gpt, 8) == {(640, 2880): True, (2880, 512): True, (25136, 2880): False}
    dsv3 = models.load("deepseek-v3")
    assert models.shapes(dsv3, 8) == {(16160, 7168): False}, "the FP8 checkpoint keeps only the LM head in BF16"
    reasons = {lin.name: lin.skip_reason for lin in modelfile.linears(models.load("kimi-k2-thinking"), 8)}
    assert reasons["fused_qkv_a_proj"].startswith("vllm fast path")
    assert reasons["kv_b_proj"].startswith("not called at decode")
    assert reasons["router"].startswith("router")


def test_the_seed_model_gives_the_seed_set():
    """glm-5.3-flash at TP 4 and 8 has exactly the sm_90a seed set's shapes (the committed plan's)."""
    glm = models.load("glm-5.3-flash")
    _, entries = plans.load(plans.plan_path("sm_90a"))
    seed = {(n, k) for n, k, _ in plans.seed_shapes("sm_90a", modelfile.catalogue_path("glm-5.3-flash"))}
    assert {s for tp in (4, 8) for s in models.shapes(glm, tp)} == seed
    assert seed <= {(e.n, e.k) for e in entries}, "the plan serves the seed set (and catalogue models beside it)"


def test_corrections_say_why():
    for slug in modelfile.catalogue():
        data = models.load(slug)
        for fix in data.get("corrections", []):
            assert fix["field"] and len(fix["why"]) > 20, (slug, fix)
    assert models.load("glm-4.5")["arch"]["dense_intermediate"] == 12288


def test_plan_model_cli_reports_and_fails_in_one_line(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert cli.main(["plan", "--model", "qwen2.5-72b", "--tp", "8", "--m", "1", "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert text.startswith("5 cells: ") and "wrote" in text
    header, entries = plans.load(out)
    assert header["arch"] == "sm_90a" and all(e.provenance["kind"] == "heuristic" for e in entries)
    assert all(any(u.startswith("qwen2.5-72b@tp8:") for u in e.provenance["uses"]) for e in entries)
    for argv, msg in (
        (["--model", "nope"], "no such model file"),
        (["--model", "llama-3.1-70b", "--tp", "1"], "no shapes at TP 1"),
        ([], "plan needs --shapes FILE, --model SLUG or --all"),
    ):
        assert cli.main(["plan", *argv]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and msg in err, err


def test_all_with_a_tp_takes_the_models_that_list_it():
    pairs = plans.model_tps(None, [1], True)
    assert ("llama-3.1-8b", 1) in pairs and not any(slug == "llama-3.1-70b" for slug, _ in pairs)
    with pytest.raises(plans.PlanError, match="no catalogue model lists TP"):
        plans.model_tps(None, [3], True)


def test_a_broken_catalogue_file_stops_the_planner_with_its_lines(tmp_path, monkeypatch):
    broken = tmp_path / "models"
    broken.mkdir()
    for path in modelfile.MODELS_DIR.glob("*.json"):
        (broken / path.name).write_text(path.read_text())
    data = json.loads((broken / "qwen3-8b.json").read_text())
    bad = copy.deepcopy(data)
    bad["linears"]["qkv_proj"]["tp"]["1"] = [6000, 4096]
    (broken / "qwen3-8b.json").write_text(json.dumps(bad))
    monkeypatch.setattr(modelfile, "MODELS_DIR", broken)
    with pytest.raises(models.ModelError, match=r"qwen3-8b.json: linears.qkv_proj.tp.1: \[6000, 4096\]"):
        plans.model_tps(None, None, True)


def test_malformed_model_files_give_lines_never_a_traceback(tmp_path):
    """Fields deleted or retyped at random (arch facts, linear fields, experts, top-level keys): lines, not errors."""
    import random

    rng = random.Random(1)
    files = sorted(p for p in modelfile.MODELS_DIR.glob("*.json") if p.name != modelfile.CATALOGUE_FILE)
    base = [json.loads(p.read_text()) for p in files]
    junk = [None, 0, -1, 1.5, "x", True, [], {}, [1], {"9": [1, 2]}, {"8": "x"}, {"1": [1]}]
    path = tmp_path / "fuzz.json"
    flagged = 0
    for _ in range(600):
        data = copy.deepcopy(rng.choice(base))
        where = rng.choice(
            [
                data,
                data.get("arch") or {},
                data.get("experts") or {},
                data["linears"][rng.choice(sorted(data["linears"]))],
            ]
        )
        if where:
            key = rng.choice(sorted(where))
            if rng.random() < 0.3:
                del where[key]
            else:
                where[key] = rng.choice(junk)
        path.write_text(json.dumps(data))
        lines = models.check_file(path)
        assert all(line.startswith("fuzz.json: ") and "\n" not in line for line in lines)
        flagged += bool(lines)
    assert flagged > 300, "most of these edits break a rule"
