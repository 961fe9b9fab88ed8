"""GPU half of wgmma_probe.py, without cutlass (the H200 has none): launch each probe cubin through cuda-bindings.

    python docs/experiments/wgmma_probe_run.py wgmma_probe_m1.cubin wgmma_probe_m8.cubin wgmma_probe_m16.cubin
"""

import sys
from pathlib import Path

ROWS = 64  # weight rows per CTA (wgmma_probe.ROWS)
THREADS = 128


def run_probe(cubin: Path, n: int = 4096, k: int = 14336) -> None:
    """GPU: launch the probe cubin through cuda-bindings for M = 1..16; float64 reference, outputs poisoned."""
    import ctypes

    import torch
    from cuda.bindings import driver as d

    def ok(result):
        err, *rest = result if isinstance(result, tuple) else (result,)
        assert int(err) == 0, err
        return rest[0] if len(rest) == 1 else rest

    torch.zeros(1, device="cuda")  # makes the primary context current for the driver calls below
    lib = ok(d.cuLibraryLoadData(cubin.read_bytes(), None, None, 0, None, None, 0))
    m_of = int(cubin.stem.rsplit("m", 1)[1])
    fn = ok(d.cuKernelGetFunction(ok(d.cuLibraryGetKernel(lib, f"skinny_wgmma_probe_m{m_of}_0".encode()))))
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(m_of, k, device="cuda", generator=gen).bfloat16()
    w = (torch.randn(n, k, device="cuda", generator=gen) * 0.05).bfloat16()
    w[::97, ::31] *= 50  # outliers
    out = torch.full((m_of, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    args = [ctypes.c_uint64(t.data_ptr()) for t in (x, w, out)] + [ctypes.c_uint64(0), ctypes.c_int32(n),
                                                                  ctypes.c_int32(k)]
    argv = (ctypes.c_void_p * 6)(*[ctypes.addressof(a) for a in args])
    stream = torch.cuda.current_stream().cuda_stream
    ok(d.cuLaunchKernel(fn, n // ROWS, 1, 1, THREADS, 1, 1, 0, stream, ctypes.addressof(argv), 0))
    torch.cuda.synchronize()
    ref = x.double() @ w.double().T
    bound = ref.abs() * 2**-8 + (x.double().abs() @ w.double().abs().T) * 2**-16
    bad = ((out.double() - ref).abs() > bound) | out.isnan()
    print(f"M={m_of}: {int(bad.sum())} elements outside the bound of {out.numel()}")
    # A first speed reading (not the project's bench: one weight of n x k, events over repeated launches).
    launch = lambda: ok(d.cuLaunchKernel(fn, n // ROWS, 1, 1, THREADS, 1, 1, 0, stream,  # noqa: E731
                                         ctypes.addressof(argv), 0))
    for name, fn_ in (("probe", launch), ("cuBLAS", lambda: torch.mm(x, w.T))):
        for _ in range(3):
            fn_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(50):
            fn_()
        end.record()
        torch.cuda.synchronize()
        us = start.elapsed_time(end) * 1e3 / 50
        print(f"  {name}: {us:.1f} us ({n * k * 2 / us / 1e6:.2f} TB/s of weight)")


if __name__ == "__main__":
    for path in sys.argv[1:]:
        run_probe(Path(path))
