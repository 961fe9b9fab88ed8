"""The wheels: one per architecture, named for it, verified, installable without cutlass or a GPU.

CI (.ci/run) builds the wheels with the README's own command and points
SKINNY_WHEELS at them; without it these tests build them here (slow).
"""

import os
import re
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest
from helpers.artifacts import WHEEL_TAGS as TAGS
from helpers.artifacts import arch_wheels

from skinny_gemm.aot import verify
from skinny_gemm.aot.build import PACKAGE_ROOT

pytestmark = pytest.mark.slow


def pip_wheel(out, archs: str, *settings: str) -> list[str]:
    """The README's build command for ``archs`` (with this venv's build deps), plus further -C settings."""
    cmd = [sys.executable, "-m", "pip", "wheel", str(PACKAGE_ROOT), "--no-deps", "--no-build-isolation"]
    cmd += ["-w", str(out), "-C", f"skinny.archs={archs}"]
    return cmd + [a for setting in settings for a in ("-C", setting)]


@pytest.fixture(scope="module")
def wheels(tmp_path_factory):
    """{arch: wheel path}: from $SKINNY_WHEELS, else built here with the venv's own build deps."""
    given = os.environ.get("SKINNY_WHEELS")
    folder = Path(given) if given else tmp_path_factory.mktemp("dist")
    found = {}
    for arch in TAGS:
        matches = arch_wheels(folder, arch)
        if not matches and not given:
            subprocess.run(
                pip_wheel(folder, arch),
                check=True,
                capture_output=True,
            )
            matches = arch_wheels(folder, arch)
        assert len(matches) == 1, f"expected one {arch} wheel in {folder}, found {matches}"
        found[arch] = matches[0]
    return found


def test_wheel_name_and_contents_per_arch(wheels):
    for arch, path in wheels.items():
        assert re.fullmatch(rf"skinny_gemm-[0-9.]+-{TAGS[arch]}-py3-none-any\.whl", path.name)
        names = zipfile.ZipFile(path).namelist()
        archs = {n.split("/")[2] for n in names if n.startswith("skinny_gemm/artifacts/sm_")}
        assert archs == {arch}
        assert f"skinny_gemm/artifacts/{arch}/manifest.json" in names
        assert "skinny_gemm/__init__.py" in names and "skinny_gemm/runtime/loader.py" in names
        assert "skinny_gemm/runtime/hf_defaults.json" in names, "coverage's data ships beside it"
        meta = zipfile.ZipFile(path).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        requires = [line for line in meta.splitlines() if line.startswith("Requires-Dist:")]
        assert not any("cutlass" in line and "extra ==" not in line for line in requires), requires


def test_each_wheel_verifies(wheels):
    for arch, path in wheels.items():
        archs, problems = verify.verify(path)
        assert problems == [] and archs == [arch]


def test_tampered_wheel_fails_verify(wheels, tmp_path):
    src = wheels["sm_90a"]
    bad = tmp_path / src.name
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(bad, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item)
            if item.filename.endswith(".cubin") and "flipped" not in locals():
                data = data[:100] + bytes([data[100] ^ 1]) + data[101:]
                flipped = item.filename
            zout.writestr(item, data)
    _, problems = verify.verify(bad)
    assert len(problems) == 1 and "sha256 mismatch" in problems[0]


IMPORT_PROBE = """
import sys, skinny_gemm
assert not any(m.startswith("cutlass") for m in sys.modules), "cutlass was imported"
import torch
x, w = torch.randn(2, 64), torch.randn(32, 64)
assert torch.equal(skinny_gemm.linear(x, w), torch.nn.functional.linear(x, w))
assert skinny_gemm.plan_for(4096, 4096, 1) is None  # no GPU here
print("ok", skinny_gemm.__version__)
"""


def test_wheel_installs_in_fresh_venv_without_cutlass(wheels, tmp_path):
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = str(env_dir / "bin" / "python")
    # --no-compile: pip would compile all of torch's modules (half a minute on 2 cores) for the few that run here.
    pip = [py, "-m", "pip", "install", "-q", "--disable-pip-version-check", "--no-compile"]
    # torch first, pinned to the CPU build on this machine: the wheel's torch>=2.4
    # is then satisfied and pip does not fetch a multi-GB CUDA build.
    subprocess.run(pip + ["torch==2.13.0"], check=True)
    for arch, path in wheels.items():
        subprocess.run(pip + ["--force-reinstall", "--no-deps", str(path)], check=True)
        subprocess.run(pip + [str(path)], check=True)
        listed = subprocess.run([py, "-m", "pip", "list"], check=True, capture_output=True, text=True).stdout
        assert "cutlass" not in listed.lower()
        out = subprocess.run([py, "-c", IMPORT_PROBE], check=True, capture_output=True, text=True, cwd=tmp_path)
        assert out.stdout.startswith("ok ")
        ver = subprocess.run([py, "-m", "skinny_gemm", "verify"], capture_output=True, text=True, cwd=tmp_path)
        assert ver.returncode == 0, ver.stdout + ver.stderr
        assert ver.stdout.startswith("OK ") and arch in ver.stdout
        # Every size of this config comes from the defaults table the wheel ships (runtime/hf_defaults.json).
        (tmp_path / "config.json").write_text('{"architectures": ["Qwen3ForCausalLM"]}')
        cov = subprocess.run(
            [py, "-m", "skinny_gemm", "coverage", "config.json"], capture_output=True, text=True, cwd=tmp_path
        )
        assert cov.returncode == 0 and "| qkv_proj | 12288 | 4096 | 32 |" in cov.stdout, cov.stdout + cov.stderr
    # The CLI's help, its version and the bare module list the verbs without importing torch (seconds).
    probe = (
        "import sys, contextlib, io\nfrom skinny_gemm.aot.cli import main\n"
        "for argv in (['--help'], ['--version'], ['build', '--help'], ['coverage', '--help']):\n"
        "    with contextlib.suppress(SystemExit), contextlib.redirect_stdout(io.StringIO()):\n"
        "        main(argv)\n"
        "print('torch' in sys.modules)"
    )
    assert (
        subprocess.run([py, "-c", probe], check=True, capture_output=True, text=True, cwd=tmp_path).stdout.strip()
        == "False"
    )
    bare = subprocess.run([py, "-m", "skinny_gemm"], capture_output=True, text=True, cwd=tmp_path)
    assert bare.returncode == 0 and "verify" in bare.stdout and "coverage" in bare.stdout, bare.stdout + bare.stderr
    version = subprocess.run([py, "-m", "skinny_gemm", "--version"], capture_output=True, text=True, cwd=tmp_path)
    assert re.fullmatch(r"skinny-gemm \d+\.\d+\.\d+\n", version.stdout), version.stdout + version.stderr


@pytest.mark.parametrize("archs", ["sm_90a, sm_121", "sm_90", "sm_90a,sm_90a", ""])
def test_build_option_is_strict(archs, tmp_path):
    # A space after the comma once built sm_90a alone under a name that promised both.
    proc = subprocess.run(
        pip_wheel(tmp_path, archs, f"build-dir={tmp_path / 'build'}"),
        capture_output=True,
        text=True,
    )
    assert proc.returncode != 0 and not list(tmp_path.glob("*.whl"))
    assert f"skinny.archs='{archs}'" in proc.stdout + proc.stderr
