"""Per-device binding, lazily: a variant is loaded into the driver and bound to a device at its first call there.

A process pays for what it runs, not for the catalogue. Loading (loader.py)
reads and checks only the manifest of each arch a visible GPU can run. The
first call of a planned (n, k, m) on a device then, for its variant, once per
process: checks the record, reads the cubin (bounded), checks its sha256, ELF
arch, symbol and parameter records (runtime/artifacts.py) and
``cuLibraryLoadData``s it (context-independent); and once per device:
``cuKernelGetFunction`` under torch's primary context, the parameter layout
the driver reports (``cuKernelGetParamInfo`` needs a current context), the
block limit and the dynamic shared-memory opt-in. The other shapes of that
variant reuse all of it.

Inside a graph capture those calls run in relaxed capture mode, which permits
them without adding a node to the graph. A driver failure inside a capture may
be the capture's doing, so it refuses nothing for good: that call falls back
and the next call outside the capture tries again. A host-check failure
(damaged file, wrong record) is the file's doing and refuses the variant at
once, inside a capture or not. Every refusal is warned about once, naming the
file; the refused variant's shapes fall back to F.linear.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from . import driver as drv
from . import tensormaps
from .artifacts import Library
from .driver import DriverError, Launch, call
from .manifest import Variant

# Dynamic shared memory above this needs an explicit opt-in per function.
DEFAULT_SMEM_LIMIT = 48 * 1024


class ArtifactWarning(UserWarning):
    """Some artifacts were refused; their shapes fall back to F.linear."""


def warn(problems: list[str], what: str, stacklevel: int = 3) -> None:
    """One ArtifactWarning listing ``problems`` (nothing if there are none)."""
    if problems:
        warnings.warn(
            f"skinny_gemm refused {what}; those shapes fall back to F.linear:\n  " + "\n  ".join(problems),
            ArtifactWarning,
            stacklevel=stacklevel,
        )


@dataclass
class Kernel:
    """One accepted variant, loaded into the driver: context-independent, shared by every device of its arch."""

    variant: Variant
    library: object
    handle: object
    # The image stays referenced: with lazy loading the driver may read it when a context first needs it.
    blob: bytes = field(repr=False, default=b"")


def load_kernel(lib: Library, vid: str, problems: list[str], defer: bool = False) -> Kernel | None:
    """Variant ``vid`` loaded into the driver (once per process), or None.

    A refusal made here is appended to ``problems`` (as its one line) the first
    time only. With ``defer`` (inside a capture) a driver failure refuses nothing.
    """
    with lib.lock:
        kernel = lib.kernels.get(vid)
        if kernel is not None or lib.manifest is None:
            return kernel
        file = lib.manifest.files[vid]
        if file in lib.refused:
            return None
        checked = lib.image(vid)
        if checked is None:
            problems.append(lib.line(file))
            return None
        variant, blob = checked
        d = drv.driver
        library = None
        try:
            library = call(d.cuLibraryLoadData, blob, None, None, 0, None, None, 0)
            handle = call(d.cuLibraryGetKernel, library, variant.symbol.encode())
        except DriverError as exc:
            if library is not None:
                d.cuLibraryUnload(library)
            if not defer:
                lib.refused[file] = str(exc)
                problems.append(lib.line(file))
            return None
        kernel = lib.kernels[vid] = Kernel(variant, library, handle, blob)
        return kernel


class LaunchTable(Mapping):
    """Planned (n, k, m) -> Launch for one device, bound on first lookup: the dispatch path's table.

    Its keys are the planned shapes not refused so far; ``get`` (the hot path)
    and ``[]`` bind a key's variant on first use and return None / raise
    KeyError if it is refused then. ``bound`` holds the records made so far.
    """

    __slots__ = ("_device", "_plans", "bound")

    def __init__(self, device: DeviceTable, plans: dict):
        self._device, self._plans, self.bound = device, dict(plans), {}

    def get(self, key, default=None):
        rec = self.bound.get(key)
        if rec is not None:
            return rec
        if key not in self._plans:
            return default
        rec = self._device.resolve(key)
        return default if rec is None else rec

    def __getitem__(self, key):
        rec = self.get(key)
        if rec is None:
            raise KeyError(key)
        return rec

    def __contains__(self, key):
        return key in self._plans

    def __iter__(self):
        return iter(list(self._plans))

    def __len__(self):
        return len(self._plans)

    def __delitem__(self, key):
        """Drop a key for good (a launch the driver refused): it falls back from now on."""
        self._plans.pop(key, None)
        self.bound.pop(key, None)

    def drop_variant(self, vid: str) -> None:
        for key in [key for key, planned in self._plans.items() if planned == vid]:
            del self[key]

    def variant_of(self, key) -> str | None:
        return self._plans.get(key)

    def __repr__(self):
        return f"LaunchTable({len(self._plans)} planned, {len(self.bound)} bound)"


@dataclass(eq=False)
class DeviceTable:
    """One GPU: what it is, the library for its arch, and (once torch made its context) its launch table."""

    ordinal: int
    name: str
    capability: tuple[int, int]
    arch: str | None
    library: Library | None
    table: LaunchTable | None = None
    functions: dict[str, object] = field(default_factory=dict)  # variant id -> CUfunction on this device
    refused: dict[str, str] = field(default_factory=dict)  # cubin file -> why this device refused it
    error: str | None = None
    lock: threading.RLock = field(default_factory=threading.RLock, repr=False)
    _records: dict = field(default_factory=dict, repr=False)

    def bind(self) -> Mapping:
        """This device's launch table; {} (and no table yet) until torch has made its primary context."""
        with self.lock:
            if self.table is not None:
                return self.table
            lib = self.library
            if lib is None or lib.manifest is None:
                self.table = LaunchTable(self, {})
                return self.table
            try:
                d = drv.driver
                _, active = call(d.cuDevicePrimaryCtxGetState, call(d.cuDeviceGet, self.ordinal))
            except DriverError as exc:
                self.error = f"binding failed: {exc}"
                self.table = LaunchTable(self, {})
                return self.table
            if not active:
                return {}
            self.table = LaunchTable(self, lib.planned())
            return self.table

    def resolve(self, key):
        """Bind the planned ``key`` (loading its variant if need be); its Launch, or None (then F.linear runs)."""
        problems: list[str] = []
        with self.lock:
            table = self.table
            rec = table.bound.get(key)
            vid = table.variant_of(key)
            if rec is None and vid is not None:
                fn = self.function(vid, problems)
                if fn is not None:
                    variant = self.library.kernels[vid].variant
                    rec = table.bound[key] = Launch(variant, fn, key[0], key[1])
        warn(problems, f"kernels on GPU {self.ordinal}", stacklevel=5)
        return rec

    def function(self, vid: str, problems: list[str]):
        """Variant ``vid``'s function handle on this device (binding it once), or None; refusals go to ``problems``."""
        with self.lock:
            fn = self.functions.get(vid)
            if fn is not None or self.library is None or self.library.manifest is None:
                return fn
            file = self.library.manifest.files.get(vid)
            if file is None or file in self.refused:
                return None
            capturing = drv.capturing(self.ordinal)  # the stream this device's launch goes to
            try:
                with drv.relaxed_capture():
                    kernel = load_kernel(self.library, vid, problems, defer=capturing)
                    if kernel is None:
                        if file in self.library.refused and self.table is not None:
                            self.table.drop_variant(vid)
                        return None
                    fn = self._bind(kernel)
            except DriverError as exc:
                if capturing:  # maybe the capture's doing: fall back now, try again outside it
                    return None
                self.refused[file] = str(exc)
                problems.append(f"{self.library.directory / file}: {exc}")
                if self.table is not None:
                    self.table.drop_variant(vid)
                return None
            if fn is not None:
                self.functions[vid] = fn
            return fn

    def _bind(self, kernel: Kernel):
        """cuKernelGetFunction and its checks under this device's primary context; None if torch has none yet."""
        d = drv.driver
        dev = call(d.cuDeviceGet, self.ordinal)
        _, active = call(d.cuDevicePrimaryCtxGetState, dev)
        if not active:
            return None
        ctx = call(d.cuDevicePrimaryCtxRetain, dev)
        try:
            call(d.cuCtxPushCurrent, ctx)
            try:
                return _function(kernel)
            finally:
                call(d.cuCtxPopCurrent)
        finally:
            # The context is torch's (it was active): releasing our reference cannot destroy it.
            d.cuDevicePrimaryCtxRelease(dev)

    def bind_all(self) -> list[str]:
        """Bind every variant of the library now (bench and tuner code; load_dir): the refusal lines."""
        problems: list[str] = []
        table = self.bind()
        if self.library is not None and self.library.manifest is not None and self.table is not None:
            for vid in list(self.library.manifest.files):
                self.function(vid, problems)
            for key in list(table):
                table.get(key)
        return problems

    def plans(self, n: int | None = None, k: int | None = None) -> dict[tuple[int, int, int], Variant]:
        """Planned (n, k, m) -> variant passing the host checks (made now for those variants); optionally one (n, k).

        Driver-side binding is not attempted: a key the driver will refuse at its first call is still listed.
        """
        lib = self.library
        if lib is None or lib.manifest is None:
            return {}
        keys = self.table if self.table is not None else lib.planned()
        found = {}
        for key in list(keys):
            if n is not None and (key[0], key[1]) != (n, k):
                continue
            variant = lib.check(lib.manifest.plans[key])
            if variant is not None:
                found[key] = variant
        return found

    def launch_for(self, variant_id: str, n: int, k: int) -> Launch:
        """A launch record for any loaded variant at (n, k), for bench and tuning code; raises if it cannot run."""
        from ..kernels.config import ConfigError

        key = (variant_id, n, k)
        rec = self._records.get(key)
        if rec is not None:
            return rec
        problems: list[str] = []
        fn = self.function(variant_id, problems) if self.bind() is self.table else None
        warn(problems, f"kernels on GPU {self.ordinal}")
        if fn is None:
            raise KeyError(
                f"variant {variant_id} is not loaded on GPU {self.ordinal} (see .refused, .library.refused, .error)"
            )
        variant = self.library.kernels[variant_id].variant
        try:
            variant.config.check(n=n, k=k)
        except ConfigError as exc:
            raise ValueError(f"{variant_id} cannot run (n={n}, k={k}): {exc}") from None
        rec = self._records[key] = Launch(variant, fn, n, k)
        return rec

    def launch(self, variant_id: str, a, w, out, residual, n: int, k: int, stream=None) -> None:
        """Launch a variant for bench and tuning code: a, w, out, residual are tensors or device pointers
        (residual None or 0: none); ``stream`` a raw handle, default torch's current stream on this GPU.
        The caller owns the shapes: out holds config.m rows of n, a holds config.m rows of k."""
        if stream is None:
            stream = torch.cuda.current_stream(self.ordinal).cuda_stream
        ptrs = [0 if t is None else t if isinstance(t, int) else t.data_ptr() for t in (a, w, out, residual)]
        rec = self.launch_for(variant_id, n, k)
        if rec.tma:  # "wgmma": the 2nd pointer is the weight's tensor map, written on its first (uncaptured) launch
            ptrs[1] = tensormaps.weight_map(self.ordinal, ptrs[1], n, k, rec.variant.config.cols, stream)
            if ptrs[1] is None:
                raise RuntimeError(
                    f"{variant_id}: a weight's first launch on GPU {self.ordinal} is inside a graph capture, "
                    "where its tensor map cannot be written; launch it once before capturing"
                )
        with torch.cuda.device(self.ordinal):  # a NULL stream launches into the current context
            drv.launch(rec, *ptrs, stream)


def _function(kernel: Kernel):
    """The function handle in the current context, after checking what the driver says about it."""
    d = drv.driver
    v = kernel.variant
    fn = call(d.cuKernelGetFunction, kernel.handle)
    # cuKernelGetParamInfo needs a current context (CUDA_ERROR_INVALID_CONTEXT
    # at load on the H200, driver 580): the layout is checked here, at bind.
    layout = [call(d.cuKernelGetParamInfo, kernel.handle, i) for i in range(len(v.params))]
    expected = [(off, size) for _, off, size in v.params]
    if layout != expected:
        raise DriverError(f"driver reports parameter layout {layout}, manifest says {expected}")
    if int(d.cuKernelGetParamInfo(kernel.handle, len(v.params))[0]) == 0:
        raise DriverError(f"driver reports more than the manifest's {len(v.params)} parameters")
    attrs = d.CUfunction_attribute
    most = call(d.cuFuncGetAttribute, attrs.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn)
    shape = v.config.launch()
    if shape.block[0] * shape.block[1] * shape.block[2] > most:
        raise DriverError(f"block {shape.block} exceeds the kernel's {most} threads per block")
    # Past 48 KB of static plus dynamic shared memory a launch needs the opt-in, else CUDA_ERROR_INVALID_VALUE
    # (an "mma" ring of exactly 48 KB beside its static reduction buffers hit that on the H200).
    static = call(d.cuFuncGetAttribute, attrs.CU_FUNC_ATTRIBUTE_SHARED_SIZE_BYTES, fn) if shape.smem else 0
    if shape.smem and shape.smem + static > DEFAULT_SMEM_LIMIT:
        call(d.cuFuncSetAttribute, fn, attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shape.smem)
    return fn
