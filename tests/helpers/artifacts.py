"""Shared fixtures and helpers for tests that need built artifacts: one build per pytest session, private
copies to damage, a loader with a clean state and a FakeDriver, the kinds of damage verify and the loader
must refuse alike, and a wheel-shaped zip of a build (tests/conftest.py makes the fixtures visible)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import warnings
import zipfile
from pathlib import Path

import pytest

from helpers.fake_driver import FakeDriver
from skinny_gemm.runtime import driver as driver_mod
from skinny_gemm.runtime import loader
from skinny_gemm.runtime.artifacts import ENV_ARTIFACTS
from skinny_gemm.runtime.devices import ArtifactWarning
from skinny_gemm.runtime.manifest import ARCHS, MANIFEST_NAME

# A wheel of one arch is tagged 0 + its name without the underscore (pyproject.toml's overrides).
WHEEL_TAGS = {arch: "0" + arch.replace("_", "") for arch in ARCHS}


def arch_wheels(folder: Path, arch: str) -> list[Path]:
    """The wheels in ``folder`` (CI's $SKINNY_WHEELS) built for ``arch`` alone."""
    return sorted(Path(folder).glob(f"skinny_gemm-*-{WHEEL_TAGS[arch]}-py3-none-any.whl"))


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """The session's one build: both archs, clean (empty cache): {"root": dir of <arch>/, "cache", "results"}."""
    pytest.importorskip("cutlass", reason="building artifacts needs nvidia-cutlass-dsl")
    from skinny_gemm.aot import build

    root = tmp_path_factory.mktemp("artifacts")
    cache = tmp_path_factory.mktemp("cache")
    results = {arch: build.build(arch, root, cache_dir=cache, jobs=2, progress=False) for arch in ARCHS}
    return {"root": root, "cache": cache, "results": results}


@pytest.fixture
def build_copy(built, tmp_path):
    """A private copy of the session build, free to tamper with."""
    dest = tmp_path / "artifacts"
    shutil.copytree(built["root"], dest)
    return dest


@pytest.fixture
def tree_copy(tmp_path):
    """A copy of the files verify reads from the source tree (plan tables, kernel sources, version)."""
    from skinny_gemm.aot import build

    dest = tmp_path / "tree"
    for rel in ("kernels", "runtime"):
        shutil.copytree(build.PACKAGE_ROOT / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
    return Path(dest)


@pytest.fixture
def art(built, tmp_path, monkeypatch):
    """A private copy of the built artifacts, used through $SKINNY_GEMM_ARTIFACTS."""
    root = tmp_path / "art"
    shutil.copytree(built["root"], root)
    monkeypatch.setenv(ENV_ARTIFACTS, str(root))
    return root


@pytest.fixture
def fresh(monkeypatch):
    """Give the loader a clean state; returns run(caps, active, setup) that installs a FakeDriver and loads.

    The fake it returns has ``.warnings``: the ArtifactWarnings of that load.
    """
    monkeypatch.setattr(loader, "STATE", loader.State())
    monkeypatch.setattr(loader, "DEVICES", {})

    def run(caps=((9, 0),), active=None, setup=None):
        fake = FakeDriver(caps, active)
        if setup:
            setup(fake)
        monkeypatch.setattr(driver_mod, "driver", fake)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader.load()
        fake.warnings = [w for w in caught if issubclass(w.category, ArtifactWarning)]
        fake.override_warnings = [w for w in caught if issubclass(w.category, loader.ArtifactsOverrideWarning)]
        return fake

    return run


def bind_all(ordinal=0) -> list[str]:
    """Bind every planned shape of a loaded device (what first calls of all its shapes would do): warnings' text."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        table = loader.DEVICES[ordinal].bind()
        for key in list(table):
            table.get(key)
    return [str(w.message) for w in caught if issubclass(w.category, ArtifactWarning)]


def manifest_of(root, arch="sm_90a"):
    return json.loads((Path(root) / arch / MANIFEST_NAME).read_text())


def write_manifest(root, data, arch="sm_90a"):
    (Path(root) / arch / MANIFEST_NAME).write_text(json.dumps(data))


def first_variant(root, arch="sm_90a"):
    return manifest_of(root, arch)["variants"][0]


def plans_of(root, variant_id, arch="sm_90a"):
    return {(p["n"], p["k"], p["m"]) for p in manifest_of(root, arch)["plans"] if p["variant"] == variant_id}


def all_plans(root, arch="sm_90a"):
    return {(p["n"], p["k"], p["m"]) for p in manifest_of(root, arch)["plans"]}


def the_warning(fake):
    assert len(fake.warnings) == 1, [str(w.message) for w in fake.warnings]
    return str(fake.warnings[0].message)


def rehash(arch_dir: Path, variant: dict) -> None:
    """Make the manifest record of ``variant`` match its (tampered) cubin again: the damage is then only inside."""
    data = json.loads((arch_dir / MANIFEST_NAME).read_text())
    blob = (arch_dir / variant["file"]).read_bytes()
    for v in data["variants"]:
        if v["id"] == variant["id"]:
            v["sha256"], v["size"] = hashlib.sha256(blob).hexdigest(), len(blob)
    (arch_dir / MANIFEST_NAME).write_text(json.dumps(data))


def contradicting_cluster(variant: dict) -> int:
    """A cluster size the variant's config does not reduce across (its ``split`` is the only valid one)."""
    return 2 if variant["config"].get("split", 1) == 1 else 1


def _edit(arch_dir: Path, change) -> None:
    data = json.loads((arch_dir / MANIFEST_NAME).read_text())
    change(data)
    (arch_dir / MANIFEST_NAME).write_text(json.dumps(data))


def _variant_edit(key, value):
    def change(data):
        data["variants"][0][key] = value

    return change


# Variant damage: name -> (what it does to <arch>/ given its first variant, a phrase the refusal holds).
# Each refuses that variant only, with one line naming the cubin's path.
VARIANT_DAMAGE = {
    "flipped byte": (lambda d, v: _flip(d / v["file"]), "sha256 mismatch"),
    "missing cubin": (lambda d, v: (d / v["file"]).unlink(), "cubin missing"),
    "truncated, rehashed": (lambda d, v: (_truncate(d / v["file"]), rehash(d, v)), "not a valid cubin"),
    "fifo": (lambda d, v: ((d / v["file"]).unlink(), os.mkfifo(d / v["file"])), "a FIFO, not a regular file"),
    "directory": (lambda d, v: ((d / v["file"]).unlink(), (d / v["file"]).mkdir()), "a directory"),
    "params in the record": (lambda d, v: _edit(d, _variant_edit("params", [["a", 0, 8]])), "parameter layout"),
    "size a float": (lambda d, v: _edit(d, _variant_edit("size", float(v["size"]))), "field 'size' is"),
    "size a string": (lambda d, v: _edit(d, _variant_edit("size", str(v["size"]))), "field 'size' is"),
    "block a number": (lambda d, v: _edit(d, _variant_edit("block", 128)), "field 'block' is"),
    "huge size": (lambda d, v: _edit(d, _variant_edit("size", 10**30)), "field 'size' is"),
    "config a list": (lambda d, v: _edit(d, _variant_edit("config", [1, 2])), "field 'config' is"),
    "cluster contradicts": (
        lambda d, v: _edit(
            d, lambda m: m["variants"][0]["grid"].update(cluster=contradicting_cluster(m["variants"][0]))
        ),
        "contradicts its config",
    ),
    "dynamic smem contradicts": (lambda d, v: _edit(d, _variant_edit("dynamic_smem", 4096)), "contradicts its config"),
}
# Manifest damage: name -> (what it does to <arch>/, a phrase the refusal holds). Each refuses that manifest
# (that arch) only, with one line naming manifest.json.
MANIFEST_DAMAGE = {
    "not json": (lambda d: (d / MANIFEST_NAME).write_text("{not json"), "unreadable manifest"),
    "Infinity": (
        lambda d: (d / MANIFEST_NAME).write_text(
            (d / MANIFEST_NAME).read_text().replace('"schema": 1', '"schema": 1, "x": Infinity')
        ),
        "not a JSON number",
    ),
    "deep nesting": (
        lambda d: (d / MANIFEST_NAME).write_text(
            (d / MANIFEST_NAME).read_text()[:-2] + ', "x": ' + "[" * 100000 + "]" * 100000 + "}\n"
        ),
        "nested too deeply",
    ),
    "schema a float": (lambda d: _edit(d, lambda m: m.update(schema=1.0)), "manifest schema 1.0"),
    "version a number": (lambda d: _edit(d, lambda m: m.update(package_version=1)), "field 'package_version' is"),
    "variants a string": (lambda d: _edit(d, lambda m: m.update(variants="all")), "field 'variants' is"),
    "plan n a float": (
        lambda d: _edit(d, lambda m: m["plans"][0].update(n=float(m["plans"][0]["n"]))),
        "plans[0] field 'n' is",
    ),
    "file ../": (
        lambda d: _edit(d, lambda m: m["variants"][0].update(file="../" + m["variants"][0]["file"])),
        "a plain printable file name inside the artifact folder",
    ),
    "file absolute": (
        lambda d: _edit(d, lambda m: m["variants"][0].update(file=str(d / m["variants"][0]["file"]))),
        "a plain printable file name inside the artifact folder",
    ),
    "abi differs": (lambda d: _edit(d, lambda m: m["abi"]["params"][5].__setitem__(1, 40)), "parameter ABI"),
    "toolchain a string": (lambda d: _edit(d, lambda m: m.update(toolchain="nvcc")), "field 'toolchain' is"),
    "manifest a fifo": (lambda d: ((d / MANIFEST_NAME).unlink(), os.mkfifo(d / MANIFEST_NAME)), "a FIFO"),
}


def _flip(path: Path) -> None:
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    path.write_bytes(bytes(blob))


def _truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def make_wheel(root: Path, dest: Path, archs=ARCHS, extra: dict | None = None) -> Path:
    """A zip laid out as the wheel is (skinny_gemm/artifacts/<arch>/..., the kernels and version verify reads).

    ``extra`` maps more entry names to bytes (hostile names included). FIFOs and folders in place of a
    cubin cannot be zipped: those entries are left out (the cubin is then missing in the wheel).
    """
    from skinny_gemm.aot.build import PACKAGE_ROOT

    with zipfile.ZipFile(dest, "w", zipfile.ZIP_DEFLATED) as whl:
        for arch in archs:
            for path in sorted((Path(root) / arch).iterdir()):
                if path.is_file() and not path.is_symlink():
                    whl.write(path, f"skinny_gemm/artifacts/{arch}/{path.name}")
        for rel in ("kernels", "runtime"):
            for path in sorted((PACKAGE_ROOT / rel).rglob("*")):
                if path.is_file() and "__pycache__" not in path.parts:
                    whl.write(path, f"skinny_gemm/{path.relative_to(PACKAGE_ROOT)}")
        for name, data in (extra or {}).items():
            whl.writestr(name, data)
    return dest
