"""The loader on CPU: manifest, hash and arch checks run for real on built artifacts; only the
driver calls that need a GPU are played by FakeDriver, which reads the cubins itself (aot.cubin)
the way the driver would: arch, symbols, parameter layout.
"""

from __future__ import annotations

import ctypes
import dataclasses
import enum
import hashlib
import json
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from skinny_gemm.runtime import loader
from skinny_gemm.runtime.manifest import MANIFEST_NAME, PARAMS

ROOT = Path(__file__).resolve().parents[2]


class R(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_FOUND = 500


class FakeDriver:
    """cuda.bindings.driver for a machine with GPUs of the given capabilities; structs and enums are the real ones.

    It fails the test if the loader ever retains a primary context that is not active (that
    would create a context torch has not created) or resolves a function without a current context;
    like the H200's driver, it answers cuKernelGetParamInfo only with a context current.
    """

    def __init__(self, caps=((9, 0),), active=None):
        from cuda.bindings import driver as real

        self._real = real
        self.caps = list(caps)
        self.active = list(active) if active is not None else [True] * len(self.caps)
        self.ctx_stack: list[int] = []
        self.capture_mode = [0]
        self.calls: list[str] = []
        self.launches: list[dict] = []
        self.fail: dict[str, R] = {}  # "<call>:<symbol or file marker>" -> error
        self.param_override: dict[str, list] = {}

    def __getattr__(self, name):
        return getattr(self._real, name)  # enums and structs (CUlaunchConfig, ...)

    def _log(self, name):
        self.calls.append(name)

    def cuInit(self, flags):
        self._log("cuInit")
        return (R.CUDA_SUCCESS,)

    def cuDriverGetVersion(self):
        return (R.CUDA_SUCCESS, 13000)

    def cuDeviceGetCount(self):
        return (R.CUDA_SUCCESS, len(self.caps))

    def cuDeviceGet(self, ordinal):
        if not 0 <= ordinal < len(self.caps):
            return (R.CUDA_ERROR_INVALID_VALUE, None)
        return (R.CUDA_SUCCESS, ordinal)

    def cuDeviceGetAttribute(self, attr, dev):
        a = self._real.CUdevice_attribute
        if attr == a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR:
            return (R.CUDA_SUCCESS, self.caps[dev][0])
        if attr == a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR:
            return (R.CUDA_SUCCESS, self.caps[dev][1])
        return (R.CUDA_ERROR_INVALID_VALUE, None)

    def cuDeviceGetName(self, length, dev):
        return (R.CUDA_SUCCESS, f"Fake GPU {self.caps[dev]}".encode().ljust(length, b"\0"))

    def cuLibraryLoadData(self, code, *options):
        from skinny_gemm.aot import cubin

        self._log("cuLibraryLoadData")
        try:
            info = cubin.inspect(bytes(code))
        except cubin.CubinError:
            return (R.CUDA_ERROR_INVALID_IMAGE, None)
        for marker, err in self.fail.items():
            if marker.startswith("cuLibraryLoadData:") and marker.split(":", 1)[1] in info.kernels:
                return (err, None)
        return (R.CUDA_SUCCESS, {"info": info})

    def cuLibraryUnload(self, lib):
        self._log("cuLibraryUnload")
        return (R.CUDA_SUCCESS,)

    def cuLibraryGetKernel(self, lib, name):
        assert isinstance(name, bytes)
        sym = name.decode()
        if sym not in lib["info"].kernels:
            return (R.CUDA_ERROR_NOT_FOUND, None)
        params = self.param_override.get(sym) or [(off, size) for _, off, size in lib["info"].kernels[sym].params]
        return (R.CUDA_SUCCESS, {"symbol": sym, "params": params})

    def cuKernelGetParamInfo(self, kernel, index):
        if not self.ctx_stack:  # as the H200's driver 580 answers at load, before any context is current
            return (R.CUDA_ERROR_INVALID_CONTEXT, None, None)
        if index >= len(kernel["params"]):
            return (R.CUDA_ERROR_INVALID_VALUE, None, None)
        return (R.CUDA_SUCCESS, *kernel["params"][index])

    def cuDevicePrimaryCtxGetState(self, dev):
        return (R.CUDA_SUCCESS, 0, int(self.active[dev]))

    def cuDevicePrimaryCtxRetain(self, dev):
        assert self.active[dev], "the loader would create a primary context torch has not created"
        return (R.CUDA_SUCCESS, 1000 + dev)

    def cuDevicePrimaryCtxRelease(self, dev):
        return (R.CUDA_SUCCESS,)

    def cuCtxPushCurrent(self, ctx):
        self.ctx_stack.append(ctx)
        return (R.CUDA_SUCCESS,)

    def cuCtxPopCurrent(self):
        return (R.CUDA_SUCCESS, self.ctx_stack.pop())

    def cuThreadExchangeStreamCaptureMode(self, mode):
        old, self.capture_mode[0] = self.capture_mode[0], int(mode)
        return (R.CUDA_SUCCESS, old)

    def cuKernelGetFunction(self, kernel):
        assert self.ctx_stack, "cuKernelGetFunction without a current context"
        err = self.fail.get(f"cuKernelGetFunction:{kernel['symbol']}")
        if err is not None:
            return (err, None)
        return (R.CUDA_SUCCESS, {"kernel": kernel, "ctx": self.ctx_stack[-1]})

    def cuFuncGetAttribute(self, attr, fn):
        return (R.CUDA_SUCCESS, 1024)

    def cuFuncSetAttribute(self, fn, attr, value):
        return (R.CUDA_SUCCESS,)

    def _record(self, fn, grid, block, smem, stream, argv, attrs):
        ptrs = (ctypes.c_uint64 * len(PARAMS)).from_address(argv)
        values = {}
        for (name, _, size), ptr in zip(PARAMS, ptrs):
            ctype = ctypes.c_uint64 if size == 8 else ctypes.c_int32
            values[name] = ctype.from_address(ptr).value
        self.launches.append(
            {"fn": fn, "grid": grid, "block": block, "smem": smem, "stream": stream, "attrs": attrs, **values}
        )
        return (R.CUDA_SUCCESS,)

    def cuLaunchKernelEx(self, config, fn, argv, extra):
        assert extra == 0
        cluster = int(self._real.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
        attrs = [
            (int(a.id), (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z) if int(a.id) == cluster
             else a.value.programmaticStreamSerializationAllowed)
            for a in config.attrs[: config.numAttrs]
        ]
        grid = (config.gridDimX, config.gridDimY, config.gridDimZ)
        block = (config.blockDimX, config.blockDimY, config.blockDimZ)
        return self._record(fn, grid, block, config.sharedMemBytes, int(config.hStream), argv, attrs)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        assert extra == 0
        return self._record(fn, (gx, gy, gz), (bx, by, bz), smem, int(stream), argv, [])


@pytest.fixture(scope="session")
def built(tmp_path_factory):
    """Freshly built artifacts for both targets (the build cache makes this seconds)."""
    pytest.importorskip("cutlass", reason="building artifacts needs nvidia-cutlass-dsl")
    from skinny_gemm.aot import build

    root = tmp_path_factory.mktemp("built")
    for arch in ("sm_90a", "sm_121"):
        build.build(arch, root, progress=False)
    return root


@pytest.fixture
def art(built, tmp_path, monkeypatch):
    """A private copy of the built artifacts, used through $SKINNY_GEMM_ARTIFACTS."""
    root = tmp_path / "art"
    shutil.copytree(built, root)
    monkeypatch.setenv(loader.ENV_ARTIFACTS, str(root))
    return root


@pytest.fixture
def fresh(monkeypatch):
    """Give the loader a clean state and return a function that installs a FakeDriver and loads."""
    monkeypatch.setattr(loader, "STATE", loader.State())
    monkeypatch.setattr(loader, "DEVICES", {})

    def run(caps=((9, 0),), active=None, setup=None):
        fake = FakeDriver(caps, active)
        if setup:
            setup(fake)
        monkeypatch.setattr(loader, "driver", fake)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader.load()
        fake.warnings = [w for w in caught if issubclass(w.category, loader.ArtifactWarning)]
        return fake

    return run


def manifest_of(root, arch="sm_90a"):
    return json.loads((root / arch / MANIFEST_NAME).read_text())


def write_manifest(root, data, arch="sm_90a"):
    (root / arch / MANIFEST_NAME).write_text(json.dumps(data))


def first_variant(root, arch="sm_90a"):
    return manifest_of(root, arch)["variants"][0]


def plans_of(root, variant_id, arch="sm_90a"):
    return {(p["n"], p["k"], p["m"]) for p in manifest_of(root, arch)["plans"] if p["variant"] == variant_id}


def all_plans(root, arch="sm_90a"):
    return {(p["n"], p["k"], p["m"]) for p in manifest_of(root, arch)["plans"]}


def the_warning(fake):
    assert len(fake.warnings) == 1, [str(w.message) for w in fake.warnings]
    return str(fake.warnings[0].message)


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
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
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

    monkeypatch.setattr(loader, "driver", NoLib())
    state = loader.load()
    assert state.loaded and "no CUDA driver" in state.error and loader.DEVICES == {}


def test_load_never_raises(fresh, art):
    def boom(fake):
        def explode(*args):
            raise RuntimeError("driver exploded")

        fake.cuDeviceGetCount = explode

    fresh(setup=boom)
    assert "driver exploded" in loader.STATE.error and loader.DEVICES == {}


def test_clean_load_binds_every_variant(fresh, art):
    fake = fresh()
    assert fake.warnings == []
    table = loader.DEVICES[0]
    lib = table.library
    assert table.arch == "sm_90a" and lib.error is None and lib.refused == {}
    assert len(lib.kernels) == len(manifest_of(art)["variants"])
    assert set(table.table) == all_plans(art)
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
    assert len(table.library.kernels) > 0, "libraries load without a context"
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
    loader.launch(rec, 0x1000, 0x2000, 0x3000, 0, 77)
    loader.launch(rec, 0x1010, 0x2010, 0x3010, 0x4000, 78)
    first, second = fake.launches
    assert (first["a"], first["w"], first["out"], first["residual"], first["n"], first["k"]) == (0x1000, 0x2000, 0x3000, 0, n, k)
    assert (second["a"], second["residual"], second["stream"]) == (0x1010, 0x4000, 78)
    assert first["grid"] == (n // rec.variant.cols_per_cta, 1, 1) and first["block"] == rec.variant.block
    pdl = int(fake.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION)
    assert first["attrs"] == [(pdl, 1)] and first["stream"] == 77


def test_launch_without_pdl_uses_plain_launch(fresh, art):
    fake = fresh()
    rec = next(iter(loader.DEVICES[0].table.values()))
    plain = loader.Launch(dataclasses.replace(rec.variant, pdl=False), rec.function, rec.n, rec.k)
    loader.launch(plain, 16, 32, 48, 0, 5)
    assert fake.launches[-1]["attrs"] == [] and fake.launches[-1]["n"] == rec.n


def test_cluster_split_launches_clusters(fresh, art):
    """A split config launches split CTAs per row group, as clusters of split CTAs (with or without PDL)."""
    fake = fresh()
    rec = next(r for r in loader.DEVICES[0].table.values() if r.variant.config.kind == "mma")
    cfg = dataclasses.replace(rec.variant.config, split=2, prefetch=False)
    ids = fake.CUlaunchAttributeID
    pdl, cluster = int(ids.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION), int(ids.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION)
    for with_pdl, attrs in ((True, [(pdl, 1), (cluster, (2, 1, 1))]), (False, [(cluster, (2, 1, 1))])):
        variant = dataclasses.replace(rec.variant, config=dataclasses.replace(cfg, pdl=with_pdl), cluster=2, pdl=with_pdl)
        loader.launch(loader.Launch(variant, rec.function, rec.n, rec.k), 16, 32, 48, 0, 5)
        assert fake.launches[-1]["grid"] == (rec.n // variant.cols_per_cta * 2, 1, 1)
        assert fake.launches[-1]["attrs"] == attrs


def test_persistent_config_caps_the_grid(fresh, art):
    fake = fresh()
    rec = next(r for r in loader.DEVICES[0].table.values() if r.variant.config.kind == "simt")
    groups = rec.n // rec.variant.cols_per_cta
    assert groups > 1, "a one-group shape cannot show the cap"
    cfg = dataclasses.replace(rec.variant.config, prefetch=False, early=True, pdl=True, persist=max(groups // 2, 1))
    loader.launch(loader.Launch(dataclasses.replace(rec.variant, config=cfg), rec.function, rec.n, rec.k), 16, 32, 48, 0, 5)
    assert fake.launches[-1]["grid"] == (max(groups // 2, 1), 1, 1)


def test_manifest_cluster_contradicting_config_refused(fresh, art):
    data = manifest_of(art)
    v = data["variants"][0]
    v["grid"]["cluster"] = 2
    write_manifest(art, data)
    msg = the_warning(fresh())
    assert v["file"] in msg and "cluster 2" in msg and "contradicts its config" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_launch_error_raises(fresh, art):
    fake = fresh()
    rec = next(iter(loader.DEVICES[0].table.values()))
    fake.cuLaunchKernelEx = lambda *a: (R.CUDA_ERROR_INVALID_HANDLE,)
    with pytest.raises(loader.DriverError, match="CUDA_ERROR_INVALID_HANDLE"):
        loader.launch(rec, 16, 32, 48, 0, 5)


def test_flipped_byte_refuses_that_variant(fresh, art):
    v = first_variant(art)
    path = art / "sm_90a" / v["file"]
    blob = bytearray(path.read_bytes())
    blob[len(blob) // 2] ^= 0x40
    path.write_bytes(bytes(blob))
    fake = fresh()
    msg = the_warning(fake)
    assert v["file"] in msg and "sha256" in msg
    table = loader.DEVICES[0].table
    assert plans_of(art, v["id"]) and not plans_of(art, v["id"]) & set(table)
    assert set(table) == all_plans(art) - plans_of(art, v["id"])


def test_missing_cubin_refused(fresh, art):
    v = first_variant(art)
    (art / "sm_90a" / v["file"]).unlink()
    fake = fresh()
    msg = the_warning(fake)
    assert v["file"] in msg and "unreadable" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_sm121_artifacts_where_sm90a_expected(fresh, art):
    shutil.rmtree(art / "sm_90a")
    shutil.copytree(art / "sm_121", art / "sm_90a")
    fake = fresh()
    msg = the_warning(fake)
    assert "manifest is for sm_121, expected sm_90a" in msg and str(art / "sm_90a" / MANIFEST_NAME) in msg
    assert loader.DEVICES[0].table == {}
    assert not any(c == "cuLibraryLoadData" for c in fake.calls)


def test_sm121_cubin_in_sm90a_manifest(fresh, art):
    """Even with a manifest rewritten to match its hash, another arch's cubin is refused before the driver sees it."""
    data = manifest_of(art)
    v = data["variants"][0]
    other = next((art / "sm_121").glob("*.cubin")).read_bytes()
    (art / "sm_90a" / v["file"]).write_bytes(other)
    v["sha256"], v["size"] = hashlib.sha256(other).hexdigest(), len(other)
    write_manifest(art, data)
    fake = fresh()
    msg = the_warning(fake)
    assert v["file"] in msg and "sm_121 code" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_driver_no_binary_refused(fresh, art):
    v = first_variant(art)
    fake = fresh(setup=lambda f: f.fail.update({f"cuLibraryLoadData:{v['symbol']}": R.CUDA_ERROR_NO_BINARY_FOR_GPU}))
    msg = the_warning(fake)
    assert v["file"] in msg and "CUDA_ERROR_NO_BINARY_FOR_GPU" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_other_package_version_refused(fresh, art):
    data = manifest_of(art)
    data["package_version"] = "0.0.9"
    write_manifest(art, data)
    fake = fresh()
    msg = the_warning(fake)
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
    msg = the_warning(fresh())
    assert v["file"] in msg and "parameter layout" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_driver_param_layout_differs_from_manifest(fresh, art):
    v = first_variant(art)
    bad = [(0, 8), (8, 8), (16, 8), (24, 8), (32, 8), (40, 4)]
    msg = the_warning(fresh(setup=lambda f: f.param_override.update({v["symbol"]: bad})))
    assert v["file"] in msg and "driver reports parameter layout" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_driver_reports_extra_param(fresh, art):
    v = first_variant(art)
    more = [(off, size) for _, off, size in PARAMS] + [(40, 4)]
    msg = the_warning(fresh(setup=lambda f: f.param_override.update({v["symbol"]: more})))
    assert v["file"] in msg and "more than" in msg


def test_function_refused_at_bind(fresh, art):
    v = first_variant(art)
    fake = fresh(setup=lambda f: f.fail.update({f"cuKernelGetFunction:{v['symbol']}": R.CUDA_ERROR_INVALID_IMAGE}))
    msg = the_warning(fake)
    assert v["file"] in msg and "CUDA_ERROR_INVALID_IMAGE" in msg and "GPU 0" in msg
    assert set(loader.DEVICES[0].table) == all_plans(art) - plans_of(art, v["id"])


def test_bind_failure_inside_capture_retries_outside(fresh, art, monkeypatch):
    v = first_variant(art)
    fake = fresh(active=[False])
    fake.fail[f"cuKernelGetFunction:{v['symbol']}"] = R.CUDA_ERROR_INVALID_CONTEXT
    fake.active[0] = True
    table = loader.DEVICES[0]
    monkeypatch.setattr(loader, "_capturing", lambda: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert table.bind() == {} and table.table is None, "no refusal made for good inside a capture"
    monkeypatch.setattr(loader, "_capturing", lambda: False)
    del fake.fail[f"cuKernelGetFunction:{v['symbol']}"]
    assert set(table.bind()) == all_plans(art) and table.refused == {}


def test_incomplete_dir_without_manifest_warns(fresh, art):
    (art / "sm_90a" / MANIFEST_NAME).unlink()
    assert "no manifest" in the_warning(fresh())
    assert loader.DEVICES[0].table == {}


def test_absent_artifacts_fall_back_quietly(fresh, art):
    shutil.rmtree(art / "sm_90a")
    fake = fresh()
    assert fake.warnings == [] and loader.DEVICES[0].table == {}
    assert "no manifest" in loader.STATE.libraries["sm_90a"].error


def test_several_problems_one_warning(fresh, art):
    data = manifest_of(art)
    a, b = data["variants"][0], data["variants"][1]
    (art / "sm_90a" / a["file"]).unlink()
    (art / "sm_90a" / b["file"]).write_bytes(b"garbage")
    msg = the_warning(fresh())
    assert a["file"] in msg and b["file"] in msg


def test_warnings_as_errors_leave_a_complete_state(monkeypatch, art):
    monkeypatch.setattr(loader, "STATE", loader.State())
    monkeypatch.setattr(loader, "DEVICES", {})
    monkeypatch.setattr(loader, "driver", FakeDriver())
    (art / "sm_90a" / first_variant(art)["file"]).unlink()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(loader.ArtifactWarning):
            loader.load()
    assert loader.STATE.loaded and loader.STATE.error is None
    assert len(loader.DEVICES[0].table) == len(all_plans(art)) - len(plans_of(art, first_variant(art)["id"]))


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
        blob = next((built / arch).glob("*.cubin")).read_bytes()
        assert loader.cubin_sm(blob) == sm
    assert loader.cubin_sm(b"\x7fELF" + b"\0" * 100) is None
    assert loader.cubin_sm(b"short") is None
