"""A fake ``cuda.bindings.driver`` for CPU tests: GPUs of given capabilities, a driver that reads the cubins
it is given (runtime/elf.py) the way the real one would (arch, symbols, parameter layout), and records launches,
device allocations, tensor-map encodes, host-to-device copies and stream synchronizations.

Install it with ``monkeypatch.setattr(skinny_gemm.runtime.driver, "driver", FakeDriver(...))`` (the ``fresh``
fixture in helpers/artifacts.py does).
"""

from __future__ import annotations

import ctypes
import enum
import hashlib

from skinny_gemm.runtime.manifest import PARAMS


class R(enum.IntEnum):
    CUDA_SUCCESS = 0
    CUDA_ERROR_INVALID_VALUE = 1
    CUDA_ERROR_OUT_OF_MEMORY = 2
    CUDA_ERROR_INVALID_IMAGE = 200
    CUDA_ERROR_INVALID_CONTEXT = 201
    CUDA_ERROR_NO_BINARY_FOR_GPU = 209
    CUDA_ERROR_INVALID_HANDLE = 400
    CUDA_ERROR_NOT_FOUND = 500
    CUDA_ERROR_STREAM_CAPTURE_IMPLICIT = 906


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
        # Device memory: cuMemAlloc'd blocks, tensor-map encodes, host-to-device copies, stream syncs (in order).
        self.allocs: list[dict] = []
        self.encodes: list[dict] = []
        self.copies: list[dict] = []
        self.syncs: list[int] = []  # the stream of each cuStreamSynchronize call
        self.capturing_streams: set[int] = set()  # raw streams whose cuStreamIsCapturing says ACTIVE
        self.memory: dict[int, bytes] = {}  # copy destination -> the bytes copied there (the last copy)
        self._next_alloc = 0x7F00_0000_0000
        self._maps: list = []  # every encoded map's host bytes, kept alive
        # cuFuncGetAttribute's answers by attribute (default 1024: the threads-per-block limit), and every
        # cuFuncSetAttribute as (attribute, value)
        self.func_attrs: dict = {}
        self.func_sets: list[tuple] = []

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
        return (R.CUDA_SUCCESS, self.func_attrs.get(attr, 1024))

    def cuFuncSetAttribute(self, fn, attr, value):
        self.func_sets.append((attr, value))
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

    # Device memory and tensor maps: a failure is injected with fail["<call>"] = error.

    def cuMemAlloc(self, size):
        self._log("cuMemAlloc")
        if not self.ctx_stack:
            return (R.CUDA_ERROR_INVALID_CONTEXT, None)
        err = self.fail.get("cuMemAlloc")
        if err is not None:
            return (err, None)
        if size <= 0:
            return (R.CUDA_ERROR_INVALID_VALUE, None)
        # 256-byte aligned as the real allocator's (it gives more), blocks apart: no two blocks are contiguous
        base = self._next_alloc
        self._next_alloc += (size + 0x1FFFFF) // 0x200000 * 0x200000 + 0x200000
        self.allocs.append({"ptr": base, "bytes": size, "ctx": self.ctx_stack[-1]})
        return (R.CUDA_SUCCESS, self._real.CUdeviceptr(base))

    def cuTensorMapEncodeTiled(self, dtype, rank, ptr, dims, strides, box, elem, interleave, swizzle, l2, oob):
        """Checks the argument types and the documented limits the runtime's maps meet, records the arguments
        (as ints and enums) and returns a map whose 128 bytes are a digest of them."""
        self._log("cuTensorMapEncodeTiled")
        real = self._real
        assert isinstance(rank, real.cuuint32_t), "the real binding takes tensorRank as cuuint32_t only"
        assert all(isinstance(v, real.cuuint64_t) for v in [*dims, *strides]), "globalDim/Strides: cuuint64_t"
        assert all(isinstance(v, real.cuuint32_t) for v in [*box, *elem]), "boxDim/elementStrides: cuuint32_t"
        assert isinstance(dtype, real.CUtensorMapDataType) and isinstance(swizzle, real.CUtensorMapSwizzle)
        assert isinstance(interleave, real.CUtensorMapInterleave) and isinstance(l2, real.CUtensorMapL2promotion)
        assert isinstance(oob, real.CUtensorMapFloatOOBfill)
        record = {
            "dtype": dtype,
            "rank": int(rank),
            "ptr": int(ptr),
            "dims": [int(v) for v in dims],
            "strides": [int(v) for v in strides],
            "box": [int(v) for v in box],
            "elem": [int(v) for v in elem],
            "interleave": interleave,
            "swizzle": swizzle,
            "l2": l2,
            "oob": oob,
        }
        self.encodes.append(record)
        err = self.fail.get("cuTensorMapEncodeTiled")
        if err is not None:
            return (err, None)
        size = 2 if dtype == real.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 else 4
        r = record["rank"]
        ok = (
            1 <= r <= 5
            and len(record["dims"]) == len(record["box"]) == len(record["elem"]) == r
            and len(record["strides"]) == r - 1
            and record["ptr"] % 16 == 0
            and all(0 < v <= 2**32 for v in record["dims"])
            and all(v % 16 == 0 and v < 2**40 for v in record["strides"])
            and all(0 < v <= 256 for v in record["box"])
            and all(0 < v <= 8 for v in record["elem"])
            and record["box"][0] * size % 16 == 0
            and (swizzle != real.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B or record["box"][0] * size <= 128)
        )
        if not ok:
            return (R.CUDA_ERROR_INVALID_VALUE, None)
        text = repr(sorted((key, str(v)) for key, v in record.items())).encode()
        tmap = _FakeTensorMap(hashlib.sha512(text).digest() + hashlib.sha512(b"2" + text).digest())
        self._maps.append(tmap)
        return (R.CUDA_SUCCESS, tmap)

    def cuMemcpyHtoDAsync(self, dst, src, size, stream):
        self._log("cuMemcpyHtoDAsync")
        if not self.ctx_stack:
            return (R.CUDA_ERROR_INVALID_CONTEXT,)
        err = self.fail.get("cuMemcpyHtoDAsync")
        if err is not None:
            return (err,)
        dst = int(dst)
        if not any(a["ptr"] <= dst and dst + size <= a["ptr"] + a["bytes"] for a in self.allocs):
            return (R.CUDA_ERROR_INVALID_VALUE,)
        data = ctypes.string_at(int(src), size)
        self.copies.append(
            {"dst": dst, "data": data, "stream": int(stream), "ctx": self.ctx_stack[-1], "call": len(self.calls) - 1}
        )
        self.memory[dst] = data
        return (R.CUDA_SUCCESS,)

    def cuStreamIsCapturing(self, stream):
        """ACTIVE for the raw streams in ``capturing_streams`` (a caller's stream, not torch's current one)."""
        self._log("cuStreamIsCapturing")
        status = self._real.CUstreamCaptureStatus
        if "cuStreamIsCapturing" in self.fail:
            return (self.fail["cuStreamIsCapturing"], None)
        active = int(stream) in self.capturing_streams
        return (
            R.CUDA_SUCCESS,
            status.CU_STREAM_CAPTURE_STATUS_ACTIVE if active else status.CU_STREAM_CAPTURE_STATUS_NONE,
        )

    def cuStreamSynchronize(self, stream):
        self._log("cuStreamSynchronize")
        self.syncs.append(int(stream))
        err = self.fail.get("cuStreamSynchronize")
        if err is not None:
            return (err,)
        return (R.CUDA_SUCCESS,)


class _FakeTensorMap:
    """A CUtensorMap stand-in: 128 bytes in host memory at ``getPtr()``, as the real one's."""

    def __init__(self, data: bytes):
        assert len(data) == 128
        self.data = data
        self._buf = ctypes.create_string_buffer(data, 128)

    def getPtr(self):
        return ctypes.addressof(self._buf)
