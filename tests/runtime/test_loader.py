"""The loader on CPU: manifest, hash and arch checks run for real on built artifacts; only the
driver calls that need a GPU are played by helpers.fake_driver.FakeDriver, which reads the cubins
itself the way the driver would: arch, symbols, parameter layout. Variants load at first use, so
refusals of a variant show when its shapes are first bound (``bind_all`` binds every shape).
"""

from __future__ import annotations

import dataclasses
import hashlib
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from helpers.artifacts import (
    all_plans,
    bind_all,
    contradicting_cluster,
    first_variant,
    manifest_of,
    plans_of,
    the_warning,
    write_manifest,
)
from helpers.fake_capture import FakeCapture
from helpers.fake_driver import FakeDriver, R

from skinny_gemm.runtime import driver as driver_mod
from skinny_gemm.runtime import elf, loader
from skinny_gemm.runtime.devices import ArtifactWarning
from skinny_gemm.runtime.manifest import MANIFEST_NAME, PARAMS

ROOT = Path(__file__).resolve().parents[2]


def refusal(fresh, **kw) -> str:
    """Load, bind every shape, and return the one ArtifactWarning's text (at load or at first use)."""
    fake = fresh(**kw)
    found = [str(w.message) for w in fake.warnings] + bind_all()
    assert len(found) == 1, found
    return found[0]


def test_import_touches_no_cuda():
    code = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('st', {str(ROOT / 'aot' / 'source_tree.py')!r})\n"
        "st = importlib.util.module_from_spec(spec); spec.loader.exec_module(st); st.register()\n"
        "import torch, skinny_gemm\n"
        "from skinny_gemm.runtime import loader\n"
        "assert loader.driver is None, 'import reached for the driver'\n"
        "assert not torch.cuda.is_initialized()\n"
        "assert not loader.STATE.loaded\n"
        "x = torch.randn(2, 16); w = torch.randn(8, 16)\n"
        "assert torch.equal(skinny_gemm.linear(x, w), torch.nn.functional.linear(x, w))\n"
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and "ok" in out.stdout, out.stderr


def test_load_without_driver_library_falls_back(monkeypatch):
    """This machine has no libcuda: the real cuda-bindings raises, the load records why and never raises."""
    monkeypatch.setattr(loader, "STATE", loader.State())
    monkeypatch.setattr(loader, "DEVICES", {})

    class NoLib:
        def __getattr__(self, name):
            def fail(*args):
                raise OSError("libcuda.so.1: cannot open shared object file")

            return fail

    monkeypatch.setattr(driver_mod, "driver", NoLib())
    state = loader.load()
    assert state.loaded and "no CUDA driver" in state.error and loader.DEVICES == {}


def test_load_never_raises(fresh, art):
    def boom(fake):
        def explode(*args):
            raise RuntimeError("driver exploded")

        fake.cuDeviceGetCount = explode

    fresh(setup=boom)
    assert "driver exploded" in loader.STATE.error and loader.DEVICES == {}


def test_clean_load_reads_the_manifest_only_then_binds_every_variant(fresh, art):
    fake = fresh()
    assert fake.warnings == []
    table = loader.DEVICES[0]
    lib = table.library
    assert table.arch == "sm_90a" and lib.error is None and lib.refused == {}
    assert lib.kernels == {} and fake.count("cuLibraryLoadData") == 0, "nothing loads before its first call"
    assert set(table.table) == all_plans(art) and table.table.bound == {}
    assert bind_all() == []
    assert len(lib.kernels) == len(manifest_of(art)["variants"]) == fake.count("cuLibraryLoadData")
    assert all(r.function["ctx"] == 1000 for r in table.table.values())
    assert fake.capture_mode == [0], "capture mode restored after binding"
    # a second load is a no-op: no reload, no second warning
    n = fake.calls.count("cuLibraryLoadData")
    loader.load()
    assert fake.calls.count("cuLibraryLoadData") == n


def test_load_creates_no_context_and_binds_later(fresh, art):
    fake = fresh(active=[False])
    table = loader.DEVICES[0]
    assert table.table is None and table.functions == {}
    assert table.library.manifest is not None, "the manifest loads without a context"
    assert table.bind() == {} and table.table is None, "still unbound while torch has no context"
    fake.active[0] = True
    assert set(table.bind()) == all_plans(art)


def test_devices_each_get_their_own_handles(fresh, art):
    fresh(caps=[(9, 0), (8, 0), (9, 0), (12, 1)])
    t0, t1, t2, t3 = (loader.DEVICES[i] for i in range(4))
    assert t1.arch is None and t1.table == {}
    assert t0.library is t2.library, "one library per arch, loaded once"
    assert t0.table.keys() == t2.table.keys()
    assert {r.function["ctx"] for r in t0.table.values()} == {1000}
    assert {r.function["ctx"] for r in t2.table.values()} == {1002}
    assert t3.arch == "sm_121" and set(t3.table) == all_plans(art, "sm_121")


def test_launch_packs_the_abi(fresh, art):
    fake = fresh()
    key, rec = next((key, r) for key, r in loader.DEVICES[0].table.items() if r.variant.pdl)
    n, k, m = key
    driver_mod.launch(rec, 0x1000, 0x2000, 0x3000, 0, 77)
    driver_mod.launch(rec, 0x1010, 0x2010, 0x3010, 0x4000, 78)
    first, second = fake.launches
    assert (first["a"], first["w"], first["out"], first["residual"], first["n"], first["k"]) == (
        0x1000,
        0x2000,
        0x3000,
        0,
        n,
        k,
    )
    assert (second["a"], second["residual"], second["stream"]) == (0x1010, 0x4000, 78)
    assert first["grid"] == (n // rec.variant.cols_per_cta, 1, 1) and first["block"] == rec.variant.block
    pdl = int(fake.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    assert first["attrs"] == [(pdl, 1)] and first["stream"] == 77


def test_launch_without_pdl_uses_plain_launch(fresh, art):
    fake = fresh()
    rec = next(iter(loader.DEVICES[0].table.values()))
    no_pdl = dataclasses.replace(rec.variant.config, pdl=False)
    plain = driver_mod.Launch(dataclasses.replace(rec.variant, config=no_pdl, pdl=False), rec.function, rec.n, rec.k)
    driver_mod.launch(plain, 16, 32, 48, 0, 5)
    assert fake.launches[-1]["attrs"] == [] and fake.launches[-1]["n"] == rec.n


def test_cluster_split_launches_clusters(fresh, art):
    """A split config launches split CTAs per row group, as clusters of split CTAs (with or without PDL)."""
    fake = fresh()
    rec = next(r for r in loader.DEVICES[0].table.values() if r.variant.config.kind == "mma")
    cfg = dataclasses.replace(rec.variant.config, split=2, prefetch=False)
    ids = fake.CUlaunchAttributeID
    pdl, cluster = (
        int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION),
        int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION),
    )
    for with_pdl, attrs in ((True, [(pdl, 1), (cluster, (2, 1, 1))]), (False, [(cluster, (2, 1, 1))])):
        variant = dataclasses.replace(
            rec.variant, config=dataclasses.replace(cfg, pdl=with_pdl), cluster=2, pdl=with_pdl
        )
        driver_mod.launch(driver_mod.Launch(variant, rec.function, rec.n, rec.k), 16, 32, 48, 0, 5)
        assert fake.launches[-1]["grid"] == (rec.n // variant.cols_per_cta * 2, 1, 1)
        assert fake.launches[-1]["attrs"] == attrs


def test_persistent_config_caps_the_grid(fresh, art):
    fake = fresh()
    rec = next(r for r in loader.DEVICES[0].table.values() if r.variant.config.kind == "simt")
    groups = rec.n // rec.variant.cols_per_cta
    assert groups > 1, "a one-group shape cannot show the cap"
    cfg = dataclasses.replace(rec.variant.config, prefetch=False, early=True, pdl=True, persist=max(groups // 2, 1))
    driver_mod.launch(
        driver_mod.Launch(dataclasses.replace(rec.variant, config=cfg), rec.function, rec.n, rec.k), 16, 32, 48, 0, 5
    )
    assert fake.launches[-1]["grid"] == (max(groups // 2, 1), 1, 1)


def test_manifest_cluster_contradicting_config_refused(fresh, art):
    data = manifest_of(art)
    v = data["variants"][0]
    v["grid"]["cluster"] = contradicting_cluster(v)
    write_manifest(art, data)
    msg = refusal(fresh)
    assert v["file"] in msg and f"cluster {v['grid']['cluster']}" in msg and "contradicts its config" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_launch_error_raises(fresh, art):
    fake = fresh()
    rec = next(iter(loader.DEVICES[0].table.values()))
    fake.cuLaunchKernelEx = lambda *a: (R.CUDA_ERROR_INVALID_HANDLE,)
    with pytest.raises(driver_mod.DriverError, match="CUDA_ERROR_INVALID_HANDLE"):
        driver_mod.launch(rec, 16, 32, 48, 0, 5)


def test_flipped_byte_refuses_that_variant(fresh, art):
    v = first_variant(art)
    path = art / "sm_90a" / v["file"]
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    path.write_bytes(bytes(blob))
    msg = refusal(fresh)
    assert v["file"] in msg and "sha256 mismatch" in msg
    table = loader.DEVICES[0].table
    assert plans_of(art, v["id"]) and not plans_of(art, v["id"]) & set(table)
    assert set(table) == all_plans(art) - plans_of(art, v["id"])


def test_missing_cubin_refused(fresh, art):
    v = first_variant(art)
    (art / "sm_90a" / v["file"]).unlink()
    msg = refusal(fresh)
    assert v["file"] in msg and "cubin missing" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_sm121_artifacts_where_sm90a_expected(fresh, art):
    shutil.rmtree(art / "sm_90a")
    shutil.copytree(art / "sm_121", art / "sm_90a")
    msg = refusal(fresh)
    assert "manifest is for sm_121, expected sm_90a" in msg and str(art / "sm_90a" / MANIFEST_NAME) in msg
    assert loader.DEVICES[0].table == {}
    assert driver_mod.driver.count("cuLibraryLoadData") == 0


def test_sm121_cubin_in_sm90a_manifest(fresh, art):
    """Even with a manifest rewritten to match its hash, another arch's cubin is refused before the driver sees it."""
    data = manifest_of(art)
    v = data["variants"][0]
    other = next((art / "sm_121").glob("*.cubin")).read_bytes()
    (art / "sm_90a" / v["file"]).write_bytes(other)
    v["sha256"], v["size"] = hashlib.sha256(other).hexdigest(), len(other)
    write_manifest(art, data)
    msg = refusal(fresh)
    assert v["file"] in msg and "ELF arch is sm_121, manifest says sm_90a" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_driver_no_binary_refused(fresh, art):
    v = first_variant(art)
    fail = {f"cuLibraryLoadData:{v['symbol']}": R.CUDA_ERROR_NO_BINARY_FOR_GPU}
    msg = refusal(fresh, setup=lambda f: f.fail.update(fail))
    assert v["file"] in msg and "CUDA_ERROR_NO_BINARY_FOR_GPU" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_other_package_version_refused(fresh, art):
    data = manifest_of(art)
    data["package_version"] = "0.0.9"
    write_manifest(art, data)
    msg = refusal(fresh)
    assert "0.0.9" in msg and str(art / "sm_90a" / MANIFEST_NAME) in msg
    assert loader.DEVICES[0].table == {}


def test_other_schema_refused(fresh, art):
    data = manifest_of(art)
    data["schema"] = 99
    write_manifest(art, data)
    assert "schema 99" in the_warning(fresh())


def test_garbage_manifest_refused(fresh, art):
    (art / "sm_90a" / MANIFEST_NAME).write_text("{not json")
    assert "unreadable manifest" in the_warning(fresh())
    assert loader.DEVICES[0].table == {}


def test_manifest_param_layout_differs_from_runtime_abi(fresh, art):
    data = manifest_of(art)
    v = data["variants"][0]
    v["params"][5][1] = 40
    write_manifest(art, data)
    msg = refusal(fresh)
    assert v["file"] in msg and "parameter layout" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_driver_param_layout_differs_from_manifest(fresh, art):
    v = first_variant(art)
    bad = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4)]
    msg = refusal(fresh, setup=lambda f: f.param_override.update({v["symbol"]: bad}))
    assert v["file"] in msg and "driver reports parameter layout" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_driver_reports_extra_param(fresh, art):
    v = first_variant(art)
    more = [(off, size) for _, off, size in PARAMS] + [(40, 4)]
    msg = refusal(fresh, setup=lambda f: f.param_override.update({v["symbol"]: more}))
    assert v["file"] in msg and "more than" in msg


def test_function_refused_at_bind(fresh, art):
    v = first_variant(art)
    fail = {f"cuKernelGetFunction:{v['symbol']}": R.CUDA_ERROR_INVALID_IMAGE}
    msg = refusal(fresh, setup=lambda f: f.fail.update(fail))
    assert v["file"] in msg and "CUDA_ERROR_INVALID_IMAGE" in msg and "GPU 0" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_bind_failure_inside_capture_retries_outside(fresh, art, monkeypatch):
    v = first_variant(art)
    key = sorted(plans_of(art, v["id"]))[0]
    fake = fresh()
    fake.fail[f"cuKernelGetFunction:{v['symbol']}"] = R.CUDA_ERROR_INVALID_CONTEXT
    table = loader.DEVICES[0].table
    monkeypatch.setattr(driver_mod, "capturing", lambda ordinal: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert table.get(key) is None, "falls back inside the capture"
    assert key in table and loader.DEVICES[0].refused == {}, "no refusal made for good inside a capture"
    monkeypatch.setattr(driver_mod, "capturing", lambda ordinal: False)
    del fake.fail[f"cuKernelGetFunction:{v['symbol']}"]
    assert table.get(key) is not None and loader.DEVICES[0].refused == {}


@pytest.mark.parametrize(
    ("current", "captured"), [(0, 1), (0, 0)], ids=["capture-on-the-launch-device", "capture-on-the-current-device"]
)
def test_cross_device_first_call_inside_a_capture_defers(fresh, art, monkeypatch, current, captured):
    """A first call for GPU 1 while GPU ``current`` is the thread's device and GPU ``captured``'s stream captures:
    a driver failure then may be the capture's doing, so it refuses nothing for good."""
    v = first_variant(art)
    key = sorted(plans_of(art, v["id"]))[0]
    fake = fresh(caps=[(9, 0), (9, 0)])
    fake.fail[f"cuLibraryLoadData:{v['symbol']}"] = R.CUDA_ERROR_INVALID_CONTEXT
    capture = FakeCapture(monkeypatch, current=current, capturing={captured})
    dev = loader.DEVICES[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert dev.table.get(key) is None, "falls back inside the capture"
    assert key in dev.table and dev.library.refused == {} and dev.refused == {}, "nothing refused for good"
    assert capture.current == current, "the thread's current device is restored"
    capture.capturing.clear()
    del fake.fail[f"cuLibraryLoadData:{v['symbol']}"]
    assert dev.table.get(key) is not None, "the next call outside the capture loads it"


def test_first_call_outside_any_capture_refuses_a_driver_failure(fresh, art, monkeypatch):
    """The negative control of the test above: with no capture anywhere the same failure refuses the variant."""
    v = first_variant(art)
    key = sorted(plans_of(art, v["id"]))[0]
    fake = fresh(caps=[(9, 0), (9, 0)])
    fake.fail[f"cuLibraryLoadData:{v['symbol']}"] = R.CUDA_ERROR_INVALID_CONTEXT
    FakeCapture(monkeypatch, current=0)
    with pytest.warns(ArtifactWarning, match="CUDA_ERROR_INVALID_CONTEXT"):
        assert loader.DEVICES[1].table.get(key) is None
    assert key not in loader.DEVICES[1].table and v["file"] in loader.DEVICES[1].library.refused


def test_damaged_cubin_inside_capture_is_refused_at_once(fresh, art, monkeypatch):
    """A host-check failure is the file's doing, not the capture's: refused for good, F.linear from then on."""
    v = first_variant(art)
    (art / "sm_90a" / v["file"]).write_bytes(b"junk")
    key = sorted(plans_of(art, v["id"]))[0]
    fresh()
    monkeypatch.setattr(driver_mod, "capturing", lambda ordinal: True)
    with pytest.warns(ArtifactWarning, match="sha256 mismatch"):
        assert loader.DEVICES[0].table.get(key) is None
    assert key not in loader.DEVICES[0].table


def test_incomplete_dir_without_manifest_warns(fresh, art):
    (art / "sm_90a" / MANIFEST_NAME).unlink()
    assert "no manifest" in the_warning(fresh())
    assert loader.DEVICES[0].table == {}


def test_absent_arch_warns_once_naming_it(fresh, art):
    # A wheel built for another arch: every shape falls back, so the user must hear it once, as a warning.
    shutil.rmtree(art / "sm_90a")
    warning = the_warning(fresh())
    assert "no sm_90a cubins" in warning and "install the wheel built for sm_90a" in warning
    assert loader.DEVICES[0].table == {}
    assert "no manifest" in loader.STATE.libraries["sm_90a"].error


def test_several_problems_one_warning(fresh, art):
    data = manifest_of(art)
    a, b = data["variants"][0], data["variants"][1]
    (art / "sm_90a" / a["file"]).unlink()
    (art / "sm_90a" / b["file"]).write_bytes(b"garbage")
    fresh()
    msgs = bind_all()
    assert len(msgs) == 2 and a["file"] in msgs[0] + msgs[1] and b["file"] in msgs[0] + msgs[1]


def test_warnings_as_errors_leave_a_complete_state(fresh, art):
    v = first_variant(art)
    (art / "sm_90a" / v["file"]).unlink()
    fresh()
    table = loader.DEVICES[0].table
    key = sorted(plans_of(art, v["id"]))[0]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(ArtifactWarning):
            table.get(key)
        assert table.get(key) is None, "refused once, quietly from then on"
    assert loader.STATE.loaded and loader.STATE.error is None
    assert set(table) == all_plans(art) - plans_of(art, v["id"])


def test_manifest_warning_as_error_leaves_a_complete_state(monkeypatch, art):
    monkeypatch.setattr(loader, "STATE", loader.State())
    monkeypatch.setattr(loader, "DEVICES", {})
    monkeypatch.setattr(driver_mod, "driver", FakeDriver())
    (art / "sm_90a" / MANIFEST_NAME).write_text("[]")
    with warnings.catch_warnings():
        warnings.simplefilter("error", ArtifactWarning)
        warnings.simplefilter("ignore", loader.ArtifactsOverrideWarning)
        with pytest.raises(ArtifactWarning):
            loader.load()
    assert loader.STATE.loaded and loader.STATE.error is None and loader.DEVICES[0].table == {}


def test_hook_never_raises(monkeypatch):
    monkeypatch.setattr(loader, "load", lambda: 1 / 0)
    loader._hook()


def test_capture_mode_relaxed_while_binding(fresh, art):
    seen = []

    def setup(fake):
        original = fake.cuKernelGetFunction

        def spy(kernel):
            seen.append(fake.capture_mode[0])
            return original(kernel)

        fake.cuKernelGetFunction = spy

    fake = fresh(setup=setup)
    bind_all()
    relaxed = int(fake.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    assert seen and set(seen) == {relaxed}
    assert fake.capture_mode == [0]


def test_launch_for_checks_the_shape(fresh, art):
    fresh()
    table = loader.DEVICES[0]
    (n, k, m), rec = next(iter(table.table.items()))
    assert table.launch_for(rec.variant.id, n, k).grid == rec.grid
    with pytest.raises(ValueError, match="cannot run"):
        table.launch_for(rec.variant.id, n, k + 1)
    with pytest.raises(KeyError):
        table.launch_for("nope", n, k)


def test_cubin_sm_reads_the_elf_header(built):
    for arch, sm in (("sm_90a", 90), ("sm_121", 121)):
        blob = next((built["root"] / arch).glob("*.cubin")).read_bytes()
        assert elf.sm_of(blob) == sm
        with pytest.raises(elf.CubinError, match="outside the file"):
            elf.sm_of(blob[: len(blob) // 2])
    for junk in (b"\x7fELF" + b"\0" * 100, b"short"):
        with pytest.raises(elf.CubinError):
            elf.sm_of(junk)


def test_first_call_inside_a_capture_loads_and_binds_in_relaxed_mode(fresh, art, monkeypatch):
    """The lazy path inside a capture: cuLibraryLoadData and the binding calls all run in relaxed capture mode."""
    modes = []

    def setup(fake):
        for name in ("cuLibraryLoadData", "cuKernelGetFunction"):
            original = getattr(fake, name)

            def spy(*args, _original=original, _name=name):
                modes.append((_name, fake.capture_mode[0]))
                return _original(*args)

            setattr(fake, name, spy)

    fake = fresh(setup=setup)
    monkeypatch.setattr(driver_mod, "capturing", lambda ordinal: True)
    key = min(all_plans(art))
    assert loader.DEVICES[0].table.get(key) is not None
    relaxed = int(fake.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED)
    assert modes == [("cuLibraryLoadData", relaxed), ("cuKernelGetFunction", relaxed)]
    assert fake.capture_mode == [0], "the thread's capture mode is restored"


def test_launch_table_is_a_lazy_mapping(fresh, art):
    fresh()
    table = loader.DEVICES[0].table
    key = min(all_plans(art))
    assert key in table and len(table) == len(all_plans(art)) and table.bound == {}, "membership binds nothing"
    assert table[key] is table.get(key) is table.bound[key]
    assert table.get((1, 1, 1)) is None and (1, 1, 1) not in table
    with pytest.raises(KeyError):
        table[(1, 1, 1)]
    del table[key]
    assert table.get(key) is None and key not in table, "a dropped key (a launch the driver refused) stays dropped"
