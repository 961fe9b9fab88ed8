"""A first speed reading of the warpgroup-MMA mapping (issue: batch 8 and 16 as fast as batch 1), beyond the probe.

The mapping is wgmma_probe.py's (weight rows = wgmma M from registers, tokens = its N from a no-swizzle
shared-memory descriptor, the same K permutation; exact on the H200). What this adds, to see whether the
mapping can stream the weight at the rate the mma kinds do:

- a CTA of ``wgs`` warpgroups over the same 64 weight rows, each warpgroup its own contiguous K range, the
  partial sums added in shared memory at the end (more warps per SM in flight, the grid stays N / 64);
- the weight loaded global -> registers through ``stages`` register buffers with the mma kinds' streaming
  load (L1::no_allocate, 128-B L2 fetch), stage s + stages - 1 issued before stage s is multiplied, the
  first stages before the PDL wait; K static (fully unrolled, every buffer index static);
- all K of the tokens staged once into dynamic shared memory with 16-byte loads and stores, already in the
  descriptor's permuted layout (K x N x 2 bytes: 64 KB at N = 8, 128 KB at N = 16 for K = 4096);
- N = 8 for M <= 8 (4 accumulators per thread), 16 for M <= 16 (8).

Not a plan kind: no tail, no bias, no residual, no cluster split of K (so N = 4096 runs 64 CTAs on 132 SMs).

    python docs/experiments/wgmma_v1.py compile OUT_DIR    (CPU: cubins + OUT_DIR/variants.json)
    python docs/experiments/wgmma_v1.py emulate            (CPU: the staging and fragment index math)
    python docs/experiments/wgmma_v1_run.py OUT_DIR        (GPU, no cutlass: float64 check and timing)
"""


import importlib.util
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROWS = 64  # weight rows per CTA: one wgmma M
LBO, SBO = 128, 256  # K-adjacent and N-adjacent core matrices (8 tokens x 16 B each)
RED_SLACK = 1024


def tile_bytes(nt: int) -> int:
    """One MMA's B tile: nt tokens x 16 k x 2 B."""
    return nt * 32


def smem_bytes(k: int, nt: int, wgs: int) -> int:
    """Dynamic shared memory: every token tile of K (2 MMAs per 32-k step), then the warpgroups' partial sums."""
    return (k // 32) * 2 * tile_bytes(nt) + wgs * 128 * (nt // 2) * 4 + RED_SLACK


def staged_word(t: int, h: int, hi: int) -> int:
    """Which real word u (2 bf16, real k 2u, 2u+1 of a 32-k step) lands in word t of row (MMA h, k half hi)."""
    return 4 * t + 2 * h + hi


def emulate(m: int = 16, k: int = 128, seed: int = 0) -> float:
    """The kernel's staging (16-byte rows) and fragment math for one warp's 16 rows, in numpy; max relative error."""
    import numpy as np

    nt = 8 if m <= 8 else 16
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k))
    w = rng.standard_normal((16, k))
    smem = np.zeros((k // 32) * 2 * tile_bytes(nt) // 2)  # in bf16 elements
    for gs in range(k // 32):
        for j in range(nt):
            u = [(x[j, 32 * gs + 2 * i], x[j, 32 * gs + 2 * i + 1]) if j < m else (0.0, 0.0) for i in range(16)]
            for h in range(2):
                for hi in range(2):
                    off = (gs * 2 + h) * tile_bytes(nt) + (j // 8) * SBO + hi * LBO + (j % 8) * 16
                    for t in range(4):
                        smem[off // 2 + 2 * t: off // 2 + 2 * t + 2] = u[staged_word(t, h, hi)]
    acc = np.zeros((16, nt))
    for gs in range(k // 32):
        for h in range(2):
            base = (gs * 2 + h) * tile_bytes(nt)

            def b(j, kp):  # what the descriptor reads: token j, MMA k kp
                return smem[(base + (j // 8) * SBO + (kp // 8) * LBO + (j % 8) * 16 + (kp % 8) * 2) // 2]

            for lane in range(32):
                g, q = lane // 4, lane % 4
                for row in (g, g + 8):
                    words = [(w[row, 32 * gs + 8 * q + 2 * i], w[row, 32 * gs + 8 * q + 2 * i + 1]) for i in range(4)]
                    lo, hi_ = words[2 * h], words[2 * h + 1]  # A: MMA k 2q, 2q+1 and 2q+8, 2q+9
                    for j in range(nt):
                        acc[row, j] += lo[0] * b(j, 2 * q) + lo[1] * b(j, 2 * q + 1)
                        acc[row, j] += hi_[0] * b(j, 2 * q + 8) + hi_[1] * b(j, 2 * q + 9)
    ref = w @ x.T
    return float(np.abs(acc[:, :m] - ref).max() / np.abs(ref).max())


@dataclass(frozen=True)
class V1Config:
    m: int
    k: int = 4096
    wgs: int = 4
    stages: int = 4
    pdl: bool = True
    fetch: int = 128
    # what kernels/common.py's helpers read
    prefetch: bool = False
    tail: bool = False
    split: int = 1
    cols_per_cta: int = ROWS

    @property
    def nt(self) -> int:
        return 8 if self.m <= 8 else 16

    @property
    def threads(self) -> int:
        return 128 * self.wgs

    @property
    def steps(self) -> int:
        """32-k steps per warpgroup."""
        return self.k // self.wgs // 32

    @property
    def smem(self) -> int:
        return smem_bytes(self.k, self.nt, self.wgs)

    def check(self):
        assert 1 <= self.m <= 16 and self.wgs in (1, 2, 4) and self.k % (32 * self.wgs) == 0
        assert self.steps >= self.stages >= 2 and self.smem <= 227 * 1024, self

    @property
    def name(self) -> str:
        return f"wgmma_v1_m{self.m}_k{self.k}_w{self.wgs}_s{self.stages}{'_pdl' if self.pdl else ''}"


def _source_tree() -> None:
    """Make ``import skinny_gemm`` load this checkout, as the tests' root conftest does."""
    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("_skinny_source_tree", root / "aot" / "source_tree.py")
    tree = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tree)
    tree.register()


def variants() -> list[V1Config]:
    return [V1Config(m=m, wgs=wgs, stages=s) for m in (8, 16) for wgs in (2, 4) for s in (4, 6)]


def build(out_dir: Path) -> None:
    _source_tree()
    import cutlass
    import cutlass.cute as cute

    from skinny_gemm.kernels.common import compile_kernel, wait_previous_grid
    from skinny_gemm.kernels.skinny_mma import ldg_stream_ptx

    def wgmma_ptx(nt: int) -> str:
        """One 32-k step: both MMAs (h = 0, 1) on the same accumulators, then the wait.

        Inputs: A registers of MMA 0 ($r0-$r3) and MMA 1 ($r4-$r7), the two B descriptors ($r8, $r9), the
        accumulators in ($r10...); outputs $w0... (the DSL's inline asm has no tied operands, so they are
        moved first and no accumulator is touched while an MMA is in flight).
        """
        na = nt // 2
        d = ", ".join(f"{{$w{e}}}" for e in range(na))
        return (
            "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, 1, 1;\n\t"
            + "".join(f"mov.f32 {{$w{e}}}, {{$r{10 + e}}};\n\t" for e in range(na))
            + "wgmma.fence.sync.aligned;\n\t"
            + "".join(
                f"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.bf16.bf16 {{{d}}}, "
                f"{{{{$r{4 * h}}}, {{$r{4 * h + 1}}}, {{$r{4 * h + 2}}}, {{$r{4 * h + 3}}}}}, {{$r{8 + h}}}, "
                "p, 1, 1, 0;\n\t"
                for h in range(2)
            )
            + "wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;\n}"
        )

    class WgmmaV1:
        def __init__(self, cfg: V1Config):
            cfg.check()
            self.cfg = cfg

        @cute.jit
        def __call__(self, a: cute.Pointer, w: cute.Pointer, out: cute.Pointer, residual: cute.Pointer,
                     n: cutlass.Int32, k: cutlass.Int32):
            self.kernel.set_name_prefix(f"skinny_{self.cfg.name}", remove_cutlass_symbol=True, keep_mangled_name=False)
            self.kernel(a, w, out, residual, n, k).launch(
                grid=(n // ROWS, 1, 1), block=(self.cfg.threads, 1, 1), smem=self.cfg.smem)

        @cute.kernel
        def kernel(self, a: cute.Pointer, w: cute.Pointer, out: cute.Pointer, residual: cute.Pointer,
                   n: cutlass.Int32, k: cutlass.Int32):
            cfg = self.cfg
            M, NT, K, D, STEPS = cfg.m, cfg.nt, cfg.k, cfg.stages, cfg.steps
            NA = NT // 2
            TILE = tile_bytes(NT)
            RH = K // 2  # a row in 32-bit words
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            wg = tidx // 128  # this warpgroup: K range wg * K / wgs ...
            t128 = tidx % 128
            warp = t128 // 32
            lane = tidx % 32
            g = lane // 4
            q = lane % 4
            row0 = bidx * ROWS + warp * 16
            smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=128)
            smem32 = cute.recast_ptr(smem, dtype=cutlass.Int32)
            red = cute.recast_ptr(smem + (K // 32) * 2 * TILE, dtype=cutlass.Float32)
            w32 = cute.recast_ptr(w, dtype=cutlass.Int32)
            # (buffer, word): rows g (words 0-3) and g + 8 (4-7), 8 k each at 8q of the step
            wbuf = cute.make_rmem_tensor((D, 8), cutlass.Int32)
            acc = cute.make_rmem_tensor(NA, cutlass.Float32)
            acc.fill(0.0)
            kw0 = wg * (K // cfg.wgs // 2) + q * 4  # this lane's first weight word
            w_lo = w32 + cute.assume((row0 + g) * RH + kw0, divby=4)
            w_hi = w32 + cute.assume((row0 + g + 8) * RH + kw0, divby=4)

            for s in cutlass.range_constexpr(D - 1):
                self.load(w_lo, w_hi, wbuf, s % D, s)
            wait_previous_grid(cfg)
            # Stage every token tile: item (step gs, token j) -> four 16-byte rows in the descriptor's layout.
            x32 = cute.recast_ptr(a, dtype=cutlass.Int32)
            for i in cutlass.range(tidx, (K // 32) * NT, cfg.threads, unroll=1):
                gs = i // NT
                j = i % NT
                keep = ((cutlass.Int32(M - 1) - j) >> 31) ^ cutlass.Int32(-1)  # all ones for a real token
                src = x32 + cute.assume((j & keep) * RH + gs * 16, divby=4)
                u = cute.make_rmem_tensor(16, cutlass.Int32)
                for c in cutlass.range_constexpr(4):
                    v = cute.make_tensor(src + 4 * c, cute.make_layout(4)).load()
                    for e in cutlass.range_constexpr(4):
                        u[4 * c + e] = v[e] & keep
                for h in cutlass.range_constexpr(2):
                    for hi in cutlass.range_constexpr(2):
                        off = (gs * 2 + h) * TILE + (j // 8) * SBO + hi * LBO + (j % 8) * 16
                        row = cute.make_rmem_tensor(4, cutlass.Int32)
                        for t in cutlass.range_constexpr(4):
                            row[t] = u[staged_word(t, h, hi)]
                        cute.make_tensor(smem32 + cute.assume(off // 4, divby=4), cute.make_layout(4)).store(row.load())
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()

            base = smem.toint() & 0x3FFFF
            for s in cutlass.range_constexpr(STEPS):
                if cutlass.const_expr(s + D - 1 < STEPS):
                    self.load(w_lo, w_hi, wbuf, (s + D - 1) % D, s + D - 1)
                b = s % D
                gs = wg * STEPS + s
                descs = []
                for h in cutlass.range_constexpr(2):
                    addr = base + (gs * 2 + h) * TILE
                    descs.append(cutlass.Int64(addr >> 4) | (cutlass.Int64(LBO >> 4) << 16)
                                 | (cutlass.Int64(SBO >> 4) << 32))
                d = cute.arch.inline_ptx(
                    wgmma_ptx(NT),
                    write_only_types=[cutlass.Float32] * NA,
                    read_only_args=[wbuf[b, 0], wbuf[b, 4], wbuf[b, 1], wbuf[b, 5],
                                    wbuf[b, 2], wbuf[b, 6], wbuf[b, 3], wbuf[b, 7], descs[0], descs[1]]
                    + [acc[e] for e in range(NA)],
                )
                for e in cutlass.range_constexpr(NA):
                    acc[e] = d[e]

            # The warpgroups' partial sums: each writes its own slot, warpgroup 0 adds them and stores.
            if cutlass.const_expr(cfg.wgs > 1):
                slot = cute.make_tensor(red + (wg * 128 + t128) * NA, cute.make_layout(NA))
                for e in cutlass.range_constexpr(NA):
                    slot[e] = acc[e]
                cute.arch.sync_threads()
                if wg == 0:
                    for other in cutlass.range_constexpr(1, cfg.wgs):
                        part = cute.make_tensor(red + (other * 128 + t128) * NA, cute.make_layout(NA))
                        for e in cutlass.range_constexpr(NA):
                            acc[e] = acc[e] + part[e]
            if wg == 0:
                out_t = cute.make_tensor(out, cute.make_layout(M * n))
                for e in cutlass.range_constexpr(NA):
                    tok = 8 * (e // 4) + 2 * q + e % 2
                    row = row0 + g + 8 * ((e % 4) // 2)
                    if tok < M:
                        out_t[tok * n + row] = acc[e].to(cutlass.BFloat16)

        @cute.jit
        def load(self, w_lo, w_hi, wbuf, buf, step):
            """Step ``step``'s weight into buffer ``buf``: 16 bytes of rows g and g + 8."""
            off = cute.assume(step * 16, divby=4)
            for half, ptr in ((0, w_lo), (1, w_hi)):
                v = cute.arch.inline_ptx(ldg_stream_ptx(self.cfg.fetch), write_only_types=[cutlass.Int32] * 4,
                                         read_only_args=[(ptr + off).toint()])
                for e in cutlass.range_constexpr(4):
                    wbuf[buf, 4 * half + e] = v[e]

    out_dir.mkdir(parents=True, exist_ok=True)
    table = {}
    for cfg in variants():
        cubin = compile_kernel(WgmmaV1(cfg), "sm_90a", str(out_dir), cfg.name)
        (out_dir / f"{cfg.name}.cubin").write_bytes(cubin)
        table[cfg.name] = {"m": cfg.m, "k": cfg.k, "threads": cfg.threads, "smem": cfg.smem, "rows": ROWS,
                           "symbol": f"skinny_{cfg.name}_0"}
        print(cfg.name, len(cubin), "bytes", flush=True)
    (out_dir / "variants.json").write_text(json.dumps(table, indent=1, sort_keys=True))


if __name__ == "__main__":
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb == "emulate":
        for m in (1, 5, 8, 9, 16):
            print(f"M={m}: max relative error {emulate(m):.2e}")
    elif verb == "compile":
        build(Path(sys.argv[2]))
    else:
        print(__doc__)
        sys.exit(2)
