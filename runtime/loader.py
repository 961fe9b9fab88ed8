"""Process state: when the artifacts load, which folder, the devices found; and the entry point for bench code.

When loading happens. Importing skinny_gemm calls no CUDA API: a process that
forks workers after importing (vLLM does) must leave CUDA uninitialized for
them, and cuInit in the parent would break CUDA in every forked child without
torch knowing. Loading runs when torch initializes CUDA in this process (a
``torch.cuda._lazy_call`` hook), or right at import if torch already has. That
is before any CUDA tensor exists, so before any graph capture can start.

What loading does: cuInit, one capability query per visible GPU, and for each
arch those capabilities map to (``manifest.ARCH_FOR_CAPABILITY``) one read of
``<root>/<arch>/manifest.json`` through the manifest validator. Nothing else:
no cubin is read and nothing is loaded into the driver until a planned shape
is first called on a device (runtime/devices.py), so the cost does not grow
with the catalogue. A manifest that fails its checks refuses that arch only.

Refusals. A missing or corrupted cubin, a cubin or manifest for another arch,
a manifest from another package version, a parameter layout that differs from
the runtime's ABI: those variants (or the whole manifest) are refused, one
``ArtifactWarning`` names each problem and file (at load for a manifest, at
first use for a variant), and their shapes fall back to F.linear. Nothing
refused is ever launched.

The folder. ``$SKINNY_GEMM_ARTIFACTS`` (a folder holding ``<arch>/``
subfolders) replaces the package's own artifacts; ``skinny-gemm env`` prints
which folder is in use, ``skinny-gemm verify`` checks it, and loading warns
once (``ArtifactsOverrideWarning``) while it is set.

For benchmark and tuning code, the explicit entry point (any artifact dir,
every variant bound at once, any (n, k) a variant's config accepts)::

    table = load_dir("artifacts/sm_90a", device=0)   # DeviceTable; .refused / .library.refused say why not
    table.launch(variant_id, x, w, out, residual, n, k)   # tensors or ints; residual None = none;
                                                          # torch's current stream unless stream= is given
    rec = table.launch_for(variant_id, n, k)          # or: a prebuilt record (checks the config fits n, k)
    driver.launch(rec, a_ptr, w_ptr, out_ptr, residual_ptr, stream)   # ints; raises DriverError if refused;
                                                          # w_ptr of a rec.tma ("wgmma") record: its map
                                                          # (tensormaps.weight_map), not the weight

The caller owns shapes there: x holds ``config.m`` rows of k, out ``config.m``
rows of n, all 16-byte aligned and contiguous. ``table.table`` maps every
planned ``(n, k, m)`` to its ready record.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import driver as drv
from .artifacts import (
    ENV_ARTIFACTS,
    PACKAGE_ARTIFACTS,
    Library,
    artifacts_override,
    artifacts_root,
    open_dir,
)
from .devices import DeviceTable, warn
from .driver import DriverError
from .manifest import ARCH_FOR_CAPABILITY, MANIFEST_NAME

__all__ = [
    "DEVICES",
    "STATE",
    "ArtifactsOverrideWarning",
    "State",
    "ensure_loaded",
    "install_hook",
    "load",
    "load_dir",
]

log = logging.getLogger("skinny_gemm")


class ArtifactsOverrideWarning(UserWarning):
    """$SKINNY_GEMM_ARTIFACTS is set: the artifacts come from that folder, not from the package."""


@dataclass
class State:
    """What the automatic load found: driver, devices, libraries; diagnostics reads it."""

    loaded: bool = False
    error: str | None = None
    driver_version: int | None = None
    seconds: float = 0.0
    root: Path | None = None
    missing: list[str] = field(default_factory=list)  # "<arch>/manifest.json" a visible GPU needs and root lacks
    libraries: dict[str, Library] = field(default_factory=dict)


STATE = State()
# Device ordinal -> DeviceTable, filled by load(); the dispatch path reads it.
DEVICES: dict[int, DeviceTable] = {}
_LOAD_LOCK = threading.Lock()


def load() -> State:
    """Load every visible GPU's manifests once (the torch-init hook and the dispatch path call this)."""
    with _LOAD_LOCK:
        if STATE.loaded:
            return STATE
        start = time.perf_counter()
        pending: list[tuple[list[str], str]] = []
        override = artifacts_override()
        try:
            _load_all(pending)
        except Exception as exc:  # noqa: BLE001  (never break torch's CUDA init or an import: fall back)
            STATE.error = f"{type(exc).__name__}: {exc}"
            DEVICES.clear()
            pending.append(([f"loading failed: {STATE.error}"], "all artifacts"))
        STATE.seconds = time.perf_counter() - start
        STATE.loaded = True
    # Warned once the state is complete, so warnings-as-errors cannot leave it half loaded.
    if override:
        lacks = (
            f"; it has no {', no '.join(STATE.missing)}: the GPUs that need it fall back to F.linear"
            if STATE.missing
            else ""
        )
        warnings.warn(
            f"skinny_gemm: ${ENV_ARTIFACTS} is set: artifacts come from {STATE.root or override}, not from the "
            f"package's {PACKAGE_ARTIFACTS}{lacks}",
            ArtifactsOverrideWarning,
            stacklevel=2,
        )
    for problems, what in pending:
        warn(problems, what)
    return STATE


def _load_all(pending: list) -> None:
    STATE.root = artifacts_root()
    try:
        STATE.driver_version = drv.init()
    except DriverError as exc:
        STATE.error = str(exc)
        return
    found = drv.devices()
    for arch in sorted({ARCH_FOR_CAPABILITY[cap] for _, _, cap in found if cap in ARCH_FOR_CAPABILITY}):
        directory = STATE.root / arch
        lib = open_dir(directory, arch)
        STATE.libraries[arch] = lib
        if lib.error is not None and not os.path.lexists(directory / MANIFEST_NAME):
            STATE.missing.append(f"{arch}/{MANIFEST_NAME}")
        if lib.error is not None and not os.path.lexists(directory):
            # Warned, not logged: a wheel built for another arch otherwise falls back everywhere unnoticed.
            names = ", ".join(name for _, name, cap in found if ARCH_FOR_CAPABILITY.get(cap) == arch)
            pending.append(
                (
                    [
                        f"this installation has no {arch} cubins ({directory} is missing) for {names}; "
                        f"install the wheel built for {arch} (or both archs)"
                    ],
                    f"GPUs of arch {arch}",
                )
            )
        else:
            pending.append((lib.problems(), f"artifacts for {arch}"))
    for ordinal, name, cap in found:
        arch = ARCH_FOR_CAPABILITY.get(cap)
        DEVICES[ordinal] = DeviceTable(ordinal, name, cap, arch, STATE.libraries.get(arch))
    for table in DEVICES.values():
        table.bind()
        if table.error:
            pending.append(([f"GPU {table.ordinal}: {table.error}"], f"kernels on GPU {table.ordinal}"))


def ensure_loaded() -> State:
    """Load now if the automatic load has not run yet."""
    return STATE if STATE.loaded else load()


def _hook() -> None:
    """The torch-init callback: an exception here would fail torch's own CUDA init, so none escapes."""
    try:
        load()
    except Exception:
        log.exception("skinny_gemm: loading artifacts failed; everything falls back to F.linear")


def install_hook() -> None:
    """Load when torch initializes CUDA (at once if it already has); called at import of skinny_gemm."""
    lazy_call = getattr(torch.cuda, "_lazy_call", None)
    if lazy_call is not None:
        lazy_call(_hook)  # runs _hook now if torch's CUDA is already initialized
    elif torch.cuda.is_initialized():
        _hook()


def load_dir(path, device=0) -> DeviceTable:
    """Load an artifact dir and bind every variant to CUDA ``device`` (int or torch.device) now: for bench and tuning.

    Unlike the automatic load it is eager (bench code times every variant) and ignores $SKINNY_GEMM_ARTIFACTS.
    """
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    # Bench code runs on this device anyway: make sure torch's context exists so binding needs none of ours.
    torch.cuda.synchronize(ordinal)
    drv.init()
    cap = drv.capability(ordinal)
    arch = ARCH_FOR_CAPABILITY.get(cap)
    lib = open_dir(Path(path), arch)
    warn(lib.problems(), f"artifacts in {path}")
    table = DeviceTable(ordinal, torch.cuda.get_device_name(ordinal), cap, arch, lib)
    warn(table.bind_all(), f"kernels in {path} on GPU {ordinal}")
    return table


def __getattr__(name):
    # ``loader.driver`` is the driver module in use (runtime/driver.py owns it).
    if name == "driver":
        return drv.driver
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
