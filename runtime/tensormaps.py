"""The weights' TMA tensor maps in device memory, for the "wgmma" kernels: their ``w`` parameter is a map's address.

A "wgmma" cubin (kernels/skinny_wgmma.py) reads its weight with TMA
(``cp.async.bulk.tensor`` through the generic address of a CUtensorMap), and
keeps the shared 40-byte parameter ABI: its second pointer is not the weight
but the global-memory address of the weight's 128-byte map, 64-byte aligned.

Where the maps live. Per device, an append-only arena of 128-byte slots in
device memory, allocated with cuMemAlloc ``CHUNK_SLOTS`` slots at a time (a
chunk's base is 256-byte aligned, so every slot is 64-byte aligned), at most
``MAX_MAPS`` maps per device, beyond which ``weight_map`` refuses
(``MapsFull``). A slot is written once and never freed or rewritten while
the process lives: a kernel in flight may be reading any slot, and a captured
CUDA graph keeps a slot's address in its launch for every replay. One map per
(weight pointer, n, k, box rows), cached: later calls of that weight (or of a
later weight at the same address with the same shape, which that map
describes as well) reuse it. A key whose map the driver refused stays refused
(one failure, not one per call).

Writing a map: cuTensorMapEncodeTiled on the host, then cuMemcpyHtoDAsync of
its 128 bytes on torch's current stream of the device, then
cuStreamSynchronize of that stream. The source is pageable host memory, and a
pageable copy may return before its DMA has landed: after the sync the map is
in device memory, for a launch on any stream. None of this runs while that
device's current stream, or the stream given, captures a graph (the copy would
become a graph node, the sync would break the capture): there a weight without
a map gets None, and its call falls back. vLLM runs every shape eagerly before it captures, so each weight
has its map by then; a replay reads the slot its capture recorded.

No import-time side effects; every driver call goes through runtime/driver.py
(``driver.call``), so a test's fake driver stands in.
"""

from __future__ import annotations

import contextlib
import threading

from . import driver as drv
from .driver import DriverError, call

MAP_BYTES = 128  # sizeof(CUtensorMap)
CHUNK_SLOTS = 512  # slots per cuMemAlloc: 64 KiB
MAX_MAPS = 65536  # maps per device: 128 chunks, 8 MiB
BOX_K = 64  # K elements of a box: one 128-byte bf16 row, the 128-byte swizzle's span


class MapsFull(RuntimeError):
    """A device already holds ``MAX_MAPS`` maps: a new weight gets none (the existing maps stay valid)."""


class _Arena:
    """One device's slots and maps; ``lock`` guards the writes, ``maps`` is read without it."""

    __slots__ = ("chunks", "lock", "maps", "refused", "used")

    def __init__(self):
        self.maps: dict[tuple[int, int, int, int], int] = {}  # (ptr, n, k, rows) -> slot address
        self.refused: dict[tuple[int, int, int, int], str] = {}  # key -> the driver's (or its binding's) refusal
        self.chunks: list[int] = []  # chunk base addresses, never freed
        self.used = 0  # slots taken (written or attempted): a slot is never handed out twice
        self.lock = threading.Lock()


_ARENAS: dict[int, _Arena] = {}
_ARENAS_LOCK = threading.Lock()


def lookup(idx: int, ptr: int, n: int, k: int, rows: int) -> int | None:
    """The device address of an existing map on GPU ``idx``, or None: a dict lookup, no driver call."""
    arena = _ARENAS.get(idx)
    return None if arena is None else arena.maps.get((ptr, n, k, rows))


def count(idx: int) -> int:
    """How many maps GPU ``idx`` holds."""
    arena = _ARENAS.get(idx)
    return 0 if arena is None else len(arena.maps)


def weight_map(idx: int, ptr: int, n: int, k: int, rows: int, stream: int) -> int | None:
    """The device address of the map of the (n, k) bf16 weight at ``ptr`` on GPU ``idx`` with boxes of ``rows``
    weight rows x 64 K, written now if it has none (on raw stream handle ``stream``, torch's current one there).

    None while that device's stream or ``stream`` captures and the weight has no map yet (nothing is encoded or
    copied then). Raises MapsFull at the cap; what the driver or its binding raised when it refuses (that key stays
    refused: later calls raise DriverError with the first one's text).
    """
    key = (ptr, n, k, rows)
    arena = _ARENAS.get(idx)
    if arena is None:
        with _ARENAS_LOCK:
            arena = _ARENAS.setdefault(idx, _Arena())
    slot = arena.maps.get(key)
    if slot is not None:
        return slot
    if drv.capturing(idx):
        return None
    with arena.lock:
        slot = arena.maps.get(key)  # another thread may have written it meanwhile
        if slot is not None:
            return slot
        if key in arena.refused:
            raise DriverError(arena.refused[key])
        if arena.used >= MAX_MAPS:
            raise MapsFull(f"GPU {idx} holds {MAX_MAPS} tensor maps, the most it keeps")
        try:
            slot = _write(arena, idx, key, stream)
        except Exception as exc:  # a binding's TypeError too: refused like the driver's own errors, never retried
            arena.refused[key] = refusal(exc)
            raise
        if slot is not None:
            arena.maps[key] = slot  # published once the bytes are in device memory
        return slot


def refusal(exc: Exception) -> str:
    """One line for why a weight got no map: the cap's or the driver's own text, else the exception's type too."""
    return str(exc) if isinstance(exc, (MapsFull, DriverError)) else f"{type(exc).__name__}: {exc}"


def _write(arena: _Arena, idx: int, key: tuple[int, int, int, int], stream: int) -> int | None:
    """Encode the map, copy it into the next slot on ``stream`` and wait for it; None (nothing done) while
    ``stream`` itself captures: a caller's stream need not be torch's current one, which ``drv.capturing`` asks."""
    ptr, n, k, rows = key
    d = drv.driver
    with drv.relaxed_capture(), _context(idx):
        if _captures(stream):
            return None
        tmap = _encode(ptr, n, k, rows)  # before a slot is taken: a refused encode costs none
        if arena.used == len(arena.chunks) * CHUNK_SLOTS:
            arena.chunks.append(int(call(d.cuMemAlloc, CHUNK_SLOTS * MAP_BYTES)))
        slot = arena.chunks[-1] + (arena.used % CHUNK_SLOTS) * MAP_BYTES
        # Taken before the copy: a copy that failed may still land, so its slot is never written again.
        arena.used += 1
        call(d.cuMemcpyHtoDAsync, slot, tmap.getPtr(), MAP_BYTES, stream)
        call(d.cuStreamSynchronize, stream)  # the pageable copy has landed: the map is visible to any stream
    return slot


def _captures(stream: int) -> bool:
    """Whether raw stream ``stream`` is capturing a graph. A capture error in answer (the legacy stream while another
    stream captures: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, ...) counts as capturing, so the weight is deferred; any
    other error (a bad handle) raises, so the key is refused once."""
    d = drv.driver
    try:
        status = call(d.cuStreamIsCapturing, stream)
    except DriverError as exc:
        if "CUDA_ERROR_STREAM_CAPTURE" in str(exc):
            return True
        raise
    return status != d.CUstreamCaptureStatus.CU_STREAM_CAPTURE_STATUS_NONE


def _encode(ptr: int, n: int, k: int, rows: int):
    """The CUtensorMap (host memory) of a row-major (n, k) bf16 matrix at ``ptr``, boxes of ``rows`` x 64,
    swizzled by 128 bytes as the kernel's ring expects; dimensions innermost (K) first."""
    d = drv.driver
    u32, u64 = d.cuuint32_t, d.cuuint64_t
    return call(
        d.cuTensorMapEncodeTiled,
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
        u32(2),
        ptr,
        [u64(k), u64(n)],
        [u64(k * 2)],  # the row stride in bytes (the innermost stride is implied)
        [u32(BOX_K), u32(rows)],
        [u32(1), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
        d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
    )


@contextlib.contextmanager
def _context(idx: int):
    """GPU ``idx``'s primary context (torch's: its tensors live there) current on this thread, as runtime/devices.py
    binds: the chunk belongs to it and the copy's stream (the NULL stream too) is that device's."""
    d = drv.driver
    dev = call(d.cuDeviceGet, idx)
    ctx = call(d.cuDevicePrimaryCtxRetain, dev)
    try:
        call(d.cuCtxPushCurrent, ctx)
        try:
            yield
        finally:
            call(d.cuCtxPopCurrent)
    finally:
        d.cuDevicePrimaryCtxRelease(dev)
