"""``skinny-gemm env`` (diagnostics.env_report) without a GPU and with a FakeDriver GPU."""

from __future__ import annotations

import torch
from helpers.artifacts import first_variant
from helpers.retained import retained_bytes

import skinny_gemm
from skinny_gemm.runtime import diagnostics, loader
from skinny_gemm.runtime.artifacts import ENV_ARTIFACTS


def test_report_without_gpu_checks_the_artifacts_on_the_host(art):
    v = first_variant(art)
    (art / "sm_90a" / v["file"]).write_bytes(b"junk")
    text = diagnostics.env_report()
    assert "GPU: none usable" in text and f"from ${ENV_ARTIFACTS}" in text
    assert str(art / "sm_90a" / "manifest.json") in text and "instead of the package's" in text
    assert f"refused {v['file']}: sha256 mismatch" in text
    assert "sm_121 (host checks only)" in text


def test_report_with_a_gpu(monkeypatch, fresh, art):
    (art / "sm_90a" / first_variant(art)["file"]).unlink()
    fresh(caps=[(9, 0), (8, 0)])
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    text = diagnostics.env_report()
    assert "driver: CUDA 13.0 (13000)" in text
    assert "GPU 0: Fake GPU (9, 0), capability 9.0 -> sm_90a" in text
    assert "GPU 1: Fake GPU (8, 0), capability 8.0 -> no target" in text
    assert f"package {skinny_gemm.__version__}, arch sm_90a, cutlass-dsl" in text
    assert f"refused {first_variant(art)['file']}: cubin missing" in text
    assert "launch table:" in text


def test_report_keeps_no_cubin_in_memory(monkeypatch, fresh, art):
    """The report host-checks every variant (reading every cubin); afterwards only a loaded variant's image is
    held (the driver's), and the records of the checked ones; the negative control counts a loaded one."""
    fresh()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "init", lambda: None)
    lib = loader.STATE.libraries["sm_90a"]
    diagnostics.env_report()
    assert len(lib.passed) == len(lib.manifest.files) > 1, "every variant was checked"
    assert [b for b in retained_bytes(lib) if len(b) > 256] == []
    v = first_variant(art)
    table = loader.DEVICES[0].table
    assert table.get(min(key for key, vid in lib.manifest.plans.items() if vid == v["id"])) is not None
    assert [len(b) for b in retained_bytes(lib) if len(b) > 256] == [v["size"]], "the loaded variant's image only"
