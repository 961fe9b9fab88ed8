"""Device and compile helpers shared by the kernel files (one kernel per file, these are not kernels)."""

from __future__ import annotations

import cutlass
import cutlass.cute as cute
from cutlass.cute.runtime import make_ptr
from cutlass.cute.typing import AddressSpace


class Launcher:
    """The host side every kernel class shares: the config, its check, and the launch.

    Subclasses define ``kernel`` (the device body) with the shared ABI
    ``(a, w, out, residual, n, k)``. The block, the clusters and the grid come
    from ``cfg.launch`` like every other launch of the variant, with the
    grid uncapped (``persist=False``): here a walk does one row group per CTA.
    The shape's dynamic shared memory is passed where it is not 0 (the rings of
    kind "wgmma" and of "mma" with ``ring``); its PDL flag is a driver attribute the AOT launch sets.
    """

    def __init__(self, cfg):
        cfg.check()
        self.cfg = cfg

    @cute.jit
    def __call__(
        self,
        a: cute.Pointer,
        w: cute.Pointer,
        out: cute.Pointer,
        residual: cute.Pointer,
        n: cutlass.Int32,
        k: cutlass.Int32,
    ):
        """Host launcher: the kernel gets the plain symbol ``skinny_<variant name>_0``."""
        # The prefix lives on the (shared) function object: set it per trace.
        self.kernel.set_name_prefix(f"skinny_{self.cfg.name}", remove_cutlass_symbol=True, keep_mangled_name=False)
        shape = self.cfg.launch(n, persist=False)
        cluster = {"cluster": (shape.cluster, 1, 1)} if shape.cluster > 1 else {}
        extra = {**cluster, "smem": shape.smem} if shape.smem else cluster
        # The launch bound (nvvm.minctasm) caps ptxas's registers. A carveout is given so the DSL does not query
        # a GPU for the SM's shared memory at compile time: it only becomes a launch attribute of the DSL's own
        # executor, which the runtime does not use (cubins byte-identical for any value). A Python conditional,
        # not an `if`: inside the traced launcher an `if` is control flow that must keep `extra`'s fields.
        bound = {"min_blocks_per_mp": self.cfg.min_ctas, "preferred_smem_carveout": -1} if self.cfg.min_ctas else {}
        extra = {**extra, **bound}
        self.kernel(a, w, out, residual, n, k).launch(grid=(shape.grid, 1, 1), block=shape.block, **extra)


@cute.jit
def prologue(cfg, w, tidx, row0, kk, n):
    """Prefetch this CTA's weight rows to L2 (cfg.prefetch), then wait for the previous grid (cfg.pdl).

    The weight never depends on the previous kernel, and a CTA's rows are one
    contiguous block (cols_per_cta * K * 2 bytes), so one bulk prefetch covers
    them and the previous kernel's tail overlaps our ramp. Everything that
    depends on the previous kernel (tokens, residual, output) comes after the wait.
    """
    prefetch_weight(cfg, w, tidx, row0, kk, n)
    wait_previous_grid(cfg)


@cute.jit
def prefetch_weight(cfg, w, tidx, row0, kk, n):
    """The first half of ``prologue``: the bulk L2 prefetch of this CTA's weight rows (cfg.prefetch).

    With cfg.tail the last CTA's rows stop at N: nothing past the weight is named.
    """
    if cutlass.const_expr(cfg.prefetch):
        if tidx == 0:
            base = w + cute.assume(row0 * kk, divby=8)
            if cutlass.const_expr(cfg.tail):
                rows = cutlass.min(cutlass.Int32(cfg.cols_per_cta), n - row0)
                size = rows * 2 * kk
            else:
                size = cutlass.Int32(cfg.cols_per_cta * 2) * kk
            cute.arch.inline_ptx(
                "cp.async.bulk.prefetch.L2.global [{$r0}], {$r1};",
                read_only_args=[base.toint(), size],
            )


@cute.jit
def wait_previous_grid(cfg):
    """The second half of ``prologue`` (cfg.pdl): let the next grid launch, wait for the previous one.

    A kernel may read the weight before this (it never depends on the previous
    kernel), but must not touch tokens, residual or output.
    """
    if cutlass.const_expr(cfg.pdl):
        cute.arch.griddepcontrol_launch_dependents()
        cute.arch.griddepcontrol_wait()


@cute.jit
def next_group(g, stride, groups):
    """A walk's row group after ``g`` (``stride`` apart), or ``g`` itself past the last one: its loads then reread
    this group's rows (L2 hits) instead of branching around them, and never name rows past N."""
    nxt = g + stride
    over = (groups - 1 - nxt) >> 31  # all ones past the last group
    return (nxt & (over ^ cutlass.Int32(-1))) | (g & over)


@cute.jit
def store_output(cfg, out, residual, has_res, value, m, col, n):
    """Write out[m, col]; the residual (cfg.bias: the bias, 4th pointer) is added in fp32 before the single bf16 rounding.

    With cfg.tail the last CTA's columns may pass N: those are neither read nor written.
    """
    if cutlass.const_expr(cfg.tail):
        if col < n:
            _store(cfg, out, residual, has_res, value, m, col, n)
    else:
        _store(cfg, out, residual, has_res, value, m, col, n)


@cute.jit
def _store(cfg, out, residual, has_res, value, m, col, n):
    v = value
    if has_res:
        # a bias is one value per column, shared by every token
        if cutlass.const_expr(cfg.bias):
            at = col
        else:
            at = m * n + col
        v = v + cute.make_tensor(residual + at, cute.make_layout(1))[0].to(cutlass.Float32)
    cute.make_tensor(out + (m * n + col), cute.make_layout(1))[0] = v.to(cutlass.BFloat16)


def compile_options(arch: str, dump_dir: str) -> str:
    """The exact compile options (the manifest records them with the dump dir elided)."""
    return f"--gpu-arch {arch} --keep-cubin --dump-dir {dump_dir}"


def compile_kernel(launcher, arch: str, dump_dir: str, name: str) -> bytes:
    """cute.compile a launcher with the shared ABI's fake args; return the cubin bytes."""
    ptr = lambda: make_ptr(cutlass.BFloat16, 0, AddressSpace.gmem, assumed_align=16)  # noqa: E731
    compiled = cute.compile(
        launcher,
        ptr(),
        ptr(),
        ptr(),
        ptr(),
        cutlass.Int32(0),
        cutlass.Int32(0),
        options=compile_options(arch, dump_dir),
    )
    cubin = compiled.artifacts.CUBIN
    if not isinstance(cubin, (bytes, bytearray)):
        # Trap of the CuTe DSL: without --keep-cubin and an existing dump dir this is silently a path string.
        raise RuntimeError(f"CuTe DSL returned no cubin bytes for {name} ({type(cubin).__name__})")
    return bytes(cubin)
