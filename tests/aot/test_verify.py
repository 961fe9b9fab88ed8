"""verify: passes on a good build, and each kind of damage fails with its own message."""

import hashlib
import json
import shutil
import subprocess
import sys

from helpers.artifacts import contradicting_cluster

from skinny_gemm.aot import verify
from skinny_gemm.aot.build import PACKAGE_ROOT
from skinny_gemm.runtime.manifest import ARCHS


def _problems(root, tree=None):
    _, problems = verify.verify(root, tree=tree)
    return problems


def _first_cubin(arch_dir):
    return sorted(arch_dir.glob("*.cubin"))[0]


def test_good_build_verifies(built):
    archs, problems = verify.verify(built["root"])
    assert problems == []
    assert archs == sorted(ARCHS)


def test_flipped_byte_is_caught(build_copy):
    path = _first_cubin(build_copy / "sm_90a")
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))
    problems = _problems(build_copy)
    assert problems == [f"{path}: sha256 mismatch (corrupted or replaced)"]


def test_deleted_cubin_is_caught(build_copy):
    path = _first_cubin(build_copy / "sm_90a")
    path.unlink()
    problems = _problems(build_copy)
    assert len(problems) == 1 and problems[0].startswith(f"{path}: cubin missing")


def test_sm121_cubin_in_place_of_sm90a_is_caught(build_copy):
    """Even with the manifest's hash updated to match, the ELF arch gives it away."""
    d90, d121 = build_copy / "sm_90a", build_copy / "sm_121"
    man_path = d90 / "manifest.json"
    man = json.loads(man_path.read_text())
    victim = man["variants"][0]
    shutil.copy(_first_cubin(d121), d90 / victim["file"])
    blob = (d90 / victim["file"]).read_bytes()
    victim["sha256"], victim["size"] = hashlib.sha256(blob).hexdigest(), len(blob)
    man_path.write_text(json.dumps(man, indent=1, sort_keys=True) + "\n")
    problems = _problems(build_copy)
    assert f"{d90 / victim['file']}: ELF arch is sm_121, manifest says sm_90a" in problems
    assert all(line.startswith(str(d90 / victim["file"])) for line in problems)


def test_plan_edited_after_build_is_caught(built, tree_copy):
    plan = tree_copy / "kernels" / "plans" / "sm_90a.json"
    plan.write_text(plan.read_text().replace('"dtype": "bfloat16"', '"dtype": "bfloat16" '))
    problems = _problems(built["root"], tree=tree_copy)
    assert problems == ["sm_90a: stale build: kernels/plans/sm_90a.json changed after the build (plan_sha256 differs)"]


def test_kernel_source_edited_after_build_is_caught(built, tree_copy):
    src = tree_copy / "kernels" / "skinny_mma.py"
    src.write_text(src.read_text() + "\n")
    problems = _problems(built["root"], tree=tree_copy)
    assert sorted(problems) == [
        f"{arch}: stale build: kernel sources changed after the build (source_sha256 differs)" for arch in sorted(ARCHS)
    ]


def test_manifest_from_older_schema_is_caught(build_copy):
    man_path = build_copy / "sm_90a" / "manifest.json"
    man = json.loads(man_path.read_text())
    man["schema"] = 0
    man_path.write_text(json.dumps(man))
    problems = _problems(build_copy)
    assert problems == [f"{man_path}: manifest schema 0, this package reads schema 1"]


def test_launch_shape_contradicting_config_is_caught(build_copy):
    """A manifest whose grid record asks for clusters its config never reduces across: the loader would refuse it too."""
    man_path = build_copy / "sm_90a" / "manifest.json"
    man = json.loads(man_path.read_text())
    variant = man["variants"][0]
    variant["grid"]["cluster"] = contradicting_cluster(variant)
    man_path.write_text(json.dumps(man))
    (problem,) = _problems(build_copy)
    assert problem.startswith(str(build_copy / "sm_90a" / variant["file"]))
    assert f"cluster {variant['grid']['cluster']}" in problem and "contradicts its config" in problem


def test_orphan_file_is_caught(build_copy):
    stray = build_copy / "sm_121" / "old_variant.cubin"
    stray.write_bytes(b"\x7fELF")
    assert _problems(build_copy) == [f"{stray}: orphan file, not in the manifest"]


def test_missing_manifest_is_caught(build_copy):
    (build_copy / "sm_121" / "manifest.json").unlink()
    problems = _problems(build_copy)
    assert problems == [f"{build_copy / 'sm_121' / 'manifest.json'}: no manifest (missing or incomplete artifact dir)"]


def test_cli_exit_codes(built, build_copy):
    ok = subprocess.run(
        [sys.executable, str(PACKAGE_ROOT / "aot" / "source_tree.py"), "verify", str(built["root"])],
        capture_output=True,
        text=True,
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.startswith("OK ")
    _first_cubin(build_copy / "sm_90a").unlink()
    bad = subprocess.run(
        [sys.executable, str(PACKAGE_ROOT / "aot" / "source_tree.py"), "verify", str(build_copy)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 1
    assert [line for line in bad.stdout.splitlines() if line.startswith("FAIL ")]


def test_malformed_manifest_is_one_line_not_a_traceback(build_copy):
    man_path = build_copy / "sm_90a" / "manifest.json"
    good = json.loads(man_path.read_text())
    for breakage in ({"abi": []}, {"plans": [{"n": "many", "k": 1, "m": 1, "variant": "x"}]}):
        man_path.write_text(json.dumps({**good, **breakage}))
        problems = _problems(build_copy)
        assert len(problems) == 1 and problems[0].startswith(f"{man_path}: "), problems
