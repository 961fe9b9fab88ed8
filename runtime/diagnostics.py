"""What ``skinny-gemm env`` prints: versions, GPUs, the manifest in use, variants loaded and refused."""

from __future__ import annotations

import os
from importlib import metadata

import torch

from . import counters, loader
from .artifacts import ENV_ARTIFACTS, PACKAGE_ARTIFACTS, Library, open_dir
from .devices import DeviceTable
from .jsonfile import where
from .manifest import ARCH_FOR_CAPABILITY
from .version import __version__


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "not installed"


def _driver_text(version: int | None) -> str:
    return "unknown" if version is None else f"CUDA {version // 1000}.{version % 1000 // 10} ({version})"


def _library_lines(lib: Library, indent: str) -> list[str]:
    if lib.manifest is None:
        return [f"{indent}artifacts: none usable ({lib.error})"]
    # The loader checks variants at first use; the report checks them all (reads every cubin, no driver).
    lib.check_all()
    m = lib.manifest
    tool = m.raw["toolchain"]  # typed by the manifest validator
    passed = {vid for vid, file in m.files.items() if file not in lib.refused}
    lines = [
        f"{indent}manifest: {m.path}",
        (
            f"{indent}  package {m.package_version}, arch {m.arch}, cutlass-dsl {tool['cutlass_dsl']}, "
            f"ptxas {', '.join(tool['ptxas']) or '?'}"
        ),
        f"{indent}  options: {tool['compile_options']}",
        (
            f"{indent}variants: {len(passed)} of {len(m.files)} pass the host checks, {len(lib.kernels)} loaded "
            f"(at first use), {sum(vid in passed for vid in m.plans.values())} of {len(m.plans)} plan entries usable"
        ),
    ]
    lines += [f"{indent}  refused {name}: {why}" for name, why in lib.refused.items()]
    return lines


def _device_lines(table: DeviceTable) -> list[str]:
    cap = f"{table.capability[0]}.{table.capability[1]}"
    lines = [f"GPU {table.ordinal}: {table.name}, capability {cap} -> {table.arch or 'no target (falls back)'}"]
    if table.library is None:
        return lines
    lines += _library_lines(table.library, "  ")
    if table.table is None:
        lines.append("  kernels: not bound yet (binds at the first call on this GPU)")
    else:
        lines.append(
            f"  kernels bound: {len(table.functions)} (at first use), launch table: {len(table.table)} (n, k, m) "
            f"entries, {len(table.table.bound)} bound"
        )
    lines += [f"  refused on this GPU {name}: {why}" for name, why in table.refused.items()]
    if table.error:
        lines.append(f"  error: {table.error}")
    return lines


def _counters_line() -> str:
    """Where a process's launch and fallback counts go (runtime/counters.py)."""
    path = os.environ.get(counters.ENV_COUNTERS)
    where = f"written to {path} at each process's exit" if path else f"${counters.ENV_COUNTERS} unset: not written"
    return f"counters (launches and fallbacks per (N, K, M)): {where}; in-process: skinny_gemm.counters()"


def env_report() -> str:
    """The environment report: versions, driver, each GPU and its artifacts, or why everything falls back."""
    cuda = torch.cuda.is_available()
    if cuda:
        torch.cuda.init()  # runs the load hook
        state = loader.ensure_loaded()
    # The folder the loader read (fixed at load), not what the variable says now; without a load, what it would read.
    root = loader.STATE.root if loader.STATE.loaded and loader.STATE.root else loader.artifacts_root()
    lines = [
        f"skinny-gemm {__version__}",
        (
            f"torch {torch.__version__} (CUDA {torch.version.cuda or 'none'}), "
            f"cuda-bindings {_dist_version('cuda-bindings')}"
        ),
        f"artifacts root: {where(root)}"
        + (
            f" (from ${ENV_ARTIFACTS}, instead of the package's {PACKAGE_ARTIFACTS})"
            if root != PACKAGE_ARTIFACTS
            else ""
        ),
        _counters_line(),
    ]
    if cuda:
        lines.append(f"driver: {_driver_text(state.driver_version)}; artifacts loaded in {state.seconds * 1e3:.1f} ms")
        if state.error:
            lines.append(f"load error: {state.error}")
        lines += [line for table in loader.DEVICES.values() for line in _device_lines(table)]
        if not loader.DEVICES:
            lines.append("no GPU visible to the driver: every call falls back to F.linear")
        return "\n".join(lines)
    lines.append("GPU: none usable by torch: every call falls back to F.linear")
    # Without a GPU the host-side checks still say whether the installed artifacts are intact.
    for arch in sorted(set(ARCH_FOR_CAPABILITY.values())):
        directory = root / arch
        if os.path.lexists(directory):
            lines.append(f"{arch} (host checks only):")
            lines += _library_lines(open_dir(directory, arch), "  ")
    return "\n".join(lines)
