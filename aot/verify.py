"""Verify a build directory or a wheel: every problem is one line; nothing is compiled, cutlass is not needed.

The manifest and every variant go through the runtime's own checks
(runtime/artifacts.py), so verify refuses exactly what the loader would, with
the same line; on top it checks what only a build knows: the plan table and
kernel sources the build was made from, and files the manifest does not name.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import stat
import tempfile
import zipfile
import zlib
from pathlib import Path, PurePosixPath

from ..runtime.artifacts import artifacts_root, open_dir
from ..runtime.files import MANIFEST_CAP, FileProblem, read_bounded
from ..runtime.jsonfile import printable
from ..runtime.jsonfile import where as shown
from ..runtime.manifest import MANIFEST_NAME
from .build import PACKAGE_ROOT, BuildError, source_digest

# What a wheel may unpack to: its entries are checked against these before anything is written.
WHEEL_ENTRY_CAP = 64 * 1024 * 1024
WHEEL_TOTAL_CAP = 512 * 1024 * 1024
WHEEL_FILE_CAP = 512 * 1024 * 1024


def _tree_version(root: Path) -> str | None:
    """The package version as the tree at ``root`` declares it (runtime/version.py)."""
    try:
        text = read_bounded(root / "runtime" / "version.py", MANIFEST_CAP).decode("utf-8", "replace")
    except FileProblem:
        return None
    found = re.search(r'__version__\s*=\s*"([^"]+)"', text)
    return found.group(1) if found else None


def verify_arch_dir(arch_dir: Path, tree: Path) -> list[str]:
    """Check one ``<arch>/`` folder against the source tree it claims to be built from."""
    arch_dir = Path(arch_dir)
    where = arch_dir.name
    lib = open_dir(arch_dir, where, version=_tree_version(tree))
    if lib.manifest is None:
        return [lib.error]
    raw = lib.manifest.raw
    problems: list[str] = []
    plan_file = tree / raw["plan_file"]  # the manifest's check keeps it a relative path inside the tree
    try:
        plan_blob = read_bounded(plan_file, MANIFEST_CAP)
    except FileProblem as exc:
        problems.append(f"{where}: plan table {raw['plan_file']} in {tree}: {exc}")
    else:
        if hashlib.sha256(plan_blob).hexdigest() != raw["plan_sha256"]:
            problems.append(f"{where}: stale build: {raw['plan_file']} changed after the build (plan_sha256 differs)")
    try:
        if source_digest(tree) != raw["source_sha256"]:
            problems.append(f"{where}: stale build: kernel sources changed after the build (source_sha256 differs)")
    except (OSError, BuildError) as exc:
        problems.append(f"{where}: kernel sources unreadable in {shown(tree)} ({exc})")
    problems += lib.check_all()
    known = {MANIFEST_NAME} | set(lib.manifest.files.values())
    for entry in sorted(arch_dir.iterdir()):
        if entry.name not in known:
            problems.append(f"{shown(entry)}: orphan file, not in the manifest")
    return problems


def _unpack(path: Path, dest: str) -> str | None:
    """Extract a wheel into ``dest`` after checking every entry; the one-line problem, or None."""
    try:
        # Read first, bounded and non-blocking: a FIFO named *.whl must not hang verify.
        blob = read_bounded(path, WHEEL_FILE_CAP)
        with zipfile.ZipFile(io.BytesIO(blob)) as whl:
            entries = whl.infolist()
            total, names = 0, set()
            for info in entries:
                if not printable(info.filename):
                    return f"{shown(path)}: entry {ascii(info.filename)} is not a printable name"
                if info.filename in names:
                    # extractall would write both, the last one winning: what is verified must be what pip installs.
                    return f"{shown(path)}: entry {info.filename!r} appears twice"
                names.add(info.filename)
                name = PurePosixPath(info.filename)
                if info.filename.startswith("/") or "\\" in info.filename or ".." in name.parts or ":" in info.filename:
                    return f"{path}: entry {info.filename!r} is not a plain path inside the wheel"
                if stat.S_ISLNK(info.external_attr >> 16):
                    return f"{path}: entry {info.filename!r} is a symbolic link"
                if info.flag_bits & 0x1:
                    return f"{path}: entry {info.filename!r} is encrypted"
                if info.file_size > WHEEL_ENTRY_CAP:
                    return f"{path}: entry {info.filename!r} unpacks to {info.file_size} bytes, over {WHEEL_ENTRY_CAP}"
                total += info.file_size
            if total > WHEEL_TOTAL_CAP:
                return f"{path}: unpacks to {total} bytes, over {WHEEL_TOTAL_CAP}"
            whl.extractall(dest)
    except FileProblem as exc:
        return f"{shown(path)}: wheel {exc}"
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        zipfile.LargeZipFile,
        NotImplementedError,
        RuntimeError,
        ValueError,
        zlib.error,
    ) as exc:
        return f"{path}: not a readable wheel ({type(exc).__name__}: {exc})"
    return None


def verify(path: Path | None = None, tree: Path | None = None) -> tuple[list[str], list[str]]:
    """Verify a build dir (holding ``<arch>/`` folders, or one of them) or a ``.whl``.

    Returns (arch names checked, problems). A wheel is checked against its own
    sources; a directory against ``tree`` (default: the package running this).
    Without ``path``: what the loader would load (``$SKINNY_GEMM_ARTIFACTS`` or the package's artifacts).
    """
    path = Path(path) if path is not None else artifacts_root()
    if path.suffix == ".whl":
        with tempfile.TemporaryDirectory(prefix="skinny-verify-") as tmp:
            problem = _unpack(path, tmp)
            if problem:
                return [], [problem]
            root = Path(tmp) / "skinny_gemm"
            archs, problems = verify(root / "artifacts", tree=root)
            # Name files by their place in the wheel, not by the temporary folder.
            return archs, [line.replace(f"{tmp}{os.sep}", f"{path}!") for line in problems]
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
