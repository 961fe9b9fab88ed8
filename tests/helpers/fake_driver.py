"""A fake ``cuda.bindings.driver`` for CPU tests: GPUs of given capabilities, a driver that reads the cubins
it is given (runtime/elf.py) the way the real one would (arch, symbols, parameter layout), and records launches.

Install it with ``monkeypatch.setattr(skinny_gemm.runtime.driver, "driver", FakeDriver(...))`` (the ``fresh``
fixture in helpers/artifacts.py does).
"""

from __future__ import annotations

import ctypes
import enum

from skinny_gemm.runtime.manifest import PARAMS


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
        self.loaded_bytes = 0

    def __getattr__(self, name):
        return getattr(self._real, name)  # enums and structs (CUlaunchConfig, ...)

    def _log(self, name):
        self.calls.append(name)

    def count(self, name) -> int:
        """How many times the loader called ``name`` (the calls that load or bind are logged)."""
        return self.calls.count(name)

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
        from skinny_gemm.runtime import elf

        self._log("cuLibraryLoadData")
        self.loaded_bytes += len(code)
        try:
            info = elf.inspect(bytes(code))
        except elf.CubinError:
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
        self._log("cuKernelGetFunction")
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
            (
                int(a.id),
                (a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z)
                if int(a.id) == cluster
                else a.value.programmaticStreamSerializationAllowed,
            )
            for a in config.attrs[: config.numAttrs]
        ]
        grid = (config.gridDimX, config.gridDimY, config.gridDimZ)
        block = (config.blockDimX, config.blockDimY, config.blockDimZ)
        return self._record(fn, grid, block, config.sharedMemBytes, int(config.hStream), argv, attrs)

    def cuLaunchKernel(self, fn, gx, gy, gz, bx, by, bz, smem, stream, argv, extra):
        assert extra == 0
        return self._record(fn, (gx, gy, gz), (bx, by, bz), smem, int(stream), argv, [])
