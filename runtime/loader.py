"""Load the AOT cubins with cuda-python and launch them: the runtime's only contact with the driver.

When loading happens. Importing skinny_gemm calls no CUDA API: a process that
forks workers after importing (vLLM does) must leave CUDA uninitialized for
them, and cuInit in the parent would break CUDA in every forked child without
torch knowing. Loading runs when torch initializes CUDA in this process (a
``torch.cuda._lazy_call`` hook), or right at import if torch already has. That
is before any CUDA tensor exists, so before any graph capture can start.

What loading does. For each visible GPU whose capability maps to a target
(``manifest.ARCH_FOR_CAPABILITY``), that target's ``manifest.json`` is checked
(schema, package version, arch) and so is each cubin (present, sha256, ELF
arch, parameter ABI); each is loaded with ``cuLibraryLoadData``, which is
context-independent and creates no context; each kernel's parameter layout
is read back with ``cuKernelGetParamInfo`` when the device is bound (the call
needs a current context) and compared with the manifest. Function handles need a context: a device is *bound*
(``cuKernelGetFunction`` under its primary context) as soon as torch has made
that context: at load if it exists, else at the first call on that device,
inside a graph capture too (the few binding calls run in relaxed capture mode,
which permits them without adding anything to the graph).

Refusals. A missing or corrupted cubin, a cubin or manifest for another arch,
a manifest from another package version, a parameter layout that differs from
the runtime's ABI: those variants (or the whole manifest) are refused, one
``ArtifactWarning`` per load names each problem and file, and their shapes fall
back to F.linear. Nothing refused is ever launched.

For benchmark and tuning code (any artifact dir, any loaded variant, any (n, k)
the variant's config accepts)::

    table = load_dir("artifacts/sm_90a", device=0)   # DeviceTable; .refused / .library.refused say why not
    table.launch(variant_id, x, w, out, residual, n, k)   # tensors or ints; residual None = none;
                                                          # torch's current stream unless stream= is given
    rec = table.launch_for(variant_id, n, k)          # or: a prebuilt record (checks the config fits n, k)
    launch(rec, a_ptr, w_ptr, out_ptr, residual_ptr, stream)   # ints; raises DriverError if refused

The caller owns shapes there: x holds ``config.m`` rows of k, out ``config.m``
rows of n, all 16-byte aligned and contiguous. ``table.table`` maps every
planned ``(n, k, m)`` to its ready record.

Set ``SKINNY_GEMM_ARTIFACTS`` to a folder holding ``<arch>/`` subfolders to use
artifacts other than the package's own.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import logging
import struct
import os
import threading
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..kernels.config import ConfigError
from .manifest import ARCH_FOR_CAPABILITY, MANIFEST_NAME, PARAMS, Manifest, ManifestError, Variant, launch_problem, parse
from .version import __version__

log = logging.getLogger("skinny_gemm")

ENV_ARTIFACTS = "SKINNY_GEMM_ARTIFACTS"
EM_CUDA = 190
SHT_NOBITS = 8
# Dynamic shared memory above this needs an explicit opt-in per function.
DEFAULT_SMEM_LIMIT = 48 * 1024

# The driver module (cuda.bindings.driver), imported on first load: importing it
# costs about 0.1 s, which an import of skinny_gemm without a GPU should not pay.
driver = None


class ArtifactWarning(UserWarning):
    """Some artifacts were refused; their shapes fall back to F.linear."""


class DriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the error."""


def artifacts_root() -> Path:
    """The folder holding ``<arch>/manifest.json``: $SKINNY_GEMM_ARTIFACTS, else the package's artifacts/."""
    env = os.environ.get(ENV_ARTIFACTS)
    return Path(env) if env else Path(__file__).resolve().parent.parent / "artifacts"


def _driver():
    global driver
    if driver is None:
        from cuda.bindings import driver as module

        driver = module
    return driver


def _call(fn, *args):
    """Call a driver function; return its outputs (one value or a tuple), raise DriverError on failure."""
    res = fn(*args)
    if int(res[0]) != 0:
        raise DriverError(f"{getattr(fn, '__name__', fn)}: {getattr(res[0], 'name', res[0])}")
    return res[1] if len(res) == 2 else tuple(res[1:])


def cubin_sm(blob: bytes) -> int | None:
    """The SM number in a cubin's ELF header (EM_CUDA, 64-bit), or None if the bytes are no whole cubin.

    Every section and the header tables must lie inside the blob: the driver
    was seen to crash the process (SIGSEGV, H200, driver 580) on a cubin cut
    short, so a damaged one must never reach cuLibraryLoadData.
    """
    if len(blob) < 64 or blob[:4] != b"\x7fELF" or blob[4] != 2:
        return None
    if int.from_bytes(blob[18:20], "little") != EM_CUDA:
        return None
    phoff, shoff = struct.unpack_from("<QQ", blob, 32)
    phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", blob, 54)
    if phoff + phentsize * phnum > len(blob) or shoff + shentsize * shnum > len(blob) or shentsize < 64:
        return None
    for i in range(shnum):
        sh_type, _, _, sh_offset, sh_size = struct.unpack_from("<IQQQQ", blob, shoff + i * shentsize + 4)
        if sh_type != SHT_NOBITS and sh_offset + sh_size > len(blob):
            return None
    return (int.from_bytes(blob[48:52], "little") >> 8) & 0xFF


def arch_sm(arch: str) -> int:
    """sm_90a -> 90, sm_121 -> 121."""
    return int(arch[3:].rstrip("af"))


@dataclass
class Kernel:
    """One accepted variant, loaded into the driver: context-independent."""

    variant: Variant
    library: object
    handle: object
    # The image stays referenced: with lazy loading the driver may read it when a context first needs it.
    blob: bytes = field(repr=False, default=b"")


@dataclass
class Library:
    """One artifact dir after its checks: the manifest, the kernels loaded, what was refused and why."""

    directory: Path
    manifest: Manifest | None = None
    error: str | None = None
    kernels: dict[str, Kernel] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)

    @property
    def plans(self) -> dict[tuple[int, int, int], Variant]:
        """Planned (n, k, m) -> variant, for accepted variants only."""
        if self.manifest is None:
            return {}
        return {key: self.kernels[vid].variant for key, vid in self.manifest.plans.items() if vid in self.kernels}

    def problems(self) -> list[str]:
        """One line per refusal, each naming the file."""
        if self.error is not None:
            return [self.error]
        return [f"{self.directory / name}: {why}" for name, why in self.refused.items()]


def check_dir(directory: Path, arch: str | None) -> tuple[Library, dict[str, bytes]]:
    """Host-side checks of one artifact dir; returns the Library (no kernels yet) and the accepted cubins' bytes."""
    lib = Library(Path(directory))
    path = lib.directory / MANIFEST_NAME
    if not path.is_file():
        lib.error = f"{path}: no manifest (missing or incomplete artifact dir)"
        return lib, {}
    try:
        lib.manifest = parse(path, expected_version=__version__, expected_arch=arch)
    except ManifestError as exc:
        lib.error = str(exc)
        return lib, {}
    want_sm = arch_sm(lib.manifest.arch)
    blobs = {}
    for vid, v in lib.manifest.variants.items():
        why = _variant_problem(lib.directory, v, want_sm, lib.manifest.arch)
        if isinstance(why, str):
            lib.refused[v.file] = why
        else:
            blobs[vid] = why
    return lib, blobs


def _variant_problem(directory: Path, v: Variant, want_sm: int, arch: str) -> str | bytes:
    """The cubin's bytes if the variant passes every host check, else the reason it is refused."""
    if tuple(tuple(p) for p in v.params) != PARAMS:
        return f"parameter layout {list(v.params)} differs from the runtime ABI {list(PARAMS)}"
    launch = launch_problem(v)
    if launch:
        return launch
    if not v.file or Path(v.file).name != v.file:
        return f"file name {v.file!r} is not a plain name in the artifact dir"
    try:
        blob = (directory / v.file).read_bytes()
    except OSError as exc:
        return f"cubin unreadable ({exc.strerror or exc})"
    if hashlib.sha256(blob).hexdigest() != v.sha256:
        return "sha256 differs from the manifest (corrupted or replaced cubin)"
    sm = cubin_sm(blob)
    if sm is None:
        return "not a CUDA cubin"
    if sm != want_sm:
        return f"cubin holds sm_{sm} code, the manifest is for {arch}"
    return blob


def _load_kernels(lib: Library, blobs: dict[str, bytes]) -> None:
    """Load each accepted cubin into the driver (its parameter layout is checked at bind)."""
    d = driver
    for vid, blob in blobs.items():
        v = lib.manifest.variants[vid]
        library = None
        try:
            library = _call(d.cuLibraryLoadData, blob, None, None, 0, None, None, 0)
            handle = _call(d.cuLibraryGetKernel, library, v.symbol.encode())
        except DriverError as exc:
            lib.refused[v.file] = str(exc)
            if library is not None:
                d.cuLibraryUnload(library)
            continue
        lib.kernels[vid] = Kernel(v, library, handle, blob)


def _warn(problems: list[str], what: str) -> None:
    if problems:
        warnings.warn(
            f"skinny_gemm refused {what}; those shapes fall back to F.linear:\n  " + "\n  ".join(problems),
            ArtifactWarning,
            stacklevel=3,
        )


def load_library(directory: Path, arch: str | None) -> Library:
    """Check one artifact dir on the host, then load what passed into the driver (needs cuInit done)."""
    lib, blobs = check_dir(directory, arch)
    if blobs:
        _load_kernels(lib, blobs)
    return lib


class Launch:
    """One variant at one (n, k) on one device, ready to launch: the dispatch table's value."""

    __slots__ = ("variant", "function", "n", "k", "nk", "grid", "block", "smem", "config")

    def __init__(self, variant: Variant, function, n: int, k: int):
        d = driver
        self.variant, self.function, self.n, self.k = variant, function, n, k
        # n and k are the i32 params at offsets 32 and 36: one little-endian u64 slot.
        self.nk = (n & 0xFFFFFFFF) | ((k & 0xFFFFFFFF) << 32)
        self.grid = variant.config.grid(n)
        self.block = variant.block
        self.smem = variant.dynamic_smem
        self.config = None
        attrs = []
        if variant.pdl:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if variant.cluster > 1:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = variant.cluster, 1, 1
            attrs.append(attr)
        if attrs:
            cfg = d.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.grid, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block
            cfg.sharedMemBytes = self.smem
            cfg.attrs = attrs
            cfg.numAttrs = len(attrs)
            self.config = cfg


def _capturing() -> bool:
    """Whether torch's current stream is capturing a graph (a CPU-only torch cannot say: it never is)."""
    try:
        return torch.cuda.is_current_stream_capturing()
    except RuntimeError:
        return False


@contextlib.contextmanager
def _relaxed_capture():
    """Let this thread make the binding calls even while it captures a graph (they add no graph node)."""
    d = driver
    old = _call(d.cuThreadExchangeStreamCaptureMode, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    try:
        yield
    finally:
        d.cuThreadExchangeStreamCaptureMode(old)


@dataclass(eq=False)
class DeviceTable:
    """One GPU: what it is, the library for its arch, and (once bound) its function handles and launch table."""

    ordinal: int
    name: str
    capability: tuple[int, int]
    arch: str | None
    library: Library | None
    table: dict[tuple[int, int, int], Launch] | None = None
    functions: dict[str, object] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _records: dict = field(default_factory=dict, repr=False)

    def bind(self, pending: list | None = None) -> dict:
        """Get this device's function handles and build its launch table; {} until torch made its context.

        Refusals are warned about, or appended to ``pending`` for the caller to warn about.
        """
        with self.lock:
            if self.table is not None:
                return self.table
            if self.library is None or not self.library.kernels:
                self.table = {}
                return self.table
            try:
                if not self._bind_functions():
                    return {}
            except DriverError as exc:
                self.error = f"binding failed: {exc}"
            if (self.error or self.refused) and _capturing():
                # A failure inside a capture may be the capture's doing: fall back for
                # this call and bind again outside it rather than refuse for good.
                self.functions, self.refused, self.error = {}, {}, None
                return {}
            self.table = {
                key: Launch(v, self.functions[v.id], key[0], key[1])
                for key, v in self.library.plans.items()
                if v.id in self.functions
            }
        problems = [f"{self.library.directory / f}: {why}" for f, why in self.refused.items()]
        if self.error is not None:
            problems.append(f"GPU {self.ordinal}: {self.error}")
        if pending is None:
            _warn(problems, f"kernels on GPU {self.ordinal}")
        else:
            pending.append((problems, f"kernels on GPU {self.ordinal}"))
        return self.table

    def _bind_functions(self) -> bool:
        d = driver
        dev = _call(d.cuDeviceGet, self.ordinal)
        _, active = _call(d.cuDevicePrimaryCtxGetState, dev)
        if not active:
            return False
        with _relaxed_capture():
            ctx = _call(d.cuDevicePrimaryCtxRetain, dev)
            try:
                _call(d.cuCtxPushCurrent, ctx)
                try:
                    for vid, kernel in self.library.kernels.items():
                        try:
                            self.functions[vid] = self._function(kernel)
                        except DriverError as exc:
                            self.refused[kernel.variant.file] = str(exc)
                finally:
                    _call(d.cuCtxPopCurrent)
            finally:
                # The context is torch's (it was active): releasing our reference cannot destroy it.
                d.cuDevicePrimaryCtxRelease(dev)
        return True

    @staticmethod
    def _function(kernel: Kernel):
        d = driver
        v = kernel.variant
        fn = _call(d.cuKernelGetFunction, kernel.handle)
        # cuKernelGetParamInfo needs a current context (CUDA_ERROR_INVALID_CONTEXT
        # at load on the H200, driver 580): the layout is checked here, at bind.
        layout = [_call(d.cuKernelGetParamInfo, kernel.handle, i) for i in range(len(v.params))]
        expected = [(off, size) for _, off, size in v.params]
        if layout != expected:
            raise DriverError(f"driver reports parameter layout {layout}, manifest says {expected}")
        if int(d.cuKernelGetParamInfo(kernel.handle, len(v.params))[0]) == 0:
            raise DriverError(f"driver reports more than the manifest's {len(v.params)} parameters")
        attrs = d.CUfunction_attribute
        most = _call(d.cuFuncGetAttribute, attrs.CU_FUNC_ATTRIBUTE_MAX_THREADS_PER_BLOCK, fn)
        if v.block[0] * v.block[1] * v.block[2] > most:
            raise DriverError(f"block {v.block} exceeds the kernel's {most} threads per block")
        if v.dynamic_smem > DEFAULT_SMEM_LIMIT:
            _call(d.cuFuncSetAttribute, fn, attrs.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, v.dynamic_smem)
        return fn

    def launch_for(self, variant_id: str, n: int, k: int) -> Launch:
        """A launch record for any loaded variant at (n, k), for bench and tuning code; raises if it cannot run."""
        key = (variant_id, n, k)
        rec = self._records.get(key)
        if rec is not None:
            return rec
        self.bind()
        if variant_id not in self.functions:
            raise KeyError(f"variant {variant_id} is not loaded on GPU {self.ordinal} (see .refused, .library.refused, .error)")
        variant = self.library.kernels[variant_id].variant
        try:
            variant.config.check(n=n, k=k)
        except ConfigError as exc:
            raise ValueError(f"{variant_id} cannot run (n={n}, k={k}): {exc}") from None
        rec = self._records[key] = Launch(variant, self.functions[variant_id], n, k)
        return rec

    def launch(self, variant_id: str, a, w, out, residual, n: int, k: int, stream=None) -> None:
        """Launch a variant for bench and tuning code: a, w, out, residual are tensors or device pointers
        (residual None or 0: none); ``stream`` a raw handle, default torch's current stream on this GPU.
        The caller owns the shapes: out holds config.m rows of n, a holds config.m rows of k."""
        if stream is None:
            stream = torch.cuda.current_stream(self.ordinal).cuda_stream
        ptrs = [0 if t is None else t if isinstance(t, int) else t.data_ptr() for t in (a, w, out, residual)]
        rec = self.launch_for(variant_id, n, k)
        with torch.cuda.device(self.ordinal):  # a NULL stream launches into the current context
            launch(rec, *ptrs, stream)


# The 40-byte parameter block (u64 a, w, out, residual; i32 n, k) followed by the
# array of pointers to each parameter that kernelParams wants. The driver copies
# the values during the launch call, so one buffer serves every launch under
# the lock (which also guards each launch config's stream field).
_LOCK = threading.Lock()
_ARGS = (ctypes.c_uint64 * (5 + len(PARAMS)))()
_BASE = ctypes.addressof(_ARGS)
_ARGS[5:] = [_BASE + off for _, off, _ in PARAMS]
_ARGV = _BASE + 5 * 8


def launch_raw(rec: Launch, a: int, w: int, out: int, residual: int, stream: int):
    """Launch ``rec`` on ``stream``; returns the driver's CUresult (0 on success). The dispatch hot path."""
    d = driver
    with _LOCK:
        _ARGS[0:5] = (a, w, out, residual, rec.nk)
        if rec.config is not None:
            rec.config.hStream = stream
            return d.cuLaunchKernelEx(rec.config, rec.function, _ARGV, 0)[0]
        bx, by, bz = rec.block
        return d.cuLaunchKernel(rec.function, rec.grid, 1, 1, bx, by, bz, rec.smem, stream, _ARGV, 0)[0]


def launch(rec: Launch, a: int, w: int, out: int, residual: int, stream: int) -> None:
    """Launch ``rec`` with device pointers a, w, out, residual (0 = none) on raw stream handle ``stream``."""
    err = launch_raw(rec, a, w, out, residual, stream)
    if int(err) != 0:
        raise DriverError(f"cuLaunchKernel{'Ex' if rec.config is not None else ''}({rec.variant.id}): {getattr(err, 'name', err)}")


@dataclass
class State:
    """What the automatic load found: driver, devices, libraries; diagnostics reads it."""

    loaded: bool = False
    error: str | None = None
    driver_version: int | None = None
    seconds: float = 0.0
    root: Path | None = None
    libraries: dict[str, Library] = field(default_factory=dict)


STATE = State()
# Device ordinal -> DeviceTable, filled by load(); the dispatch path reads it.
DEVICES: dict[int, DeviceTable] = {}
_LOAD_LOCK = threading.Lock()


def _devices() -> list[tuple[int, str, tuple[int, int]]]:
    d = driver
    attrs = d.CUdevice_attribute
    found = []
    for ordinal in range(_call(d.cuDeviceGetCount)):
        dev = _call(d.cuDeviceGet, ordinal)
        cap = (
            _call(d.cuDeviceGetAttribute, attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
            _call(d.cuDeviceGetAttribute, attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
        )
        name = _call(d.cuDeviceGetName, 256, dev)
        name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        found.append((ordinal, name, cap))
    return found


def _init_driver() -> None:
    """Import cuda-bindings and run cuInit; raises DriverError (or ImportError) where there is no usable GPU."""
    try:
        _driver()
    except ImportError as exc:
        raise DriverError(f"cuda-bindings not importable ({exc})") from None
    try:
        _call(driver.cuInit, 0)
    except DriverError:
        raise
    except Exception as exc:  # no libcuda: cuda-bindings raises its own loader errors
        raise DriverError(f"no CUDA driver ({type(exc).__name__}: {exc})") from None


def load() -> State:
    """Load every visible GPU's artifacts once (the torch-init hook and the dispatch path call this)."""
    with _LOAD_LOCK:
        if STATE.loaded:
            return STATE
        start = time.perf_counter()
        pending: list[tuple[list[str], str]] = []
        try:
            _load_all(pending)
        except Exception as exc:  # never break torch's CUDA init or an import: fall back instead
            STATE.error = f"{type(exc).__name__}: {exc}"
            DEVICES.clear()
            pending.append(([f"loading failed: {STATE.error}"], "all artifacts"))
        STATE.seconds = time.perf_counter() - start
        STATE.loaded = True
    # Warned once the state is complete, so warnings-as-errors cannot leave it half loaded.
    for problems, what in pending:
        _warn(problems, what)
    return STATE


def _load_all(pending: list) -> None:
    STATE.root = artifacts_root()
    try:
        _init_driver()
    except DriverError as exc:
        STATE.error = str(exc)
        return
    STATE.driver_version = _call(driver.cuDriverGetVersion)
    found = _devices()
    for arch in sorted({ARCH_FOR_CAPABILITY[cap] for _, _, cap in found if cap in ARCH_FOR_CAPABILITY}):
        directory = STATE.root / arch
        lib = load_library(directory, arch)
        STATE.libraries[arch] = lib
        if lib.error is not None and not directory.exists():
            log.info("skinny_gemm: no artifacts for %s at %s; its GPUs fall back to F.linear", arch, directory)
        else:
            pending.append((lib.problems(), f"artifacts for {arch}"))
    for ordinal, name, cap in found:
        arch = ARCH_FOR_CAPABILITY.get(cap)
        DEVICES[ordinal] = DeviceTable(ordinal, name, cap, arch, STATE.libraries.get(arch))
    for table in DEVICES.values():
        table.bind(pending)


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
    """Load an arbitrary artifact dir and bind it to CUDA ``device`` (int or torch.device), for bench and tuning code."""
    device = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    ordinal = device.index if device.index is not None else torch.cuda.current_device()
    # Bench code runs on this device anyway: make sure torch's context exists so binding needs none of ours.
    torch.cuda.synchronize(ordinal)
    _init_driver()
    dev = _call(driver.cuDeviceGet, ordinal)
    attrs = driver.CUdevice_attribute
    cap = (
        _call(driver.cuDeviceGetAttribute, attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        _call(driver.cuDeviceGetAttribute, attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
    )
    arch = ARCH_FOR_CAPABILITY.get(cap)
    lib = load_library(Path(path), arch)
    _warn(lib.problems(), f"artifacts in {path}")
    table = DeviceTable(ordinal, torch.cuda.get_device_name(ordinal), cap, arch, lib)
    table.bind()
    return table
