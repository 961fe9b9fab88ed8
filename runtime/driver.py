"""The driver calls: cuda-python imported on first use, device queries, launch records and the hot-path launch.

Every call into ``cuda.bindings.driver`` goes through ``call`` (one error
type, naming the call), except the two launch calls on the hot path, which
return the raw CUresult for the caller to check.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading

import torch

from .manifest import PARAMS, Variant

# The driver module (cuda.bindings.driver), imported on first load: importing it
# costs about 0.1 s, which an import of skinny_gemm without a GPU should not pay.
# Tests replace it with a fake (tests/helpers/fake_driver.py).
driver = None


class DriverError(RuntimeError):
    """A CUDA driver call failed; the message names the call and the error."""


def module():
    """cuda.bindings.driver (or the fake a test installed)."""
    global driver
    if driver is None:
        from cuda.bindings import driver as real

        driver = real
    return driver


def call(fn, *args):
    """Call a driver function; return its outputs (one value or a tuple), raise DriverError on failure."""
    res = fn(*args)
    if int(res[0]) != 0:
        raise DriverError(f"{getattr(fn, '__name__', fn)}: {getattr(res[0], 'name', res[0])}")
    return res[1] if len(res) == 2 else tuple(res[1:])


def init() -> int:
    """Import cuda-bindings and run cuInit; the driver version. Raises DriverError where there is no usable GPU."""
    try:
        d = module()
    except ImportError as exc:
        raise DriverError(f"cuda-bindings not importable ({exc})") from None
    try:
        call(d.cuInit, 0)
    except DriverError:
        raise
    except Exception as exc:  # noqa: BLE001  (no libcuda: cuda-bindings raises its own loader errors)
        raise DriverError(f"no CUDA driver ({type(exc).__name__}: {exc})") from None
    return call(d.cuDriverGetVersion)


def capability(ordinal: int) -> tuple[int, int]:
    """Device ``ordinal``'s compute capability, from the driver (the one capability query)."""
    d = driver
    dev = call(d.cuDeviceGet, ordinal)
    attrs = d.CUdevice_attribute
    return (
        call(d.cuDeviceGetAttribute, attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
        call(d.cuDeviceGetAttribute, attrs.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
    )


def devices() -> list[tuple[int, str, tuple[int, int]]]:
    """(ordinal, name, capability) of every device the driver sees."""
    d = driver
    found = []
    for ordinal in range(call(d.cuDeviceGetCount)):
        name = call(d.cuDeviceGetName, 256, call(d.cuDeviceGet, ordinal))
        name = name.split(b"\0", 1)[0].decode(errors="replace") if isinstance(name, bytes) else str(name)
        found.append((ordinal, name, capability(ordinal)))
    return found


def capturing(ordinal: int) -> bool:
    """Whether a launch on GPU ``ordinal`` may be inside a graph capture: torch's current stream there captures.

    The launch goes to ``ordinal``'s current stream, which is not the calling thread's current device's on a
    cross-device call, so that stream is the one asked; a capture on the current device's stream counts too
    (deferring costs one fallback, a refusal made for good costs the variant).
    """
    try:
        if torch.cuda.is_current_stream_capturing():
            return True
        if torch.cuda.current_device() == ordinal:
            return False
        with torch.cuda.device(ordinal):
            return torch.cuda.is_current_stream_capturing()
    except (RuntimeError, AssertionError):
        # A CPU-only torch cannot say (it never captures); a CUDA torch that cannot say is taken as capturing.
        return torch.cuda.is_available()


@contextlib.contextmanager
def relaxed_capture():
    """Let this thread make loading and binding calls even while it captures a graph (they add no graph node)."""
    d = driver
    old = call(d.cuThreadExchangeStreamCaptureMode, d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    try:
        yield
    finally:
        d.cuThreadExchangeStreamCaptureMode(old)


class Launch:
    """One variant at one (n, k) on one device, ready to launch: the dispatch table's value."""

    __slots__ = ("block", "config", "function", "grid", "k", "n", "nk", "smem", "tma", "variant")

    def __init__(self, variant: Variant, function, n: int, k: int):
        d = driver
        self.variant, self.function, self.n, self.k = variant, function, n, k
        # n and k are the i32 params at offsets 32 and 36: one little-endian u64 slot.
        self.nk = (n & 0xFFFFFFFF) | ((k & 0xFFFFFFFF) << 32)
        # The record's launch fields were checked equal to these (manifest.launch_problem).
        shape = variant.config.launch(n)
        self.grid, self.block, self.smem = shape.grid, shape.block, shape.smem
        # "wgmma" reads its weight through TMA: its ``w`` parameter is the weight's tensor map (runtime/tensormaps.py).
        self.tma = variant.config.kind == "wgmma"
        self.config = None
        attrs = []
        if shape.pdl:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
            attr.value.programmaticStreamSerializationAllowed = 1
            attrs.append(attr)
        if shape.cluster > 1:
            attr = d.CUlaunchAttribute()
            attr.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = shape.cluster, 1, 1
            attrs.append(attr)
        if attrs:
            cfg = d.CUlaunchConfig()
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = self.grid, 1, 1
            cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.block
            cfg.sharedMemBytes = self.smem
            cfg.attrs = attrs
            cfg.numAttrs = len(attrs)
            self.config = cfg


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
        ex = "Ex" if rec.config is not None else ""
        raise DriverError(f"cuLaunchKernel{ex}({rec.variant.id}): {getattr(err, 'name', err)}")
