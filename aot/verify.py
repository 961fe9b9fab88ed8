"""Verify a build directory or a wheel: every problem is one line; nothing is compiled, cutlass is not needed."""

from __future__ import annotations

import hashlib
import re
import tempfile
import zipfile
from pathlib import Path

from ..runtime.manifest import MANIFEST_NAME, PARAMS, ManifestError, launch_problem, parse, sha256_file
from . import cubin as cubin_mod
from .build import PACKAGE_ROOT, source_digest


def _tree_version(root: Path) -> str | None:
    """The package version as the tree at ``root`` declares it (runtime/version.py)."""
    try:
        text = (root / "runtime" / "version.py").read_text()
    except OSError:
        return None
    found = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    return found.group(1) if found else None


def verify_arch_dir(arch_dir: Path, tree: Path) -> list[str]:
    """Check one ``<arch>/`` folder against the source tree it claims to be built from."""
    arch_dir = Path(arch_dir)
    where = arch_dir.name
    problems: list[str] = []
    if not (arch_dir / MANIFEST_NAME).is_file():
        return [f"{arch_dir}: no {MANIFEST_NAME} (an interrupted or missing build)"]
    try:
        man = parse(arch_dir / MANIFEST_NAME, expected_version=_tree_version(tree), expected_arch=where)
    except ManifestError as exc:
        return [str(exc)]
    raw = man.raw
    plan_file = tree / raw.get("plan_file", "")
    if not plan_file.is_file():
        problems.append(f"{where}: plan table {raw.get('plan_file')} not found in {tree}")
    elif hashlib.sha256(plan_file.read_bytes()).hexdigest() != raw.get("plan_sha256"):
        problems.append(f"{where}: stale build: {raw.get('plan_file')} changed after the build (plan_sha256 differs)")
    try:
        if source_digest(tree) != raw.get("source_sha256"):
            problems.append(f"{where}: stale build: kernel sources changed after the build (source_sha256 differs)")
    except OSError as exc:
        problems.append(f"{where}: kernel sources missing in {tree} ({exc})")
    expected_params = [(i, off, size) for i, (_, off, size) in enumerate(PARAMS)]
    for variant in man.variants.values():
        path = arch_dir / variant.file
        launch = launch_problem(variant)
        if launch:
            problems.append(f"{path}: {launch}")
        if not path.is_file():
            problems.append(f"{path}: missing (variant {variant.id})")
            continue
        if sha256_file(path) != variant.sha256 or path.stat().st_size != variant.size:
            problems.append(f"{path}: sha256 mismatch (corrupted or replaced)")
            continue
        try:
            info = cubin_mod.inspect(path.read_bytes())
        except cubin_mod.CubinError as exc:
            problems.append(f"{path}: {exc}")
            continue
        if info.arch != man.arch:
            problems.append(f"{path}: ELF arch is {info.arch}, manifest says {man.arch}")
        kernel = info.kernels.get(variant.symbol)
        if kernel is None:
            problems.append(f"{path}: symbol {variant.symbol} not in cubin")
            continue
        if kernel.params != expected_params:
            problems.append(f"{path}: {variant.symbol} parameter layout {kernel.params} is not the ABI {expected_params}")
        if kernel.reqntid is not None and tuple(kernel.reqntid) != tuple(variant.block):
            problems.append(f"{path}: REQNTID {kernel.reqntid} differs from manifest block {list(variant.block)}")
    known = {MANIFEST_NAME} | {v.file for v in man.variants.values()}
    for entry in sorted(arch_dir.iterdir()):
        if entry.name not in known:
            problems.append(f"{entry}: orphan file, not in the manifest")
    return problems


def verify(path: Path, tree: Path | None = None) -> tuple[list[str], list[str]]:
    """Verify a build dir (holding ``<arch>/`` folders, or one of them) or a ``.whl``.

    Returns (arch names checked, problems). A wheel is checked against its own
    sources; a directory against ``tree`` (default: the package running this).
    """
    path = Path(path)
    if path.suffix == ".whl":
        with tempfile.TemporaryDirectory(prefix="skinny-verify-") as tmp:
            try:
                with zipfile.ZipFile(path) as whl:
                    whl.extractall(tmp)
            except (OSError, zipfile.BadZipFile) as exc:
                return [], [f"{path}: not a readable wheel ({exc})"]
            root = Path(tmp) / "skinny_gemm"
            return verify(root / "artifacts", tree=root)
    tree = Path(tree) if tree else PACKAGE_ROOT
    if (path / MANIFEST_NAME).exists() or path.name.startswith("sm_"):
        dirs = [path]
    else:
        dirs = sorted(d for d in path.iterdir() if d.is_dir() and d.name.startswith("sm_")) if path.is_dir() else []
    if not dirs:
        return [], [f"{path}: no <arch>/manifest.json found"]
    problems: list[str] = []
    for d in dirs:
        problems.extend(verify_arch_dir(d, tree))
    return [d.name for d in dirs], problems
