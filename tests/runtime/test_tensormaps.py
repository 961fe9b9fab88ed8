"""runtime/tensormaps.py on a FakeDriver: the encode's arguments, one slot per (weight, shape, box), slots 128 bytes
apart in 64 KiB chunks, the cap, nothing written inside a graph capture, and driver refusals that take no slot twice.
(tests/runtime/test_ops.py has the dispatch side: a "wgmma" launch's 2nd pointer is its weight's map.)"""

from __future__ import annotations

import pytest
from helpers.fake_capture import FakeCapture
from helpers.fake_driver import FakeDriver, R

from skinny_gemm.runtime import driver as driver_mod
from skinny_gemm.runtime import tensormaps
from skinny_gemm.runtime.driver import DriverError

STREAM = 0x5151


@pytest.fixture
def fake(monkeypatch):
    """A FakeDriver with two GPUs, no arena yet, torch's current device 0 and no capture (``fake.capture``)."""
    drv = FakeDriver(caps=((9, 0), (9, 0)))
    monkeypatch.setattr(driver_mod, "driver", drv)
    monkeypatch.setattr(tensormaps, "_ARENAS", {})
    drv.capture = FakeCapture(monkeypatch)
    return drv


def written_once(fake) -> None:
    """Every copy went to its own slot (none rewritten), each followed by a sync of its stream, in its device's
    context; the capture mode is back to what it was."""
    dsts = [c["dst"] for c in fake.copies]
    assert len(set(dsts)) == len(dsts), "a slot was written twice"
    for c in fake.copies:
        assert fake.calls[c["call"] + 1] == "cuStreamSynchronize", "each copy is synchronized before anything else"
    assert fake.syncs == [c["stream"] for c in fake.copies]
    assert fake.ctx_stack == [] and fake.capture_mode == [0]


def test_the_encode_arguments_and_the_copy(fake):
    d = fake._real
    addr = tensormaps.weight_map(0, 0x10000, 4096, 2048, 64, STREAM)
    assert fake.encodes == [
        {
            "dtype": d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16,
            "rank": 2,
            "ptr": 0x10000,
            "dims": [2048, 4096],  # innermost (K) first
            "strides": [2048 * 2],  # bytes between rows
            "box": [64, 64],  # 64 K elements (128 bytes) by the variant's rows
            "elem": [1, 1],
            "interleave": d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE,
            "swizzle": d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
            "l2": d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            "oob": d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE,
        }
    ]
    # the encoded map's 128 bytes, copied to the slot returned, on the stream given, in GPU 0's context
    assert [(c["dst"], c["stream"], c["ctx"]) for c in fake.copies] == [(addr, STREAM, 1000)]
    assert fake.memory[addr] == fake._maps[0].data and len(fake.memory[addr]) == 128
    assert fake.calls[-3:] == ["cuMemAlloc", "cuMemcpyHtoDAsync", "cuStreamSynchronize"]
    assert fake.calls.index("cuTensorMapEncodeTiled") < fake.calls.index("cuMemAlloc")
    assert addr % 64 == 0 and tensormaps.lookup(0, 0x10000, 4096, 2048, 64) == addr
    # two consumers: boxes of 128 rows
    tensormaps.weight_map(0, 0x10000, 4096, 2048, 128, STREAM)
    assert fake.encodes[-1]["box"] == [64, 128] and fake.encodes[-1]["dims"] == [2048, 4096]
    written_once(fake)


def test_one_map_per_weight_shape_and_rows(fake):
    first = tensormaps.weight_map(0, 0x10000, 4096, 2048, 64, STREAM)
    assert tensormaps.weight_map(0, 0x10000, 4096, 2048, 64, STREAM + 1) == first
    assert len(fake.encodes) == len(fake.copies) == 1, "the second call reuses the map: nothing encoded or copied"
    others = [
        tensormaps.weight_map(0, *key, STREAM)
        for key in ((0x20000, 4096, 2048, 64), (0x10000, 2048, 4096, 64), (0x10000, 4096, 4096, 64))
    ]
    others.append(tensormaps.weight_map(0, 0x10000, 4096, 2048, 128, STREAM))
    assert others == [first + 128 * i for i in range(1, 5)], "each new (ptr, n, k, rows) takes the next slot"
    assert [e["ptr"] for e in fake.encodes] == [0x10000, 0x20000, 0x10000, 0x10000, 0x10000]
    assert [e["dims"] for e in fake.encodes][1:4] == [[2048, 4096], [4096, 2048], [4096, 4096]]
    assert len(fake.allocs) == 1 and tensormaps.count(0) == 5
    # each device has its own arena, in its own context
    other_gpu = tensormaps.weight_map(1, 0x10000, 4096, 2048, 64, STREAM)
    assert other_gpu != first and fake.allocs[-1]["ctx"] == 1001 and fake.copies[-1]["ctx"] == 1001
    assert tensormaps.lookup(1, 0x10000, 4096, 2048, 64) == other_gpu and tensormaps.count(0) == 5
    written_once(fake)


def test_slots_are_128_bytes_apart_in_chunks_of_512(fake):
    assert (tensormaps.MAP_BYTES, tensormaps.CHUNK_SLOTS) == (128, 512)
    addrs = [tensormaps.weight_map(0, 0x10000 * (i + 1), 1024, 1024, 64, STREAM) for i in range(513)]
    assert len(fake.allocs) == 2 and [a["bytes"] for a in fake.allocs] == [512 * 128] * 2
    base, second = fake.allocs[0]["ptr"], fake.allocs[1]["ptr"]
    assert base % 256 == 0 and addrs[:512] == [base + 128 * i for i in range(512)]
    assert addrs[512] == second != base + 512 * 128, "the 513th map starts a new chunk"
    assert all(a % 64 == 0 for a in addrs) and len(set(addrs)) == 513
    written_once(fake)


def test_the_cap_refuses_new_maps_and_keeps_the_old(fake, monkeypatch):
    assert tensormaps.MAX_MAPS == 65536 == 128 * tensormaps.CHUNK_SLOTS  # 8 MiB of maps per device at most
    monkeypatch.setattr(tensormaps, "MAX_MAPS", 600)
    addrs = [tensormaps.weight_map(0, 0x10000 * (i + 1), 1024, 1024, 64, STREAM) for i in range(600)]
    calls = len(fake.calls)
    with pytest.raises(tensormaps.MapsFull, match="600"):
        tensormaps.weight_map(0, 0x10000 * 601, 1024, 1024, 64, STREAM)
    assert len(fake.calls) == calls, "refused before any driver call"
    assert tensormaps.weight_map(0, 0x10000, 1024, 1024, 64, STREAM) == addrs[0]
    assert tensormaps.lookup(0, 0x10000 * 600, 1024, 1024, 64) == addrs[-1] and tensormaps.count(0) == 600
    # the cap is per device
    assert tensormaps.weight_map(1, 0x10000 * 601, 1024, 1024, 64, STREAM) is not None


@pytest.mark.parametrize("where", ["this device", "another device's call"])
def test_nothing_is_written_inside_a_capture(fake, where):
    mapped = tensormaps.weight_map(0, 0x10000, 4096, 2048, 64, STREAM)
    calls, idx = len(fake.calls), 0
    if where == "this device":
        fake.capture.capturing = {0}
    else:  # the thread's current device is 0, the call's weight is on GPU 1, whose current stream captures
        fake.capture.capturing, idx = {1}, 1
    assert tensormaps.weight_map(idx, 0x20000, 4096, 2048, 64, STREAM) is None
    assert fake.calls[calls:] == [], "no encode, alloc, copy or sync while capturing"
    assert tensormaps.lookup(idx, 0x20000, 4096, 2048, 64) is None
    if idx == 0:  # a map made before the capture is still handed out, with no driver call
        assert tensormaps.weight_map(0, 0x10000, 4096, 2048, 64, STREAM) == mapped and fake.calls[calls:] == []
    fake.capture.capturing = set()  # the control: after the capture the same call writes its map
    assert tensormaps.weight_map(idx, 0x20000, 4096, 2048, 64, STREAM) is not None
    assert len(fake.encodes) == 2
    written_once(fake)


@pytest.mark.parametrize("query", ["captures", "capture error"])
def test_nothing_is_written_while_the_given_stream_captures(fake, query):
    """A caller's stream (bench code passes its own) may capture while torch's current stream does not: the map
    waits (None, not refused); a capture error in answer (the legacy stream beside a capture) counts as capturing."""
    if query == "captures":
        fake.capturing_streams = {STREAM}
    else:
        fake.fail["cuStreamIsCapturing"] = R.CUDA_ERROR_STREAM_CAPTURE_IMPLICIT
    assert tensormaps.weight_map(0, 0x20000, 4096, 2048, 64, STREAM) is None
    assert "cuStreamIsCapturing" in fake.calls
    assert fake.encodes == [] and fake.allocs == [] and fake.copies == [] and fake.syncs == []
    assert tensormaps.lookup(0, 0x20000, 4096, 2048, 64) is None and tensormaps.count(0) == 0
    assert fake.ctx_stack == [] and fake.capture_mode == [0]
    # the control: once the capture ended, the same call writes the map
    fake.capturing_streams, fake.fail = set(), {}
    assert tensormaps.weight_map(0, 0x20000, 4096, 2048, 64, STREAM) is not None and tensormaps.count(0) == 1
    written_once(fake)


def test_a_stream_the_driver_cannot_answer_for_is_refused_once(fake):
    """A bad stream handle is no capture: the key is refused (raised once, then from the cache), nothing written."""
    fake.fail["cuStreamIsCapturing"] = R.CUDA_ERROR_INVALID_HANDLE
    with pytest.raises(DriverError, match="cuStreamIsCapturing: CUDA_ERROR_INVALID_HANDLE"):
        tensormaps.weight_map(0, 0x20000, 4096, 2048, 64, STREAM)
    calls = len(fake.calls)
    with pytest.raises(DriverError, match="CUDA_ERROR_INVALID_HANDLE"):
        tensormaps.weight_map(0, 0x20000, 4096, 2048, 64, STREAM)
    assert len(fake.calls) == calls and fake.encodes == [] and fake.allocs == []


def test_an_exception_from_the_binding_is_refused_once(fake):
    """Not every failure is a DriverError (a binding may raise TypeError): it refuses the key all the same."""

    def broken(*args):
        fake._log("cuTensorMapEncodeTiled")
        raise TypeError("argument 3 has an unexpected type")

    fake.cuTensorMapEncodeTiled = broken
    with pytest.raises(TypeError, match="unexpected type"):
        tensormaps.weight_map(0, 0x20000, 4096, 2048, 64, STREAM)
    calls = len(fake.calls)
    with pytest.raises(DriverError, match="TypeError: argument 3"):
        tensormaps.weight_map(0, 0x20000, 4096, 2048, 64, STREAM)
    assert len(fake.calls) == calls and fake.allocs == [] and fake.ctx_stack == [] and fake.capture_mode == [0]


@pytest.mark.parametrize(
    "call", ["cuTensorMapEncodeTiled", "cuMemAlloc", "cuMemcpyHtoDAsync", "cuStreamSynchronize", "cuDeviceGet"]
)
def test_a_driver_refusal_is_raised_once_and_takes_no_slot_twice(fake, call):
    first = tensormaps.weight_map(0, 0x10000, 4096, 2048, 64, STREAM)
    if call == "cuDeviceGet":  # the context cannot be made current

        def cuDeviceGet(ordinal):
            return (R.CUDA_ERROR_INVALID_VALUE, None)

        fake.cuDeviceGet = cuDeviceGet
    else:
        fake.fail[call] = R.CUDA_ERROR_OUT_OF_MEMORY if call == "cuMemAlloc" else R.CUDA_ERROR_INVALID_VALUE
    if call == "cuMemAlloc":  # only a new chunk allocates: fill the first one
        for i in range(1, 512):
            tensormaps.weight_map(0, 0x10000 * (i + 1), 4096, 2048, 64, STREAM)
    with pytest.raises(DriverError, match=call):
        tensormaps.weight_map(0, 0x900000000, 4096, 2048, 64, STREAM)
    assert tensormaps.lookup(0, 0x900000000, 4096, 2048, 64) is None
    assert fake.ctx_stack == [] and fake.capture_mode == [0], "the context and the capture mode are restored"
    calls = len(fake.calls)
    with pytest.raises(DriverError, match=call):  # the key stays refused: no second attempt
        tensormaps.weight_map(0, 0x900000000, 4096, 2048, 64, STREAM)
    assert len(fake.calls) == calls
    # the next weight still gets a map (once the driver agrees), in a slot never written or attempted before
    fake.fail.clear()
    vars(fake).pop("cuDeviceGet", None)
    nxt = tensormaps.weight_map(0, 0x800000000, 4096, 2048, 64, STREAM)
    attempted = call in ("cuMemcpyHtoDAsync", "cuStreamSynchronize")  # the copy may land: its slot stays taken
    if call != "cuMemAlloc":
        assert nxt == first + 128 * (2 if attempted else 1)
    else:
        assert nxt == fake.allocs[-1]["ptr"] and len(fake.allocs) == 2
    assert tensormaps.weight_map(0, 0x10000, 4096, 2048, 64, STREAM) == first
    written_once(fake)


def test_an_encode_the_driver_rejects_is_refused(fake):
    """A weight pointer TMA cannot take (not 16-byte aligned) or a row stride that is not a multiple of 16 bytes:
    the fake checks the documented limits; the runtime's own calls (above) meet them."""
    with pytest.raises(DriverError, match="CUDA_ERROR_INVALID_VALUE"):
        tensormaps.weight_map(0, 0x10008, 4096, 2048, 64, STREAM)
    with pytest.raises(DriverError, match="CUDA_ERROR_INVALID_VALUE"):
        tensormaps.weight_map(0, 0x10000, 4096, 2044, 64, STREAM)
    assert fake.allocs == [] and fake.copies == []
