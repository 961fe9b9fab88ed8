"""Every file a user can hand the CLI, made hostile, is refused the same way: exit 2, exactly one stderr line
naming the file, no traceback, no hang, nothing written into the package. The CLI runs in-process (fast); a
case that could block (a FIFO) runs under a hang guard that fails only when it blocks (helpers/hang.py)."""

from __future__ import annotations

import hashlib
import json
import os

import pytest
from helpers.hang import no_hang

from skinny_gemm.aot import cli
from skinny_gemm.aot.build import PACKAGE_ROOT

HF_CONFIGS = PACKAGE_ROOT / "tests" / "helpers" / "hf_configs"
PLAN_90A = PACKAGE_ROOT / "kernels" / "plans" / "sm_90a.json"


def package_state() -> dict:
    """Every file of the package a CLI verb could write (plan tables, artifacts): path -> sha256."""
    found = {}
    for folder in (PACKAGE_ROOT / "kernels" / "plans", PACKAGE_ROOT / "artifacts"):
        for path in sorted(folder.rglob("*")) if folder.is_dir() else ():
            if path.is_file():
                found[str(path)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@pytest.fixture(autouse=True)
def package_untouched():
    before = package_state()
    yield
    assert package_state() == before, "a CLI verb wrote into the package"


def refused(capsys, argv: list[str], named) -> str:
    """Run the CLI in-process; assert exit 2 and one stderr line naming ``named``; return that line."""
    with no_hang(f"skinny-gemm {' '.join(argv)}"):
        rc = cli.main(argv)
    out, err = capsys.readouterr()
    lines = err.splitlines()
    assert rc == 2 and len(lines) == 1, (rc, out, err)
    assert str(named) in lines[0] and "Traceback" not in err, err
    return lines[0]


# ---- the files every verb reads: one builder each, (path, tmp) -> argv ------------------------------------------


def _out(tmp):
    return str(tmp / "written.json")


VERBS = {
    "coverage config": lambda p, tmp: ["coverage", str(p), "--tp", "1"],
    "coverage --plan": lambda p, tmp: ["coverage", "qwen3-8b", "--tp", "4", "--plan", str(p)],
    "build --plan": lambda p, tmp: [
        "build",
        "--arch",
        "sm_90a",
        "--plan",
        str(p),
        "--out",
        str(tmp / "out"),
        "--cache-dir",
        str(tmp / "cache"),
        "--quiet",
        "--jobs",
        "1",
    ],
    "list --plan": lambda p, tmp: ["list", "--arch", "sm_90a", "--plan", str(p)],
    "plan --shapes": lambda p, tmp: ["plan", "--arch", "sm_90a", "--shapes", str(p), "--out", _out(tmp)],
    "tune prepare --shapes": lambda p, tmp: [
        "tune",
        "prepare",
        "--shapes",
        str(p),
        "--out",
        str(tmp / "cands"),
        "--top",
        "1",
        "--jobs",
        "1",
    ],
    "tune write": lambda p, tmp: ["tune", "write", str(p), "--out", _out(tmp)],
    "tune write --runs": lambda p, tmp: ["tune", "write", "--runs", str(p), "--out", _out(tmp)],
}


def _tiny_plan() -> dict:
    data = json.loads(PLAN_90A.read_text())
    return {"header": data["header"], "entries": data["entries"][:1]}


def _tiny_shapes() -> dict:
    return {
        "linears": {"q": {"tp": {"4": [4096, 4096]}}},
        "seed_plan_sets": {"sm_90a": {"tp": 4, "linears": ["q"], "planned_M": [1]}},
    }


# verb -> a valid file of its kind: each hostile kind below is made from it, so what is refused is the hostile
# part, not a field the file lacks.
BASES = {
    "coverage config": lambda: json.loads((HF_CONFIGS / "qwen3-8b.json").read_text()),
    "coverage --plan": lambda: {"entries": [{"n": 4096, "k": 4096, "m": 1}]},
    "build --plan": _tiny_plan,
    "list --plan": _tiny_plan,
    "plan --shapes": _tiny_shapes,
    "tune prepare --shapes": _tiny_shapes,
    "tune write": lambda: _results(),
    "tune write --runs": lambda: {"runs": [{"file": "results.json"}]},
}


def _fifo(path, base):
    os.mkfifo(path)


def _sparse(path, base):
    with open(path, "wb") as f:
        f.write(json.dumps(base).encode())
        f.truncate(65 * 1024 * 1024)  # over the cap, never read


def _with(extra: bytes):
    """The valid file with one more top-level key whose value is ``extra`` (raw JSON bytes)."""
    return lambda path, base: path.write_bytes(b'{"x": ' + extra + b", " + json.dumps(base).encode()[1:])


# name -> what it makes at the path from the verb's valid file
FILES = {
    "fifo": _fifo,
    "directory": lambda p, base: p.mkdir(),
    "not utf-8": _with(b'"\xff\xfe"'),
    "nested 100000 deep": _with(b"[" * 100000 + b"]" * 100000),
    "nested 40 deep": _with(b"[" * 40 + b"]" * 40),
    "NaN": _with(b"NaN"),
    "over the size cap": _sparse,
    "a list": lambda p, base: p.write_text(json.dumps([base])),
}


@pytest.mark.parametrize("kind", sorted(FILES))
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_hostile_file_is_one_line(verb, kind, tmp_path, capsys):
    path = tmp_path / "input.json"
    FILES[kind](path, BASES[verb]())
    refused(capsys, VERBS[verb](path, tmp_path), path)
    assert not (tmp_path / "written.json").exists()


# build and tune prepare would compile: their files are the ones list --plan and plan --shapes read.
@pytest.mark.parametrize(
    "verb", ["coverage config", "coverage --plan", "list --plan", "plan --shapes", "tune write", "tune write --runs"]
)
def test_the_valid_files_the_hostile_ones_are_made_from_pass(verb, tmp_path, capsys):
    """The control: without the hostile part each file is accepted, so a refusal above is the hostile part's."""
    path = tmp_path / "input.json"
    path.write_text(json.dumps(BASES[verb]()))
    (tmp_path / "results.json").write_text(json.dumps(_results()))
    assert cli.main(VERBS[verb](path, tmp_path)) == 0, capsys.readouterr().err
    capsys.readouterr()


# ---- fields: each file kind with one field wrong -------------------------------------------------------------------


def _config(**change):
    data = json.loads((HF_CONFIGS / "qwen3-8b.json").read_text())
    data.update(change)
    return data


def _moe(**change):
    data = json.loads((HF_CONFIGS / "qwen3-30b-a3b.json").read_text())
    data.update(change)
    return data


def _mla(**change):
    data = json.loads((HF_CONFIGS / "deepseek-v3.json").read_text())
    data.update(change)
    return data


CONFIGS = {
    "hidden_size negative": (_config(hidden_size=-4096), "hidden_size"),
    "hidden_size fractional": (_config(hidden_size=4096.5), "hidden_size"),
    "hidden_size a string": (_config(hidden_size="4096"), "hidden_size"),
    "hidden_size huge": (_config(hidden_size=10**40), "hidden_size"),
    "layers true": (_config(num_hidden_layers=True), "num_hidden_layers"),
    "attention_bias a string": (_config(attention_bias="no"), "attention_bias"),
    "moe mlp_only_layers a string": (_moe(mlp_only_layers="0,1"), "mlp_only_layers"),
    "mla n_shared_experts a string": (_mla(n_shared_experts="1"), "n_shared_experts"),
    "mla first_k_dense_replace a float": (_mla(first_k_dense_replace=2.5), "first_k_dense_replace"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_coverage_config_field(case, tmp_path, capsys):
    data, field = CONFIGS[case]
    path = tmp_path / "config.json"
    path.write_text(json.dumps(data))
    line = refused(capsys, ["coverage", str(path), "--tp", "1"], path)
    assert field in line, line


def test_coverage_follows_a_linked_config(tmp_path, capsys):
    """A Hugging Face cache links config.json to its blob: the link is the user's file, not a hostile one."""
    (tmp_path / "blob").write_text((HF_CONFIGS / "qwen3-8b.json").read_text())
    (tmp_path / "config.json").symlink_to(tmp_path / "blob")
    assert cli.main(["coverage", str(tmp_path / "config.json"), "--tp", "1", "--plan", str(PLAN_90A)]) == 0
    assert "| **covered** |" in capsys.readouterr().out


COVERAGE_PLANS = {
    "entries a string": ({"entries": "all"}, "entries"),
    "entry a list": ({"entries": [[4096, 4096, 1]]}, "entries[0]"),
    "n a string": ({"entries": [{"n": "4096", "k": 4096, "m": 1}]}, "entries[0] field 'n'"),
    "m negative": ({"entries": [{"n": 4096, "k": 4096, "m": -1}]}, "entries[0] field 'm'"),
    "bias a string": ({"entries": [{"n": 4096, "k": 4096, "m": 1, "config": {"bias": "no"}}]}, "'bias'"),
}


@pytest.mark.parametrize("case", sorted(COVERAGE_PLANS))
def test_coverage_plan_field(case, tmp_path, capsys):
    data, field = COVERAGE_PLANS[case]
    path = tmp_path / "plans.json"
    path.write_text(json.dumps(data))
    line = refused(capsys, ["coverage", "qwen3-8b", "--tp", "4", "--plan", str(path)], path)
    assert field in line, line


def _plan_table(change):
    data = json.loads(PLAN_90A.read_text())
    change(data)
    return data


def _entry(**fields):
    def change(data):
        data["entries"][0].update(fields)

    return change


def _config_field(**fields):
    def change(data):
        data["entries"][0]["config"].update(fields)

    return change


PLAN_TABLES = {
    "header a list": (lambda d: d.update(header=[]), "header"),
    "entries an object": (lambda d: d.update(entries={}), "entries"),
    "n a string": (_entry(n="4096"), "entries[0] field 'n'"),
    "k zero": (_entry(k=0), "entries[0] field 'k'"),
    "m fractional": (_entry(m=1.5), "entries[0] field 'm'"),
    "config a list": (_entry(config=[1]), "entries[0] field 'config'"),
    "config threads a string": (_config_field(threads="256"), "'threads'"),
    "entry a number": (lambda d: d["entries"].__setitem__(0, 7), "entries[0]"),
    "provenance control chars": (_entry(provenance={"kind": "measured", "gpu": "H200\n\x1b[31mOK"}), "'gpu'"),
}


@pytest.mark.parametrize("verb", ["build --plan", "list --plan"])
@pytest.mark.parametrize("case", sorted(PLAN_TABLES))
def test_plan_table_field(verb, case, tmp_path, capsys):
    change, field = PLAN_TABLES[case]
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(_plan_table(change)))
    line = refused(capsys, VERBS[verb](path, tmp_path), path)
    assert field in line and "\x1b" not in line, line


SHAPES = {
    "no seed sets": ({"linears": {}}, "seed_plan_sets"),
    "tp a string": ({"seed_plan_sets": {"sm_90a": {"tp": "4", "linears": [], "planned_M": [1]}}}, "tp"),
    "unknown linear": (
        {"linears": {}, "seed_plan_sets": {"sm_90a": {"tp": 4, "linears": ["q"], "planned_M": [1]}}},
        "linears[0]",
    ),
    "shape of one": (
        {
            "linears": {"q": {"tp": {"4": [4096]}}},
            "seed_plan_sets": {"sm_90a": {"tp": 4, "linears": ["q"], "planned_M": [1]}},
        },
        "linears.q.tp.4",
    ),
    "shape a string": (
        {
            "linears": {"q": {"tp": {"4": ["4096", 4096]}}},
            "seed_plan_sets": {"sm_90a": {"tp": 4, "linears": ["q"], "planned_M": [1]}},
        },
        "linears.q.tp.4",
    ),
    "planned_M negative": (
        {
            "linears": {"q": {"tp": {"4": [4096, 4096]}}},
            "seed_plan_sets": {"sm_90a": {"tp": 4, "linears": ["q"], "planned_M": [-1]}},
        },
        "planned_M",
    ),
    "cuBLAS_cells a string": (
        {
            "linears": {"q": {"tp": {"4": [4096, 4096]}}},
            "seed_plan_sets": {"sm_90a": {"tp": 4, "linears": ["q"], "planned_M": [1], "cuBLAS_cells": "none"}},
        },
        "cuBLAS_cells",
    ),
}


@pytest.mark.parametrize("verb", ["plan --shapes", "tune prepare --shapes"])
@pytest.mark.parametrize("case", sorted(SHAPES))
def test_shapes_field(verb, case, tmp_path, capsys):
    data, field = SHAPES[case]
    path = tmp_path / "shapes.json"
    path.write_text(json.dumps(data))
    line = refused(capsys, VERBS[verb](path, tmp_path), path)
    assert field in line, line
    assert not (tmp_path / "written.json").exists() and not (tmp_path / "cands").exists()


def _results(**change):
    cfg = json.loads(PLAN_90A.read_text())["entries"][0]
    row = {
        "n": cfg["n"],
        "k": cfg["k"],
        "m": cfg["m"],
        "cublas_us": 10.0,
        "candidates": {"a": {"us": 5.0, "bad_elements": 0, "config": cfg["config"]}},
    }
    row.update(change.pop("row", {}))
    data = {"arch": "sm_90a", "gpu": "NVIDIA H200", "date": "2026-12-02", "method": "m", "cells": [row]}
    data.update(change)
    return data


RESULTS = {
    "arch unknown": (_results(arch="sm_80"), "arch"),
    "cells an object": (_results(cells={}), "cells"),
    "n a string": (_results(row={"n": "4096"}), "cells[0] field 'n'"),
    "cublas_us a string": (_results(row={"cublas_us": "10"}), "cublas_us"),
    "cublas_us zero": (_results(row={"cublas_us": 0}), "cublas_us"),
    "candidates a list": (_results(row={"candidates": []}), "candidates"),
    "us a string": (_results(row={"candidates": {"a": {"us": "5", "bad_elements": 0, "config": {}}}}), "'us'"),
    "bad_elements negative": (
        _results(row={"candidates": {"a": {"us": 5.0, "bad_elements": -1, "config": {}}}}),
        "bad_elements",
    ),
    "config invalid": (
        _results(row={"candidates": {"a": {"us": 5.0, "bad_elements": 0, "config": {"m": 0}}}}),
        "candidate 'a'",
    ),
    "gpu control chars": (_results(gpu="H200\n\x1b[2J"), "gpu"),
}


@pytest.mark.parametrize("case", sorted(RESULTS))
def test_tune_write_results_field(case, tmp_path, capsys):
    data, field = RESULTS[case]
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    line = refused(capsys, VERBS["tune write"](path, tmp_path), path)
    assert field in line and "\x1b" not in line, line
    assert not (tmp_path / "written.json").exists()


def test_tune_write_where_every_cell_loses_writes_nothing(tmp_path, capsys):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results(row={"cublas_us": 5.0})))  # 1.0x: under the 1.05x a cell needs
    line = refused(capsys, VERBS["tune write"](path, tmp_path), "written.json")
    assert "empty plan table" in line and not (tmp_path / "written.json").exists()


@pytest.mark.parametrize("verb", ["tune write", "plan --shapes"])
def test_no_out_never_targets_the_package(verb, tmp_path, capsys):
    """Without --out the target would be the package's own plan table: refused (an explicit --out is fine)."""
    if verb == "tune write":
        path = tmp_path / "results.json"
        path.write_text(json.dumps(_results()))
        argv = ["tune", "write", str(path)]
    else:
        path = PACKAGE_ROOT / "kernels" / "models" / "glm-5.3-flash.json"
        argv = ["plan", "--arch", "sm_90a", "--shapes", str(path), "--force"]
    line = refused(capsys, argv, PLAN_90A)
    assert "--out" in line, line
    assert cli.main([*argv, "--out", _out(tmp_path)]) == 0, "the control: with --out it writes"
    assert (tmp_path / "written.json").is_file()


def test_explicit_out_inside_an_installed_package_is_refused(tmp_path, capsys, monkeypatch):
    """Installed (no pyproject.toml beside the package), --out may not point into it either."""
    from skinny_gemm.aot import plans

    installed = tmp_path / "site-packages" / "skinny_gemm"
    (installed / "kernels" / "plans").mkdir(parents=True)
    monkeypatch.setattr(plans, "PLANS_DIR", installed / "kernels" / "plans")
    results = tmp_path / "results.json"
    results.write_text(json.dumps(_results()))
    target = installed / "kernels" / "plans" / "sm_90a.json"
    line = refused(capsys, ["tune", "write", str(results), "--out", str(target)], target)
    assert "installed package" in line and not target.exists()


RUNS = {
    "runs an object": ({"runs": {}}, "runs"),
    "file outside": ({"runs": [{"file": "../results.json"}]}, "runs[0] field 'file'"),
    "file a number": ({"runs": [{"file": 5}]}, "runs[0] field 'file'"),
    "ms zero": ({"runs": [{"file": "r.json", "ms": [0]}]}, "runs[0] field 'ms'"),
}


@pytest.mark.parametrize("case", sorted(RUNS))
def test_tune_write_runs_field(case, tmp_path, capsys):
    data, field = RUNS[case]
    path = tmp_path / "runs.json"
    path.write_text(json.dumps(data))
    line = refused(capsys, VERBS["tune write --runs"](path, tmp_path), path)
    assert field in line, line
