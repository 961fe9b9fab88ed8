"""GPU half of wgmma_kind.py (no cutlass): every variant against float64 through the 40-byte ABI, then timed.

    python docs/experiments/wgmma_kind_run.py CUBIN_DIR OUT.json

The weight's tensor map is encoded with cuda-python and copied to device memory, its address passed as ``w`` (as
the runtime does). Correctness on every variant: NaN-poisoned output, outliers, with a residual (or the bias of a
bias variant), and a negative control (the map of another weight copy must fail the check). Timing as
wgmma_v1_run.py (cold L2, graph replay, alternating with cuBLAS) on the dense models' decode shapes.
"""

import ctypes
import json
import sys
from pathlib import Path

import torch
from cuda.bindings import driver as d

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wgmma_v1_run import cublas_graph, make_graph, ok, record, replay_us, tokens, weight_copies  # noqa: E402

# Llama-3.1-8B / Qwen3-8B at TP1: qkv, o, gate_up (Llama, Qwen), down (Llama, Qwen), then the two heads
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (24576, 4096), (4096, 14336), (4096, 12288), (128256, 4096)]
CHECK_ONLY = {1, 2, 4}  # m timed on two shapes only


def weight_map(w: torch.Tensor, rows: int) -> torch.Tensor:
    n, k = w.shape
    u64, u32 = d.cuuint64_t, d.cuuint32_t
    tmap = ok(d.cuTensorMapEncodeTiled(
        d.CUtensorMapDataType.CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, u32(2), w.data_ptr(), [u64(k), u64(n)],
        [u64(k * 2)], [u32(64), u32(rows)], [u32(1), u32(1)],
        d.CUtensorMapInterleave.CU_TENSOR_MAP_INTERLEAVE_NONE, d.CUtensorMapSwizzle.CU_TENSOR_MAP_SWIZZLE_128B,
        d.CUtensorMapL2promotion.CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
        d.CUtensorMapFloatOOBfill.CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE))
    raw = ctypes.string_at(tmap.getPtr(), 128)
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).cuda()  # 256-byte aligned by the allocator


def launcher(fn, info, x, wmap, out, extra, n, k):
    args = [ctypes.c_uint64(x.data_ptr()), ctypes.c_uint64(wmap.data_ptr()), ctypes.c_uint64(out.data_ptr()),
            ctypes.c_uint64(extra), ctypes.c_int32(n), ctypes.c_int32(k)]
    argv = (ctypes.c_void_p * 6)(*[ctypes.addressof(a) for a in args])
    cfg = d.CUlaunchConfig()
    cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = n // info["rows"] * info["split"], 1, 1
    cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = info["threads"], 1, 1
    cfg.sharedMemBytes = info["smem"]
    attrs = []
    pdl = d.CUlaunchAttribute()
    pdl.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    pdl.value.programmaticStreamSerializationAllowed = 1
    attrs.append(pdl)
    if info["split"] > 1:
        cl = d.CUlaunchAttribute()
        cl.id = d.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
        cl.value.clusterDim.x, cl.value.clusterDim.y, cl.value.clusterDim.z = info["split"], 1, 1
        attrs.append(cl)
    cfg.attrs = attrs
    cfg.numAttrs = len(attrs)

    def launch():
        cfg.hStream = torch.cuda.current_stream().cuda_stream
        ok(d.cuLaunchKernelEx(cfg, fn, ctypes.addressof(argv), 0))

    launch.keep = (args, argv, cfg, wmap)
    return launch


def check(fn, info, ws, maps, n, k, gen) -> dict:
    """Bad outputs with the residual (or bias), and of the negative control (another copy's map: must be bad)."""
    m = info["m"]
    x, ref, bound = tokens(m, k, ws[0], gen)
    extra = (torch.randn(n, device="cuda", generator=gen) if info["bias"] else
             torch.randn(m, n, device="cuda", generator=gen)).bfloat16()
    ref = ref + extra.double()
    bound = bound + extra.double().abs() * 2**-8
    out = torch.full((m, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    launcher(fn, info, x, maps[0], out, extra.data_ptr(), n, k)()
    torch.cuda.synchronize()
    bad = int((((out.double() - ref).abs() > bound) | out.isnan()).sum())
    out.fill_(float("nan"))
    wrong = maps[1] if len(maps) > 1 and not torch.equal(ws[0], ws[1]) else maps[0]
    launcher(fn, info, x, wrong, out, 0 if wrong is not maps[0] else extra.data_ptr() + 2, n, k)()
    torch.cuda.synchronize()
    control = int((((out.double() - ref).abs() > bound) | out.isnan()).sum())
    return {"bad": bad, "control_bad": control}


def main() -> None:
    folder, dest = Path(sys.argv[1]), Path(sys.argv[2])
    table = json.loads((folder / "variants.json").read_text())
    torch.zeros(1, device="cuda")
    gen = torch.Generator(device="cuda").manual_seed(0)
    fns = {}
    for name, info in table.items():
        lib = ok(d.cuLibraryLoadData((folder / f"{name}.cubin").read_bytes(), None, None, 0, None, None, 0))
        fn = ok(d.cuKernelGetFunction(ok(d.cuLibraryGetKernel(lib, info["symbol"].encode()))))
        ok(d.cuFuncSetAttribute(fn, d.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                                info["smem"]))
        fns[name] = (lib, fn)
    results = []
    for si, (n, k) in enumerate(SHAPES):
        ws = weight_copies(n, k, gen)
        for m in (1, 2, 4, 8, 16):
            if m in CHECK_ONLY and si > 1:
                continue
            x, ref, bound = tokens(m, k, ws[0], gen)
            outs = [torch.empty(m, n, device="cuda", dtype=torch.bfloat16) for _ in ws]
            cublas = cublas_graph(x, ws, outs)
            for name, info in sorted(table.items()):
                if info["m"] != m or n % info["rows"] or k % (64 * info["split"]):
                    continue
                _, fn = fns[name]
                maps = [weight_map(w, info["rows"]) for w in ws]
                row = {"variant": name, "n": n, "k": k, "m": m, **check(fn, info, ws, maps, n, k, gen)}
                if not info["bias"]:
                    ours = make_graph([launcher(fn, info, x, wm, o, 0, n, k) for wm, o in zip(maps, outs)])
                    t_ours, t_cub = [], []
                    for _ in range(5):
                        t_ours.append(replay_us(ours))
                        t_cub.append(replay_us(cublas))
                    row["us"], row["cublas_us"] = sorted(t_ours)[2], sorted(t_cub)[2]
                    record(results, row)
                else:
                    results.append(row)
                    print(n, k, m, name, row, flush=True)
        ws = outs = None
        torch.cuda.empty_cache()
        dest.write_text(json.dumps({"gpu": torch.cuda.get_device_name(), "rows": results}, indent=1))
    bad = [r for r in results if r["bad"] or not r["control_bad"]]
    print(f"{len(results)} rows, {len(bad)} with wrong outputs or a control that passed", flush=True)


if __name__ == "__main__":
    main()
