"""The warpgroup-MMA mapping, second reading: what v1's numbers said to change (issue: batch 8 and 16 as fast as 1).

Same mapping and staging as wgmma_v1.py (weight rows = wgmma M from registers, tokens = its N from a
no-swizzle shared-memory descriptor, the K permutation), with the three changes v1's reading named:

- grain: a CTA is ``wgs`` warpgroups on ``wgs`` x 64 consecutive weight rows (they share the staged tokens),
  a cluster of ``split`` CTAs splits K (partials meet in CTA 0's shared memory over DSMEM), and ``persist``
  caps the grid so a cluster walks tiles (0: one tile per cluster). 128-thread CTAs let several CTAs share
  an SM, so one CTA's ramp and drain overlap another's stream (v1 ran one 512-thread CTA per SM);
- tokens: a CTA stages only its K slice (K / split), once for all the tiles it walks;
- waits: one asm block issues ``unroll`` 32-k steps (2 x unroll wgmma) and waits once; the weight for a
  block is ``stages`` blocks ahead in registers, and the loads cross tile boundaries (the walk is one
  flattened loop over (tile, block)).

Not a plan kind yet: no tail, no bias, no residual.

    python docs/experiments/wgmma_v2.py compile OUT_DIR    (CPU: cubins + OUT_DIR/variants.json)
    python docs/experiments/wgmma_v2.py emulate            (CPU: the walk's coverage and the fragment math)
    python docs/experiments/wgmma_v2_run.py OUT_DIR        (GPU, no cutlass: float64 check and timing)
"""

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from wgmma_v1 import LBO, SBO, _source_tree, emulate, staged_word, tile_bytes  # noqa: E402  (the mapping, staging and emulation)

ROWS = 64  # weight rows per warpgroup: one wgmma M


@dataclass(frozen=True)
class V2Config:
    m: int
    k: int = 4096
    wgs: int = 1
    split: int = 1
    unroll: int = 2
    stages: int = 3
    persist: int = 0
    # independent accumulator sets: MMA h of a step adds into set h % accs (shorter dependency chains)
    accs: int = 1
    pdl: bool = True
    fetch: int = 128
    # what kernels/common.py's helpers read
    prefetch: bool = False
    tail: bool = False

    @property
    def nt(self) -> int:
        return 8 if self.m <= 8 else 16

    @property
    def threads(self) -> int:
        return 128 * self.wgs

    @property
    def rows(self) -> int:
        return ROWS * self.wgs

    @property
    def kc(self) -> int:
        """K of one CTA."""
        return self.k // self.split

    @property
    def blocks(self) -> int:
        """asm blocks (unroll 32-k steps each) per tile."""
        return self.kc // 32 // self.unroll

    @property
    def token_smem(self) -> int:
        return self.kc // 32 * 2 * tile_bytes(self.nt)

    @property
    def red_smem(self) -> int:
        """Two slots (tile parity) of the partials CTAs 1.. send to CTA 0."""
        return 2 * (self.split - 1) * self.threads * (self.nt // 2) * 4

    @property
    def smem(self) -> int:
        return self.token_smem + self.red_smem

    def grid(self, n: int) -> int:
        tiles = n // self.rows
        return (min(tiles, self.persist) if self.persist else tiles) * self.split

    def check(self):
        assert 1 <= self.m <= 16 and self.wgs in (1, 2) and self.split in (1, 2, 4, 8), self
        assert self.k % (32 * self.unroll * self.split) == 0 and self.blocks % self.stages == 0, self
        assert self.blocks >= self.stages >= 2 and self.smem <= 227 * 1024, self
        assert self.accs in (1, 2) and self.stages * self.unroll * 8 + self.accs * self.nt // 2 <= 160, self

    @property
    def name(self) -> str:
        # persist is the launch's grid cap only (the kernel reads its grid size): not part of the cubin
        return f"wgmma_v2_m{self.m}_k{self.k}_w{self.wgs}_x{self.split}_u{self.unroll}_s{self.stages}_a{self.accs}_f{self.fetch}"


def walk(cfg: V2Config, n: int):
    """(cta, tile, K slice) for every (tile, block) the kernel's flattened loop visits: each once."""
    grid = cfg.grid(n)
    clusters = grid // cfg.split
    tiles = n // cfg.rows
    seen = []
    for cta in range(grid):
        c, r = cta // cfg.split, cta % cfg.split
        count = (tiles - c + clusters - 1) // clusters
        for j in range(count * cfg.blocks):
            tile = c + (j // cfg.blocks) * clusters
            seen.append((tile, r, j % cfg.blocks))
    return seen


def emulate_walk() -> None:
    for cfg in variants():
        for n, persist in [(n, p) for n in (4096, 6144, 28672, 4096 + 64 * cfg.wgs * 3) for p in (0, 7, 132, 264)]:
            if n % cfg.rows:
                continue
            seen = walk(dataclasses.replace(cfg, persist=persist), n)
            want = {(t, r, b) for t in range(n // cfg.rows) for r in range(cfg.split) for b in range(cfg.blocks)}
            assert len(seen) == len(want) and set(seen) == want, (cfg.name, n)
    print("walk: every (tile, K slice, block) exactly once for every variant")


def variants() -> list[V2Config]:
    out = []
    for m in (8, 16):
        for k in (4096, 14336):
            for wgs, split in ((1, 2), (1, 4), (2, 1), (2, 2), (2, 4), (1, 8)):
                for unroll, stages, accs in ((4, 2, 1), (4, 2, 2), (8, 2, 2), (4, 3, 2)):
                    cfg = V2Config(m=m, k=k, wgs=wgs, split=split, unroll=unroll, stages=stages, accs=accs)
                    try:
                        cfg.check()
                    except AssertionError:
                        continue
                    out.append(cfg)
    return out


def build(out_dir: Path, only: str = "") -> None:
    _source_tree()
    import cutlass
    import cutlass.cute as cute

    from skinny_gemm.kernels.common import compile_kernel, wait_previous_grid
    from skinny_gemm.kernels.skinny_mma import (
        CLUSTER_SYNC_PTX,
        MAPA_PTX,
        ST_CLUSTER_PTX,
        ldg_stream_ptx,
    )

    def wgmma_ptx(nt: int, unroll: int, accs: int) -> str:
        """``unroll`` 32-k steps: 2 x unroll MMAs (MMA h on accumulator set h % accs), one commit, one wait.

        Inputs: per step u the A registers of MMA 0 ($r(8u)..) and MMA 1 ($r(8u+4)..), then the 2 x unroll
        B descriptors, then the accumulators; outputs $w0... (the DSL's inline asm has no tied operands).
        """
        na = nt // 2
        da = 8 * unroll
        acc0 = da + 2 * unroll
        body = "".join(f"mov.f32 {{$w{e}}}, {{$r{acc0 + e}}};\n\t" for e in range(na * accs))
        body += "wgmma.fence.sync.aligned;\n\t"
        for u in range(unroll):
            for h in range(2):
                s0 = (h % accs) * na
                d = ", ".join(f"{{$w{s0 + e}}}" for e in range(na))
                a = 8 * u + 4 * h
                body += (f"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.bf16.bf16 {{{d}}}, "
                         f"{{{{$r{a}}}, {{$r{a + 1}}}, {{$r{a + 2}}}, {{$r{a + 3}}}}}, {{$r{da + 2 * u + h}}}, "
                         "p, 1, 1, 0;\n\t")
        body += "wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;"
        return "{\n\t.reg .pred p;\n\tsetp.eq.u32 p, 1, 1;\n\t" + body + "\n}"

    class WgmmaV2:
        def __init__(self, cfg: V2Config):
            cfg.check()
            self.cfg = cfg

        @cute.jit
        def __call__(self, a: cute.Pointer, w: cute.Pointer, out: cute.Pointer, residual: cute.Pointer,
                     n: cutlass.Int32, k: cutlass.Int32):
            self.kernel.set_name_prefix(f"skinny_{self.cfg.name}", remove_cutlass_symbol=True, keep_mangled_name=False)
            cluster = {"cluster": (self.cfg.split, 1, 1)} if self.cfg.split > 1 else {}
            self.kernel(a, w, out, residual, n, k).launch(
                grid=(n // self.cfg.rows * self.cfg.split, 1, 1), block=(self.cfg.threads, 1, 1),
                smem=self.cfg.smem, **cluster)

        @cute.kernel
        def kernel(self, a: cute.Pointer, w: cute.Pointer, out: cute.Pointer, residual: cute.Pointer,
                   n: cutlass.Int32, k: cutlass.Int32):
            cfg = self.cfg
            M, NT, K, D, U, S = cfg.m, cfg.nt, cfg.k, cfg.stages, cfg.unroll, cfg.split
            NA = NT // 2
            NV = NA * cfg.accs
            TILE = tile_bytes(NT)
            KC = cfg.kc
            B = cfg.blocks
            RH = K // 2  # a row in 32-bit words
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            gdim, _, _ = cute.arch.grid_dim()
            wg = tidx // 128
            t128 = tidx % 128
            warp = t128 // 32
            lane = tidx % 32
            g = lane // 4
            q = lane % 4
            rank = bidx % S
            c = bidx // S
            clusters = gdim // S
            tiles = n // cfg.rows
            count = (tiles - c + clusters - 1) // clusters  # tiles this cluster walks
            total = count * B  # asm blocks this CTA runs
            smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=1024)
            smem32 = cute.recast_ptr(smem, dtype=cutlass.Int32)
            red = cute.recast_ptr(smem + cfg.token_smem, dtype=cutlass.Float32)
            w32 = cute.recast_ptr(w, dtype=cutlass.Int32)
            # (stage, word): per step u of the block, rows g (words 8u+0..3) and g + 8 (8u+4..7)
            wbuf = cute.make_rmem_tensor((D, 8 * U), cutlass.Int32)
            acc = cute.make_rmem_tensor(NV, cutlass.Float32)
            acc.fill(0.0)
            # this lane's rows in tile 0 of the walk, and its first word in this CTA's K slice
            lane_row = wg * ROWS + warp * 16 + g
            kw0 = rank * (KC // 2) + q * 4
            if cutlass.const_expr(S > 1):
                cute.arch.inline_ptx("barrier.cluster.arrive.relaxed.aligned;")

            for s in cutlass.range_constexpr(D - 1):
                self.load(w32, wbuf, s, cutlass.Int32(s), c, clusters, lane_row, kw0, total)
            wait_previous_grid(cfg)
            # Stage this CTA's K slice of every token: item (step gs, token j) -> four 16-byte rows.
            x32 = cute.recast_ptr(a, dtype=cutlass.Int32)
            for i in cutlass.range(tidx, (KC // 32) * NT, cfg.threads, unroll=1):
                gs = i // NT
                j = i % NT
                keep = ((cutlass.Int32(M - 1) - j) >> 31) ^ cutlass.Int32(-1)  # all ones for a real token
                src = x32 + cute.assume((j & keep) * RH + rank * (KC // 2) + gs * 16, divby=4)
                u = cute.make_rmem_tensor(16, cutlass.Int32)
                for cc in cutlass.range_constexpr(4):
                    v = cute.make_tensor(src + 4 * cc, cute.make_layout(4)).load()
                    for e in cutlass.range_constexpr(4):
                        u[4 * cc + e] = v[e] & keep
                for h in cutlass.range_constexpr(2):
                    for hi in cutlass.range_constexpr(2):
                        off = (gs * 2 + h) * TILE + (j // 8) * SBO + hi * LBO + (j % 8) * 16
                        row = cute.make_rmem_tensor(4, cutlass.Int32)
                        for t in cutlass.range_constexpr(4):
                            row[t] = u[staged_word(t, h, hi)]
                        cute.make_tensor(smem32 + cute.assume(off // 4, divby=4), cute.make_layout(4)).store(row.load())
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            if cutlass.const_expr(S > 1):
                cute.arch.inline_ptx("barrier.cluster.wait.aligned;")

            desc0 = (cutlass.Int64((smem.toint() & 0x3FFFF) >> 4) | (cutlass.Int64(LBO >> 4) << 16)
                     | (cutlass.Int64(SBO >> 4) << 32))
            for base in cutlass.range(0, total, D, unroll=1):
                for d in cutlass.range_constexpr(D):
                    j = base + d
                    self.load(w32, wbuf, (d + D - 1) % D, j + D - 1, c, clusters, lane_row, kw0, total)
                    blk = j % B
                    descs = []
                    for u in cutlass.range_constexpr(U):
                        for h in cutlass.range_constexpr(2):
                            descs.append(desc0 + cutlass.Int64(((blk * U + u) * 2 + h) * (TILE >> 4)))
                    regs = []
                    for u in cutlass.range_constexpr(U):
                        wb = 8 * u
                        regs += [wbuf[d, wb + 0], wbuf[d, wb + 4], wbuf[d, wb + 1], wbuf[d, wb + 5],
                                 wbuf[d, wb + 2], wbuf[d, wb + 6], wbuf[d, wb + 3], wbuf[d, wb + 7]]
                    res = cute.arch.inline_ptx(
                        wgmma_ptx(NT, U, cfg.accs), write_only_types=[cutlass.Float32] * NV,
                        read_only_args=regs + descs + [acc[e] for e in range(NV)],
                    )
                    for e in cutlass.range_constexpr(NV):
                        acc[e] = res[e]
                    if blk == B - 1:
                        tile = c + (j // B) * clusters
                        self.finish(acc, red, rank, (j // B) % 2, t128, wg, warp, g, q, tile, out, n)
                        acc.fill(0.0)

        @cute.jit
        def finish(self, acc, red, rank, parity, t128, wg, warp, g, q, tile, out, n):
            """One tile's epilogue: CTAs 1.. send their partials to CTA 0 (slot ``parity``), CTA 0 adds and stores."""
            cfg = self.cfg
            NA = cfg.nt // 2
            S = cfg.split
            tid = wg * 128 + t128
            for e in cutlass.range_constexpr(NA, NA * cfg.accs):
                acc[e % NA] = acc[e % NA] + acc[e]
            slot_floats = (S - 1) * cfg.threads * NA
            if cutlass.const_expr(S > 1):
                if rank != 0:
                    for e in cutlass.range_constexpr(NA):
                        local = (red + parity * slot_floats + ((rank - 1) * cfg.threads + tid) * NA + e).toint()
                        remote = cute.arch.inline_ptx(MAPA_PTX, write_only_types=[cutlass.Int32],
                                                      read_only_args=[local, cutlass.Int32(0)])
                        cute.arch.inline_ptx(ST_CLUSTER_PTX, read_only_args=[remote, acc[e]])
                cute.arch.inline_ptx(CLUSTER_SYNC_PTX)
            if rank == 0:
                if cutlass.const_expr(S > 1):
                    for r in cutlass.range_constexpr(S - 1):
                        part = cute.make_tensor(red + parity * slot_floats + (r * cfg.threads + tid) * NA,
                                                cute.make_layout(NA))
                        for e in cutlass.range_constexpr(NA):
                            acc[e] = acc[e] + part[e]
                out_t = cute.make_tensor(out, cute.make_layout(cfg.m * n))
                row0 = tile * cfg.rows + wg * ROWS + warp * 16
                for e in cutlass.range_constexpr(NA):
                    tok = 8 * (e // 4) + 2 * q + e % 2
                    row = row0 + g + 8 * ((e % 4) // 2)
                    if tok < cfg.m:
                        out_t[tok * n + row] = acc[e].to(cutlass.BFloat16)

        @cute.jit
        def load(self, w32, wbuf, buf, j, c, clusters, lane_row, kw0, total):
            """Block ``j`` of the walk into register stage ``buf``: per step 16 bytes of rows g and g + 8."""
            cfg = self.cfg
            B = cfg.blocks
            RH = cfg.k // 2
            if j < total:
                tile = c + (j // B) * clusters
                row = tile * cfg.rows + lane_row
                word = row * RH + kw0 + (j % B) * (cfg.unroll * 16)
                for u in cutlass.range_constexpr(cfg.unroll):
                    for half in cutlass.range_constexpr(2):
                        ptr = w32 + cute.assume(word + half * 8 * RH + u * 16, divby=4)
                        v = cute.arch.inline_ptx(ldg_stream_ptx(cfg.fetch), write_only_types=[cutlass.Int32] * 4,
                                                 read_only_args=[ptr.toint()])
                        for e in cutlass.range_constexpr(4):
                            wbuf[buf, 8 * u + 4 * half + e] = v[e]

    out_dir.mkdir(parents=True, exist_ok=True)
    table = {}
    for cfg in variants():
        if only and only not in cfg.name:
            continue
        cubin = compile_kernel(WgmmaV2(cfg), "sm_90a", str(out_dir), cfg.name)
        (out_dir / f"{cfg.name}.cubin").write_bytes(cubin)
        table[cfg.name] = {"m": cfg.m, "k": cfg.k, "threads": cfg.threads, "smem": cfg.smem, "rows": cfg.rows,
                           "split": cfg.split, "persist": cfg.persist, "symbol": f"skinny_{cfg.name}_0"}
        print(cfg.name, len(cubin), "bytes", flush=True)
    (out_dir / "variants.json").write_text(json.dumps(table, indent=1, sort_keys=True))


if __name__ == "__main__":
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb == "emulate":
        emulate_walk()
        for m in (1, 5, 8, 9, 16):
            print(f"M={m}: max relative error {emulate(m):.2e}")
    elif verb == "compile":
        build(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        print(__doc__)
        sys.exit(2)