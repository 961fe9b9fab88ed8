"""The artifact checks, with no driver: which folder, its manifest, and each variant's record and cubin.

``verify``, ``env`` and the loader all run these, so they refuse the same
things with the same one-line reason, each naming the file. A problem in a
manifest refuses that manifest (that arch) only; a problem in a variant's
record or cubin refuses that variant only. Variants are checked one at a time
(``Library.check``), when first needed: the loader checks only the variants of
the shapes a process runs; verify and env check them all (``check_all``). A
check keeps the record, never the cubin's bytes: ``Library.image`` reads and
checks them again for the one caller that needs them (the driver load), so a
report that checks every variant leaves no cubin in memory.
"""

from __future__ import annotations

import hashlib
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..kernels.config import SMEM_PER_CTA, KernelConfig
from . import elf
from .files import CUBIN_CAP, FileProblem, read_bounded
from .manifest import (
    MANIFEST_NAME,
    PARAMS,
    Manifest,
    ManifestError,
    Variant,
    VariantError,
    parse,
)
from .version import __version__

ENV_ARTIFACTS = "SKINNY_GEMM_ARTIFACTS"
PACKAGE_ARTIFACTS = Path(__file__).resolve().parent.parent / "artifacts"
EXPECTED_PARAMS = [(i, off, size) for i, (_, off, size) in enumerate(PARAMS)]


def artifacts_override() -> str | None:
    """$SKINNY_GEMM_ARTIFACTS when set (and not empty): a folder of ``<arch>/`` to use instead of the package's."""
    return os.environ.get(ENV_ARTIFACTS) or None


def artifacts_root() -> Path:
    """The folder holding ``<arch>/manifest.json`` that the loader reads: the override (made absolute now, so
    a later ``chdir`` cannot move the cubins read at first use), else the package's."""
    env = artifacts_override()
    return Path(os.path.abspath(env)) if env else PACKAGE_ARTIFACTS


@dataclass(eq=False)
class Library:
    """One ``<arch>/`` folder: its manifest (or why none), the variants refused and why, and what passed.

    ``kernels`` is filled by the driver layer (runtime/devices.py) as variants are
    loaded; this module never touches the driver.
    """

    directory: Path
    manifest: Manifest | None = None
    error: str | None = None
    refused: dict[str, str] = field(default_factory=dict)  # cubin file name -> reason
    passed: dict[str, Variant] = field(default_factory=dict, repr=False)  # id -> record whose cubin passed
    kernels: dict = field(default_factory=dict)  # id -> devices.Kernel, once loaded into the driver
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)

    def line(self, file: str) -> str:
        """The one-line refusal of ``file`` (a cubin name), naming its path."""
        return f"{self.directory / file}: {self.refused[file]}"

    def problems(self) -> list[str]:
        """One line per refusal found so far, each naming the file."""
        if self.error is not None:
            return [self.error]
        return [self.line(name) for name in self.refused]

    def check(self, vid: str) -> Variant | None:
        """Variant ``vid``'s record if every host check passes (once; the record is cached, the bytes are not)."""
        with self.lock:
            found = self.passed.get(vid)
            if found is not None:
                return found
            checked = self.image(vid)
            return None if checked is None else checked[0]

    def image(self, vid: str) -> tuple[Variant, bytes] | None:
        """Variant ``vid``'s record and cubin bytes, read and host-checked now, or None if refused.

        The bytes are the caller's (the driver load): what is loaded is what was just checked, and nothing
        here keeps them. A failed check refuses the variant for good.
        """
        with self.lock:
            if self.manifest is None or vid not in self.manifest.files:
                return None
            file = self.manifest.files[vid]
            if file in self.refused:
                return None
            try:
                variant, blob = _check_variant(self.manifest, vid)
            except VariantError as exc:
                self.refused[file] = str(exc)
                return None
            except Exception as exc:  # noqa: BLE001  (a check that failed itself refuses this variant only)
                self.refused[file] = f"malformed variant ({type(exc).__name__}: {exc})"
                return None
            self.passed[vid] = variant
            return variant, blob

    def check_all(self) -> list[str]:
        """Host-check every variant (verify and env do; the loader does not): the refusal lines."""
        if self.manifest is not None:
            for vid in self.manifest.files:
                self.check(vid)
        return self.problems()

    def planned(self) -> dict[tuple[int, int, int], str]:
        """(n, k, m) -> variant id, for every plan entry whose variant is not refused (so far)."""
        if self.manifest is None:
            return {}
        bad = self.refused
        return {key: vid for key, vid in self.manifest.plans.items() if self.manifest.files[vid] not in bad}


def open_dir(directory: Path, arch: str | None, version: str | None = __version__) -> Library:
    """Read and check one artifact folder's manifest (its variants are checked on demand)."""
    lib = Library(Path(directory))
    path = lib.directory / MANIFEST_NAME
    if not os.path.lexists(path):
        lib.error = f"{path}: no manifest (missing or incomplete artifact dir)"
        return lib
    try:
        lib.manifest = parse(path, expected_version=version, expected_arch=arch)
    except ManifestError as exc:
        lib.error = str(exc)
    except Exception as exc:  # noqa: BLE001  (a check that failed itself refuses this manifest only)
        lib.error = f"{path}: malformed manifest ({type(exc).__name__}: {exc})"
    return lib


def _check_variant(man: Manifest, vid: str) -> tuple[Variant, bytes]:
    """The record and cubin of one variant after every host check; raises VariantError with the reason."""
    v = man.variant(vid)
    try:
        blob = read_bounded(man.directory / v.file, CUBIN_CAP)
    except FileProblem as exc:
        raise VariantError(f"cubin {exc} (variant {vid})") from None
    if len(blob) != v.size or hashlib.sha256(blob).hexdigest() != v.sha256:
        raise VariantError("sha256 mismatch (corrupted or replaced)")
    check_cubin(blob, v.config, man.arch)
    return v, blob


def check_cubin(blob: bytes, cfg: KernelConfig, arch: str) -> elf.CubinInfo:
    """What the cubin says of itself against what variant ``cfg`` for ``arch`` must be: the target, the symbol,
    the parameter ABI, the block (``cfg.launch``) and shared memory within the arch's per-CTA limit. The build
    checks each cubin it writes with it and the runtime each cubin it reads, so both refuse the same cubins.
    Raises VariantError with the reason."""
    try:
        info = elf.inspect(blob)
    except elf.CubinError as exc:
        raise VariantError(f"not a valid cubin: {exc}") from None
    if info.arch != arch:
        raise VariantError(f"ELF arch is {info.arch}, manifest says {arch}")
    kernel = info.kernels.get(cfg.symbol)
    if kernel is None:
        raise VariantError(f"symbol {cfg.symbol} not in cubin ({sorted(info.kernels)})")
    if kernel.params != EXPECTED_PARAMS:
        raise VariantError(f"{cfg.symbol} parameter layout {kernel.params} is not the ABI {EXPECTED_PARAMS}")
    shape = cfg.launch()
    if kernel.reqntid is not None and tuple(kernel.reqntid) != shape.block:
        raise VariantError(f"REQNTID {list(kernel.reqntid)} differs from the variant's block {list(shape.block)}")
    limit = SMEM_PER_CTA.get(arch)
    if limit is not None and kernel.shared + shape.smem > limit:
        # the driver would refuse the launch (or the opt-in) on every call: refuse the variant once, here
        raise VariantError(
            f"{cfg.symbol} takes {kernel.shared} bytes of static and {shape.smem} of dynamic shared memory, "
            f"over the {limit} a CTA may take on {arch}"
        )
    return info
