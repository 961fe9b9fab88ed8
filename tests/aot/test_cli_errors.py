"""Bad input to the CLI gives one clear line and exit 2, never a traceback."""

from __future__ import annotations

import subprocess
import sys

import pytest

from skinny_gemm.aot import cli, plans
from skinny_gemm.aot.build import PACKAGE_ROOT

SOURCE_TREE = str(PACKAGE_ROOT / "aot" / "source_tree.py")


@pytest.mark.parametrize("text", ['{"x": 1}', "[1, 2]", "{not json", '{"header": {"arch": "sm_90a"}, "entries": [{}]}'])
def test_list_with_a_bad_plan_file(tmp_path, capsys, text):
    bad = tmp_path / "plan.json"
    bad.write_text(text)
    assert cli.main(["list", "--arch", "sm_90a", "--plan", str(bad)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(bad) in err and "\n" not in err and "Traceback" not in err, err


@pytest.mark.parametrize("shapes", ["[1, 2]", '{"seed_plan_sets": {}}', "{not json"])
def test_plan_with_bad_shapes(tmp_path, capsys, monkeypatch, shapes):
    monkeypatch.setattr(plans, "plan_path", lambda arch: tmp_path / f"{arch}.json")  # never the committed tables
    bad = tmp_path / "shapes.json"
    bad.write_text(shapes)
    assert cli.main(["plan", "--arch", "sm_121", "--shapes", str(bad), "--out", str(tmp_path / "sm_121.json")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and str(bad) in err and "\n" not in err, err
    assert not (tmp_path / "sm_121.json").exists()


def test_build_without_cutlass(tmp_path):
    """cutlass made unimportable in the process (and so in its forked compile workers), with an empty cache."""
    code = (
        "import sys, runpy\n"
        "sys.modules['cutlass'] = None\n"
        f"sys.argv = ['skinny-gemm', 'build', '--arch', 'sm_121', '--out', {str(tmp_path / 'out')!r},\n"
        f"            '--cache-dir', {str(tmp_path / 'cache')!r}, '--quiet', '--jobs', '1']\n"
        f"runpy.run_path({SOURCE_TREE!r}, run_name='__main__')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip() == "error: build needs nvidia-cutlass-dsl (pip install nvidia-cutlass-dsl==4.8.1)", (
        res.stderr
    )


def test_verify_without_a_path_checks_what_the_loader_loads(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("SKINNY_GEMM_ARTIFACTS", str(tmp_path))
    assert cli.main(["verify"]) == 1
    assert capsys.readouterr().out.strip() == f"FAIL {tmp_path}: no <arch>/manifest.json found"


def test_tune_prepare_without_cutlass(tmp_path):
    """As `build` without cutlass: one line, exit 2 (it was a traceback from the compile options' import)."""
    shapes = PACKAGE_ROOT / "kernels" / "models" / "glm-5.3-flash.json"
    code = (
        "import sys, runpy\n"
        "sys.modules['cutlass'] = None\n"
        f"sys.argv = ['skinny-gemm', 'tune', 'prepare', '--shapes', {str(shapes)!r}, '--m', '1', '--top', '1',\n"
        f"            '--out', {str(tmp_path / 'cands')!r}, '--jobs', '1']\n"
        f"runpy.run_path({SOURCE_TREE!r}, run_name='__main__')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=False)
    assert res.returncode == 2, res.stdout + res.stderr
    assert res.stderr.strip() == (
        "skinny-gemm tune prepare: error: needs nvidia-cutlass-dsl (pip install nvidia-cutlass-dsl==4.8.1)"
    ), res.stderr


@pytest.mark.parametrize(
    ("verb", "blocked", "line"),
    [
        (["env"], "torch", "error: env needs torch, not installed here (pip install 'torch>=2.11,<2.14')"),
        (["verify", "."], "tqdm", "error: verify needs tqdm, not installed here (pip install 'tqdm>=4.66')"),
    ],
)
def test_a_missing_dependency_is_one_line(verb, blocked, line):
    """As after `pip install --no-deps` of the wheel: the verb that imports a missing dependency names it (both were
    tracebacks before, env's from runtime/diagnostics.py)."""
    code = (
        "import sys, runpy\n"
        f"sys.modules[{blocked!r}] = None\n"
        f"sys.argv = ['skinny-gemm', *{verb!r}]\n"
        f"runpy.run_path({SOURCE_TREE!r}, run_name='__main__')\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False)
    assert (res.returncode, res.stderr.strip()) == (2, line), res.stdout + res.stderr


@pytest.mark.parametrize("missing", ["skinny_gemm.gone", "torch._no_such_submodule"])
def test_a_missing_module_of_our_own_is_not_hidden(monkeypatch, missing):
    """Only a declared dependency missing as a whole gets the one line: a module of ours, or a submodule of an
    installed dependency (a broken install or another version, where "not installed" would mislead), keeps its
    traceback."""

    def broken(args):
        raise ModuleNotFoundError(f"No module named {missing!r}", name=missing)

    monkeypatch.setattr(cli, "cmd_env", broken)
    with pytest.raises(ModuleNotFoundError):
        cli.main(["env"])
