"""Hostile artifacts (a build folder, a wheel, the override folder) meet verify, the loader, env and coverage:
each is refused in one printable line (no forged report line, no escape sequence, nothing unencodable), never
read outside its folder, never hangs (helpers/hang.py), and an override says which arch it lacks."""

from __future__ import annotations

import json
import os
import warnings
import zipfile

import pytest
from helpers.artifacts import all_plans, bind_all, first_variant, make_wheel, manifest_of, plans_of, write_manifest
from helpers.hang import no_hang

from skinny_gemm.aot import cli, verify
from skinny_gemm.runtime import coverage, diagnostics, loader
from skinny_gemm.runtime.manifest import MANIFEST_NAME


def one_clean_line(problems: list[str], *phrases: str) -> str:
    """The single problem: one line, no control character, encodable, holding every phrase."""
    assert len(problems) == 1, problems
    (line,) = problems
    assert line.isprintable() and line.encode("utf-8") and all(p in line for p in phrases), line
    return line


def _rename_first(art, name: str) -> None:
    data = manifest_of(art)
    v = data["variants"][0]
    os.rename(art / "sm_90a" / v["file"], art / "sm_90a" / "renamed.cubin")
    v["file"] = name
    write_manifest(art, data)


NAMES = {
    "newline forging an OK line": "x.cubin\nOK everything verified",
    "escape sequence": "\x1b[2J\x1b[31mred.cubin",
    "lone surrogate": "\udc80.cubin",
}


@pytest.mark.parametrize("case", sorted(NAMES))
def test_unprintable_file_name_is_one_clean_refusal(case, art, tmp_path, capsys, fresh):
    _rename_first(art, NAMES[case])
    _, problems = verify.verify(art)
    one_clean_line(problems, str(art / "sm_90a" / MANIFEST_NAME), "field 'file'")
    whl = make_wheel(art, tmp_path / "skinny_gemm-0.1.0-0sm90a.sm121-py3-none-any.whl")
    _, in_wheel = verify.verify(whl)
    one_clean_line(in_wheel, "field 'file'")
    assert cli.main(["verify", str(art)]) == 1
    out = capsys.readouterr().out
    assert out.encode("utf-8") and "\x1b" not in out and [line[:5] for line in out.splitlines()] == ["FAIL "], out
    fake = fresh()
    assert len(fake.warnings) == 1 and loader.DEVICES[0].table == {}
    text = diagnostics.env_report()
    assert text.encode("utf-8") and "\x1b" not in text and "field 'file'" in text


@pytest.mark.parametrize("plan_file", ["../../../../../../etc/passwd", "/etc/passwd", "kernels/../../x.json"])
def test_plan_file_outside_the_tree_is_refused_unread(plan_file, art):
    data = manifest_of(art)
    data["plan_file"] = plan_file
    write_manifest(art, data)
    _, problems = verify.verify(art)
    one_clean_line(problems, "field 'plan_file'")


def test_manifest_without_variants_or_plans_is_a_refusal(art, fresh):
    data = manifest_of(art)
    data["variants"], data["plans"] = [], []
    write_manifest(art, data)
    _, problems = verify.verify(art)
    one_clean_line(problems, str(art / "sm_90a" / MANIFEST_NAME), "no variants and no plans")
    fake = fresh()
    assert len(fake.warnings) == 1 and "no variants and no plans" in str(fake.warnings[0].message)


def test_wheel_with_a_duplicate_entry_is_refused(art, tmp_path):
    """Two entries of one name, the first damaged: unpacking keeps the last, pip may keep either."""
    v = first_variant(art)
    cubin = art / "sm_90a" / v["file"]
    good = cubin.read_bytes()
    cubin.write_bytes(good[: len(good) // 2])
    whl = make_wheel(art, tmp_path / "dup.whl")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name it is asked to write
        with zipfile.ZipFile(whl, "a") as z:
            z.writestr(f"skinny_gemm/artifacts/sm_90a/{v['file']}", good)
    _, problems = verify.verify(whl)
    one_clean_line(problems, str(whl), "appears twice")


def test_fifo_named_whl_does_not_hang_verify(tmp_path):
    whl = tmp_path / "x.whl"
    os.mkfifo(whl)
    with no_hang("verify of a FIFO named *.whl"):
        _, problems = verify.verify(whl)
    one_clean_line(problems, str(whl), "a FIFO")


def test_fifo_among_the_tree_sources_does_not_hang_verify(art, tree_copy):
    os.mkfifo(tree_copy / "kernels" / "evil.py")
    with no_hang("verify --tree with a FIFO among the kernel sources"):
        _, problems = verify.verify(art / "sm_90a", tree=tree_copy)
    assert any("evil.py" in p and "a FIFO" in p for p in problems), problems


def test_relative_override_survives_a_chdir(art, fresh, monkeypatch, tmp_path):
    monkeypatch.chdir(art.parent)
    monkeypatch.setenv(loader.ENV_ARTIFACTS, art.name)
    fresh()
    monkeypatch.chdir(tmp_path / "..")
    assert bind_all(0) == []
    assert set(loader.DEVICES[0].table) == all_plans(art)


def test_override_without_the_gpus_arch_names_what_is_missing(art, fresh):
    for path in (art / "sm_121").iterdir():
        path.unlink()
    (art / "sm_121").rmdir()
    fake = fresh(caps=[(9, 0), (12, 1)])
    (warning,) = fake.override_warnings
    assert "sm_121/manifest.json" in str(warning.message) and str(art) in str(warning.message)


def test_override_with_every_arch_names_nothing_missing(art, fresh):
    """The control of the test above: a complete override folder gets the plain override warning."""
    fake = fresh(caps=[(9, 0), (12, 1)])
    (warning,) = fake.override_warnings
    assert "has no" not in str(warning.message)


def test_env_shows_the_folder_loaded_not_the_variable_now(art, fresh, monkeypatch, tmp_path):
    fresh()
    monkeypatch.setenv(loader.ENV_ARTIFACTS, str(tmp_path / "elsewhere"))
    assert f"artifacts root: {art} " in diagnostics.env_report()


def test_coverage_reads_the_manifest_as_the_loader_does(art, capsys):
    """One bad variant record: the loader refuses that variant, so its shapes are not covered (and no traceback)."""
    data = manifest_of(art)
    bad = data["variants"][0]
    bad["block"] = 7
    write_manifest(art, data)
    table, source = coverage.planned("sm_90a")
    covered = {(n, k, m) for (n, k), ms in table.items() for m in ms}
    assert covered == all_plans(art) - plans_of(art, bad["id"]) and "refused" in source
    assert cli.main(["coverage", "qwen3-8b", "--tp", "4", "--arch", "sm_90a"]) == 0
    capsys.readouterr()


def test_coverage_refuses_a_manifest_the_loader_refuses(art, capsys):
    data = manifest_of(art)
    data["package_version"] = "0.0.0-other"
    write_manifest(art, data)
    with no_hang("coverage"):
        rc = cli.main(["coverage", "qwen3-8b", "--tp", "4", "--arch", "sm_90a"])
    (line,) = capsys.readouterr().err.splitlines()
    assert rc == 2 and str(art / "sm_90a" / MANIFEST_NAME) in line and "0.0.0-other" in line, line


def test_manifest_nested_too_deeply_is_one_line(art):
    (art / "sm_90a" / MANIFEST_NAME).write_text(json.dumps({**manifest_of(art), "x": json.loads("[" * 40 + "]" * 40)}))
    _, problems = verify.verify(art)
    one_clean_line(problems, "nested too deeply")
