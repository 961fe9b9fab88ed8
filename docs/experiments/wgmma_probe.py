"""Probe for the Hopper warpgroup-MMA skinny GEMM (issue: batch 8 and 16 as fast as batch 1): weight rows as the
MMA's M (64 per warpgroup), tokens as its N (8 or 16), compiled ahead of time with the project's 40-byte ABI.

Not a plan kind: it answers, on the CPU, whether the mapping compiles to HGMMA with the kernel-parameter ABI the
runtime launches (no TMA descriptor: the weight fragment comes from registers, so the 40 bytes suffice), and
it checks the index math (the K permutation and the shared-memory descriptor layout) by emulation. On a GPU,
``--run`` launches the cubin through cuda-bindings and compares against float64.

Mapping (PTX ISA, wgmma.mma_async m64nNk16, A from registers, B from shared memory, K-major, no swizzle):

- A (weight): warp w of the warpgroup holds rows 16w..16w+15 as mma.m16n8k16's A fragment: lane (g, q)
  has registers a0 = (row g, k 2q, 2q+1), a1 = (row g+8, same k), a2 = (row g, k 2q+8, 2q+9), a3 = (row g+8,
  same k). The lane loads 16 contiguous bytes of each of its two rows (real k = 8q..8q+7 of a 32-k step) and
  feeds two MMAs: MMA h (0, 1) takes real k 8q+4h, +1 as MMA k 2q, 2q+1 and real k 8q+4h+2, +3 as MMA k 2q+8,
  2q+9. Any K order is exact as long as B uses the same one: ``mma_k_to_real`` is that permutation.
- B (tokens): per MMA, N tokens x 16 k in shared memory as 8x8 core matrices of 16-byte rows: token j, MMA k
  kp at (j // 8) * SBO + (kp // 8) * LBO + (j % 8) * 16 + (kp % 8) * 2, LBO = 128 (the two K core matrices
  side by side), SBO = 256. Tokens >= M are zero.
- D (fp32, 8 per lane at N = 16): d[4i + e] = (row g + 8 * (e // 2), token 8i + 2q + e % 2).

Usage: python docs/experiments/wgmma_probe.py compile OUT_DIR     (CPU: cubin, SASS check with cuobjdump)
       python docs/experiments/wgmma_probe.py emulate             (CPU: the index math against a float64 dot)
       python docs/experiments/wgmma_probe_run.py CUBIN...        (GPU, no cutlass: float64 check of each cubin)

Compiled 2026-12-02 (CuTe DSL 4.8.1, ptxas 13.4): sm_90a, params (a, w, out, residual: 8 B; n, k: 4 B) = the
runtime's 40-byte ABI, REQNTID 128, 42 registers; SASS per 32-k step: WARPGROUP.ARRIVE, two
HGMMA.64x16x16.F32.BF16 with A from registers and B from a shared-memory descriptor, WARPGROUP.DEPBAR.
Exact on the H200 (2026-12-02, wgmma_probe_run.py: M = 1, 8, 16 at 4096 x 14336 against float64). It waits for each
step's MMAs and stages tokens with scalar stores: a correctness probe
of the mapping, not the kernel to time.
"""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass
from pathlib import Path

import cutlass
import cutlass.cute as cute


def _source_tree() -> None:
    """Make ``import skinny_gemm`` load this checkout, as the tests' root conftest does."""
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("_skinny_source_tree", root / "aot" / "source_tree.py")
    tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tree)
    tree.register()


_source_tree()
from skinny_gemm.kernels.common import Launcher, compile_kernel  # noqa: E402

ROWS = 64  # weight rows per CTA: one warpgroup's MMA M
THREADS = 128
KC = 256  # k per shared-memory token chunk: 16 tokens x 256 k x 2 B = 8 KB
LBO, SBO = 128, 256
MMA_B_BYTES = 512  # one MMA's B: 16 tokens x 16 k


def mma_k_to_real(kp: int, h: int) -> int:
    """The real k (within a 32-k step) that MMA h's k position kp multiplies."""
    q = (kp % 8) // 2
    return 8 * q + 4 * h + (2 if kp >= 8 else 0) + kp % 2


def real_to_mma(r: int) -> tuple[int, int]:
    """(MMA h, k position) of real k r in a 32-k step: the inverse the kernel's token staging computes."""
    return (r % 8) // 4, 2 * (r // 8) + 8 * ((r % 4) // 2) + r % 2


def b_offset(j: int, kp: int) -> int:
    """Byte offset of token j, MMA k kp in one MMA's B tile (no-swizzle K-major core matrices)."""
    return (j // 8) * SBO + (kp // 8) * LBO + (j % 8) * 16 + (kp % 8) * 2


def emulate(m: int = 16, k: int = 64, seed: int = 0) -> float:
    """Run the fragment and descriptor math in numpy for one warp's 16 rows; return the max relative error."""
    import numpy as np

    assert all(mma_k_to_real(*reversed(real_to_mma(r))) == r for r in range(32)), "staging is not the inverse"
    assert sorted(real_to_mma(r) for r in range(32)) == [(h, kp) for h in range(2) for kp in range(16)]
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((16, k))
    acc = np.zeros((16, 16))
    for step in range(k // 32):
        for h in range(2):
            # B tile as the descriptor describes it: a byte image of 16 tokens x 16 MMA k.
            tile = np.zeros(MMA_B_BYTES // 2)
            for j in range(m):
                for kp in range(16):
                    tile[b_offset(j, kp) // 2] = x[j, 32 * step + mma_k_to_real(kp, h)]
            for lane in range(32):
                g, q = lane // 4, lane % 4
                # the lane's registers: 16 bytes of rows g and g + 8 at real k 8q..8q+7
                for row in (g, g + 8):
                    real = [32 * step + 8 * q + i for i in range(8)]
                    regs = [(w[row, real[2 * r]], w[row, real[2 * r + 1]]) for r in range(4)]
                    a_lo, a_hi = regs[2 * h], regs[2 * h + 1]  # MMA k 2q, 2q+1 and 2q+8, 2q+9
                    for j in range(16):
                        b = lambda kp: tile[b_offset(j, kp) // 2]  # noqa: E731
                        acc[row, j] += a_lo[0] * b(2 * q) + a_lo[1] * b(2 * q + 1)
                        acc[row, j] += a_hi[0] * b(2 * q + 8) + a_hi[1] * b(2 * q + 9)
    ref = w @ x.T
    return float(np.abs(acc[:, :m] - ref).max() / np.abs(ref).max())


@dataclass(frozen=True)
class ProbeConfig:
    """What the project's Launcher reads from a config."""

    m: int = 16
    threads: int = THREADS
    split: int = 1
    tail: bool = False
    cols_per_cta: int = ROWS

    def check(self):
        assert 1 <= self.m <= 16

    @property
    def name(self) -> str:
        return f"wgmma_probe_m{self.m}"


WARP = 32
# One 32-k step in one asm block: both MMAs (h = 0, 1) on the same accumulators, then the wait, so no
# accumulator register is read or moved while an MMA is in flight. Inputs: A registers of MMA 0 ($r0-$r3) and
# MMA 1 ($r4-$r7), the two B descriptors ($r8, $r9), the accumulators in ($r10-$r17); out: $w0-$w7.
_D = ", ".join(f"{{$w{e}}}" for e in range(8))
WGMMA_STEP_PTX = (
    "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, 1, 1;\n\t"
    + "".join(f"mov.f32 {{$w{e}}}, {{$r{10 + e}}};\n\t" for e in range(8))
    + "wgmma.fence.sync.aligned;\n\t"
    + "".join(
        f"wgmma.mma_async.sync.aligned.m64n16k16.f32.bf16.bf16 {{{_D}}}, "
        f"{{{{$r{4 * h}}}, {{$r{4 * h + 1}}}, {{$r{4 * h + 2}}}, {{$r{4 * h + 3}}}}}, {{$r{8 + h}}}, p, 1, 1, 0;\n\t"
        for h in range(2)
    )
    + "wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;\n}"
)


class WgmmaProbe(Launcher):
    @cute.kernel
    def kernel(self, a: cute.Pointer, w: cute.Pointer, out: cute.Pointer, residual: cute.Pointer,
               n: cutlass.Int32, k: cutlass.Int32):
        M = self.cfg.m
        tidx, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        g = lane // 4
        q = lane % 4
        row0 = bidx * ROWS + warp * 16
        kk = cute.assume(k, divby=KC)
        # (chunk steps x 2 MMAs, 512 B) token tiles in the descriptor's layout
        tiles = cute.arch.alloc_smem(cutlass.Int8, (KC // 16) * MMA_B_BYTES, alignment=128)
        tiles16 = cute.recast_ptr(tiles, dtype=cutlass.BFloat16)
        xs = cute.make_tensor(a, cute.make_layout(M * kk))
        w32 = cute.recast_ptr(w, dtype=cutlass.Int32)
        acc = cute.make_rmem_tensor(8, cutlass.Float32)
        acc.fill(0.0)
        for c in cutlass.range(kk // KC, unroll=1):
            cute.arch.sync_threads()  # the previous chunk's MMAs are done (wait_group 0 below)
            # Stage the chunk's tokens: element (j, real k) to (MMA tile, token j, MMA k) per the permutation.
            for i in cutlass.range(tidx, 16 * KC, THREADS, unroll=1):
                j = i // KC
                kr = i % KC
                step = kr // 32
                r = kr % 32
                h = (r % 8) // 4  # real_to_mma(r)
                kp = 2 * (r // 8) + 8 * ((r % 4) // 2) + r % 2
                off = (step * 2 + h) * MMA_B_BYTES + (j // 8) * SBO + (kp // 8) * LBO + (j % 8) * 16 + (kp % 8) * 2
                v = cutlass.BFloat16(0.0)
                if j < M:
                    v = xs[j * kk + c * KC + kr]
                cute.make_tensor(tiles16 + off // 2, cute.make_layout(1))[0] = v
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            base = tiles.toint() & 0x3FFFF
            for step in cutlass.range(KC // 32, unroll=1):
                kw = (c * KC + step * 32 + q * 8) // 2  # this lane's first weight word (2 bf16)
                ra = cute.make_tensor(w32 + (row0 + g) * (kk // 2) + kw, cute.make_layout(4)).load()
                rb = cute.make_tensor(w32 + (row0 + g + 8) * (kk // 2) + kw, cute.make_layout(4)).load()
                descs = []
                for h in cutlass.range_constexpr(2):
                    addr = base + (step * 2 + h) * MMA_B_BYTES
                    descs.append(cutlass.Int64(addr >> 4) | (cutlass.Int64(LBO >> 4) << 16)
                                 | (cutlass.Int64(SBO >> 4) << 32))
                d = cute.arch.inline_ptx(
                    WGMMA_STEP_PTX,
                    write_only_types=[cutlass.Float32] * 8,
                    read_only_args=[ra[0], rb[0], ra[1], rb[1], ra[2], rb[2], ra[3], rb[3], descs[0], descs[1]]
                    + [acc[e] for e in range(8)],
                )
                for e in cutlass.range_constexpr(8):
                    acc[e] = d[e]
        out_t = cute.make_tensor(out, cute.make_layout(M * n))
        for e in cutlass.range_constexpr(8):
            tok = 8 * (e // 4) + 2 * q + e % 2
            row = row0 + g + 8 * ((e % 4) // 2)
            if tok < M:
                out_t[tok * n + row] = acc[e].to(cutlass.BFloat16)



def compile_probe(out_dir: Path, m: int = 16) -> Path:
    out_dir.mkdir(parents=True, exist_ok=True)
    probe = WgmmaProbe(ProbeConfig(m=m))
    cubin = compile_kernel(probe, "sm_90a", str(out_dir), f"wgmma_probe_m{m}")
    path = out_dir / f"wgmma_probe_m{m}.cubin"
    path.write_bytes(cubin)
    return path


if __name__ == "__main__":
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb == "emulate":
        for m in (1, 8, 16):
            print(f"M={m}: max relative error {emulate(m):.2e}")
    elif verb == "compile":
        for m in (1, 8, 16):
            print(compile_probe(Path(sys.argv[2]), m))
    else:
        print(__doc__)
        sys.exit(2)
