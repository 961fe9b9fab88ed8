"""runtime/tensormaps.py on the real driver (skipped without CUDA): each weight's map lands, byte for byte, in its own
64-byte aligned slot of device memory, from any stream or thread; inside a graph capture nothing is written (a new
weight gets None, a mapped one its slot) and the capture still succeeds. Runs from a copy of tests/ against an
installed wheel like the rest of tests/gpu (see test_runtime_gpu.py), or from the checkout.
"""

from __future__ import annotations

import ctypes
import threading

import pytest
import torch

from skinny_gemm.runtime import driver, tensormaps

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)

BF16 = torch.bfloat16


@pytest.fixture
def arenas(monkeypatch):
    """An empty arena table (the chunks the test allocates stay allocated, as every chunk does)."""
    torch.cuda.init()
    driver.init()
    monkeypatch.setattr(tensormaps, "_ARENAS", {})


def in_device_memory(addr: int) -> bytes:
    d = driver.module()
    buf = ctypes.create_string_buffer(tensormaps.MAP_BYTES)
    torch.cuda.synchronize()
    with tensormaps._context(0):
        driver.call(d.cuMemcpyDtoH, ctypes.addressof(buf), addr, tensormaps.MAP_BYTES)
    return buf.raw


def encoded(ptr: int, n: int, k: int, rows: int) -> bytes:
    return ctypes.string_at(tensormaps._encode(ptr, n, k, rows).getPtr(), tensormaps.MAP_BYTES)


def test_maps_land_in_their_slots(arenas):
    n, k = 4096, 2048
    ws = [torch.empty(n, k, dtype=BF16, device="cuda") for _ in range(4)]
    stream = torch.cuda.current_stream().cuda_stream
    first = tensormaps.weight_map(0, ws[0].data_ptr(), n, k, 64, stream)
    assert first % 64 == 0 and in_device_memory(first) == encoded(ws[0].data_ptr(), n, k, 64)
    wide = tensormaps.weight_map(0, ws[0].data_ptr(), n, k, 128, stream)
    assert wide == first + 128 and in_device_memory(wide) == encoded(ws[0].data_ptr(), n, k, 128)
    assert in_device_memory(wide) != in_device_memory(first)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        on_side = tensormaps.weight_map(0, ws[1].data_ptr(), n, k, 64, side.cuda_stream)
    got = []
    thread = threading.Thread(
        target=lambda: got.append(
            tensormaps.weight_map(0, ws[2].data_ptr(), n, k, 64, torch.cuda.current_stream(0).cuda_stream)
        )
    )
    thread.start()
    thread.join()
    for w, addr in zip(ws[1:3], (on_side, got[0])):
        assert in_device_memory(addr) == encoded(w.data_ptr(), n, k, 64)
    assert sorted({first, wide, on_side, got[0]}) == [first + 128 * i for i in range(4)]
    assert tensormaps.weight_map(0, ws[0].data_ptr(), n, k, 64, stream) == first


def test_nothing_is_written_inside_a_capture(arenas):
    n, k = 2048, 4096
    w, new = (torch.randn(n, k, dtype=BF16, device="cuda") for _ in range(2))
    mapped = tensormaps.weight_map(0, w.data_ptr(), n, k, 64, torch.cuda.current_stream().cuda_stream)
    x = torch.randn(8, k, dtype=BF16, device="cuda")
    expected = x @ w.T  # warm-up: cuBLAS makes its handle and workspace outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        stream = torch.cuda.current_stream().cuda_stream
        inside = (
            tensormaps.weight_map(0, w.data_ptr(), n, k, 64, stream),
            tensormaps.weight_map(0, new.data_ptr(), n, k, 64, stream),
        )
        y = x @ w.T
    graph.replay()
    torch.cuda.synchronize()
    assert inside == (mapped, None) and tensormaps.lookup(0, new.data_ptr(), n, k, 64) is None
    assert torch.equal(y, expected) and tensormaps.count(0) == 1
    # the control: after the capture the new weight gets its map
    after = tensormaps.weight_map(0, new.data_ptr(), n, k, 64, torch.cuda.current_stream().cuda_stream)
    assert after == mapped + 128 and in_device_memory(after) == encoded(new.data_ptr(), n, k, 64)
