"""Fixtures for the build tests: one real build of both architectures per session (cached compile)."""

import shutil
from pathlib import Path

import pytest

from skinny_gemm.aot import build

ARCHS = ("sm_90a", "sm_121")


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """A clean build (empty cache) of both archs: {"root": dir holding <arch>/, "results": {arch: BuildResult}}."""
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
    src = build.PACKAGE_ROOT
    dest = tmp_path / "tree"
    for rel in ("kernels", "runtime"):
        shutil.copytree(src / rel, dest / rel, ignore=shutil.ignore_patterns("__pycache__"))
    return Path(dest)
