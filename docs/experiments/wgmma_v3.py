"""The warpgroup-MMA mapping, third reading: the weight through a shared-memory ring (issue: batch 8 and 16).

wgmma_v2.py's reading (docs/results/wgmma-v2*-h200.*): fewer waits per step won most (8 steps per wait over 2),
more CTAs per SM or a persistent walk a little, and the best variant stayed at or under cuBLAS (0.77-1.02x),
3.7-4.2 TB/s on the large shapes and 1.9-2.6 on the small ones. Its weight streams through registers, so
the bytes in flight per SM are what the registers hold (a warpgroup's 2 stages of 4-8 steps: 16-32 KB).
Here the weight lands in a ring in shared memory by ``cp.async.bulk`` (one copy per row and chunk, thread
0 issues, an mbarrier per stage counts the bytes; the bulk kind's ring), so ``ring - 1`` chunks are in
flight without registers (3 x 64 rows x 512 B = 96 KB), and the warpgroup reads each step's A fragment with
``ld.shared`` (a 576-byte row pitch puts the 8 lanes of a 128-byte phase on distinct banks) one block ahead
of its MMAs. Tokens, descriptors, the cluster split of K and the tile walk are v2's.

One warpgroup (64 weight rows) per CTA; thread 0 also refills the ring (wgmma is warpgroup-wide, so the
four warps reach the stage's release together). Not a plan kind: no tail, no bias, no residual.

    python docs/experiments/wgmma_v3.py compile OUT_DIR [FILTER]   (CPU: cubins + OUT_DIR/variants.json)
    python docs/experiments/wgmma_v3.py compile OUT_DIR occupancy  (the variants with 2+ CTAs per SM at K = 4096)
    python docs/experiments/wgmma_v3.py emulate            (CPU: the walk's coverage, the ring's byte offsets)
    python docs/experiments/wgmma_v2_run.py OUT_DIR        (GPU, no cutlass: float64 check and timing)
"""

import dataclasses
import json
import sys
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import wgmma_v1 as v1  # noqa: E402

ROWS = 64
PAD = 64  # row pitch = chunk bytes + 64: rows g and g + 1 of a 128-byte phase on distinct banks


@dataclass(frozen=True)
class V3Config:
    m: int
    k: int = 4096
    split: int = 1
    chunk: int = 256  # k per ring stage
    ring: int = 4
    unroll: int = 4  # 32-k steps per asm block (one wait)
    persist: int = 0
    # consumer warpgroups, each on its own 64 of the CTA's rows of every ring stage (warp 0 also refills)
    wgs: int = 1
    # M = 16 as two m64n8k16 MMAs (tokens 0-7 and 8-15, the B descriptor advanced one core matrix along N)
    # instead of one m64n16k16: is the n16 tile what makes M = 16 take twice M = 8's time?
    halves: bool = False
    pdl: bool = True
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
        return self.k // self.split

    @property
    def chunks(self) -> int:
        """Ring chunks per tile."""
        return self.kc // self.chunk

    @property
    def pitch(self) -> int:
        return self.chunk * 2 + PAD

    @property
    def token_smem(self) -> int:
        return self.kc // 32 * 2 * v1.tile_bytes(self.nt)

    @property
    def ring_smem(self) -> int:
        return self.ring * self.rows * self.pitch

    @property
    def red_smem(self) -> int:
        return 2 * (self.split - 1) * self.threads * (self.nt // 2) * 4

    @property
    def smem(self) -> int:
        return self.token_smem + self.ring_smem + self.red_smem + 16 * self.ring

    def grid(self, n: int) -> int:
        tiles = n // self.rows
        return (min(tiles, self.persist) if self.persist else tiles) * self.split

    def check(self):
        assert 1 <= self.m <= 16 and self.split in (1, 2, 4, 8), self
        assert self.chunk % (32 * self.unroll) == 0 and self.kc % self.chunk == 0, self
        assert self.ring >= 2 and self.wgs in (1, 2) and self.smem <= 227 * 1024, self
        assert not self.halves or self.nt == 16, self

    @property
    def name(self) -> str:
        wgs = f"_w{self.wgs}" if self.wgs != 1 else ""
        wgs += "_h2" if self.halves else ""
        return f"wgmma_v3_m{self.m}_k{self.k}_x{self.split}_c{self.chunk}_r{self.ring}_u{self.unroll}{wgs}"


def walk(cfg: V3Config, n: int):
    """(tile, K slice, chunk) for every chunk the flattened loop of each CTA visits."""
    grid = cfg.grid(n)
    clusters = grid // cfg.split
    tiles = n // cfg.rows
    seen = []
    for cta in range(grid):
        c, r = cta // cfg.split, cta % cfg.split
        count = (tiles - c + clusters - 1) // clusters
        for j in range(count * cfg.chunks):
            seen.append((c + (j // cfg.chunks) * clusters, r, j % cfg.chunks))
    return seen


def emulate_ring(cfg: V3Config) -> None:
    """Every (row, k) of a tile's K slice is read from the ring exactly where the bulk copy put it."""
    copied = {}
    for chunk in range(cfg.chunks):
        stage = chunk % cfg.ring
        for r in range(cfg.rows):
            for kk in range(cfg.chunk):
                copied[(stage, r * cfg.pitch + 2 * kk)] = (r, chunk * cfg.chunk + kk)
    for chunk in range(cfg.chunks):
        stage = chunk % cfg.ring
        for blk in range(cfg.chunk // 32 // cfg.unroll):
            for u in range(cfg.unroll):
                for lane in range(cfg.threads):
                    warp, g, q = lane // 32, lane % 32 // 4, lane % 4
                    for half in range(2):
                        row = warp * 16 + g + 8 * half
                        off = row * cfg.pitch + ((blk * cfg.unroll + u) * 32 + 8 * q) * 2
                        for e in range(8):
                            k = chunk * cfg.chunk + (blk * cfg.unroll + u) * 32 + 8 * q + e
                            assert copied[(stage, off + 2 * e)] == (row, k), (cfg.name, chunk, lane)
    # bank check: a 128-byte phase of a v4 load is lanes 8p..8p+7 (rows g, g+1 at q = 0..3): 32 distinct banks
    for q0 in range(0, 32, 8):
        banks = set()
        for lane in range(q0, q0 + 8):
            g, q = lane // 4, lane % 4
            base = g * cfg.pitch + q * 16
            banks.update((base + 4 * i) // 4 % 32 for i in range(4))
        assert len(banks) == 32, (cfg.name, q0, banks)


def emulate_all() -> None:
    for cfg in variants():
        for n, persist in [(n, p) for n in (4096, 6144, 28672, 4096 + 192) for p in (0, 7, 132, 264)]:
            if n % cfg.rows:
                continue
            seen = walk(dataclasses.replace(cfg, persist=persist), n)
            want = {(t, r, c) for t in range(n // cfg.rows) for r in range(cfg.split) for c in range(cfg.chunks)}
            assert len(seen) == len(want) and set(seen) == want, (cfg.name, n)
        emulate_ring(dataclasses.replace(cfg, k=cfg.chunk * cfg.split * min(cfg.chunks, 2)))
    print(f"walk and ring: {len(variants())} variants, every (tile, K slice, chunk) once, every (row, k) where copied")


def variants() -> list[V3Config]:
    out = []
    for m in (8, 16):
        for k, splits in ((4096, (1, 2, 4)), (14336, (4, 8))):
            for split in splits:
                for chunk, ring, unroll in ((256, 3, 4), (256, 4, 8), (128, 6, 4), (128, 4, 4), (256, 2, 8)):
                    cfg = V3Config(m=m, k=k, split=split, chunk=chunk, ring=ring, unroll=unroll)
                    try:
                        cfg.check()
                    except AssertionError:
                        continue
                    out.append(cfg)
    for split, chunk, ring, unroll in ((2, 256, 2, 8), (2, 256, 4, 8), (1, 256, 2, 8), (4, 256, 3, 4)):
        out.append(V3Config(m=16, split=split, chunk=chunk, ring=ring, unroll=unroll, halves=True))
    for m in (8, 16):
        for k, splits in ((4096, (1, 2, 4)), (14336, (4, 8))):
            for split in splits:
                for chunk, ring, unroll in ((128, 4, 4), (128, 3, 4), (256, 2, 8), (128, 5, 4)):
                    cfg = V3Config(m=m, k=k, split=split, chunk=chunk, ring=ring, unroll=unroll, wgs=2)
                    try:
                        cfg.check()
                    except AssertionError:
                        continue
                    out.append(cfg)
    return out


def occupancy_variants() -> list[V3Config]:
    """Every one-warpgroup K = 4096 variant whose shared memory lets two or more CTAs share an SM (228 KB each)."""
    out = []
    for m in (8, 16):
        for split in (1, 2, 4, 8):
            for chunk in (128, 256):
                for ring in (2, 3, 4):
                    for unroll in (4, 8):
                        cfg = V3Config(m=m, split=split, chunk=chunk, ring=ring, unroll=unroll)
                        try:
                            cfg.check()
                        except AssertionError:
                            continue
                        if 228 * 1024 // (cfg.smem + 1024) >= 2:
                            out.append(cfg)
    return out


def build(out_dir: Path, only: str = "") -> None:
    v1._source_tree()
    import cutlass
    import cutlass.cute as cute

    from skinny_gemm.kernels.common import compile_kernel, wait_previous_grid
    from skinny_gemm.kernels.skinny_bulk import BULK_COPY_PTX, LDS_PTX
    from skinny_gemm.kernels.skinny_mma import CLUSTER_SYNC_PTX, MAPA_PTX, ST_CLUSTER_PTX

    def wgmma_ptx(nt: int, unroll: int, halves: bool = False) -> str:
        na = nt // 2
        da = 8 * unroll
        acc0 = da + 2 * unroll
        body = "".join(f"mov.f32 {{$w{e}}}, {{$r{acc0 + e}}};\n\t" for e in range(na))
        body += "wgmma.fence.sync.aligned;\n\t"
        for u in range(unroll):
            for h in range(2):
                a = 8 * u + 4 * h
                areg = f"{{{{$r{a}}}, {{$r{a + 1}}}, {{$r{a + 2}}}, {{$r{a + 3}}}}}"
                desc = f"{{$r{da + 2 * u + h}}}"
                if halves:  # tokens 8-15: the next core matrix along N (SBO bytes on, in 16-byte units)
                    lo = ", ".join(f"{{$w{e}}}" for e in range(4))
                    hi = ", ".join(f"{{$w{e}}}" for e in range(4, 8))
                    body += f"wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {{{lo}}}, {areg}, {desc}, p, 1, 1, 0;\n\t"
                    body += f"add.s64 dh, {desc}, {v1.SBO >> 4};\n\t"
                    body += f"wgmma.mma_async.sync.aligned.m64n8k16.f32.bf16.bf16 {{{hi}}}, {areg}, dh, p, 1, 1, 0;\n\t"
                else:
                    d = ", ".join(f"{{$w{e}}}" for e in range(na))
                    body += f"wgmma.mma_async.sync.aligned.m64n{nt}k16.f32.bf16.bf16 {{{d}}}, {areg}, {desc}, p, 1, 1, 0;\n\t"
        body += "wgmma.commit_group.sync.aligned;\n\twgmma.wait_group.sync.aligned 0;"
        regs = "\t.reg .b64 dh;\n\t" if halves else ""
        return "{\n\t.reg .pred p;\n" + regs + "\tsetp.eq.u32 p, 1, 1;\n\t" + body + "\n}"

    class WgmmaV3:
        def __init__(self, cfg: V3Config):
            cfg.check()
            self.cfg = cfg

        @cute.jit
        def __call__(self, a: cute.Pointer, w: cute.Pointer, out: cute.Pointer, residual: cute.Pointer,
                     n: cutlass.Int32, k: cutlass.Int32):
            self.kernel.set_name_prefix(f"skinny_{self.cfg.name}", remove_cutlass_symbol=True, keep_mangled_name=False)
            cluster = {"cluster": (self.cfg.split, 1, 1)} if self.cfg.split > 1 else {}
            self.kernel(a, w, out, residual, n, k).launch(
                grid=(n // self.cfg.rows * self.cfg.split, 1, 1), block=(self.cfg.threads, 1, 1), smem=self.cfg.smem,
                **cluster)

        @cute.kernel
        def kernel(self, a: cute.Pointer, w: cute.Pointer, out: cute.Pointer, residual: cute.Pointer,
                   n: cutlass.Int32, k: cutlass.Int32):
            cfg = self.cfg
            M, NT, K, U, S, R = cfg.m, cfg.nt, cfg.k, cfg.unroll, cfg.split, cfg.ring
            NA = NT // 2
            TILE = v1.tile_bytes(NT)
            KC = cfg.kc
            CPT = cfg.chunks
            BPC = cfg.chunk // 32 // U  # asm blocks per chunk
            PITCH = cfg.pitch
            STAGE = cfg.rows * PITCH
            RH = K // 2
            tidx, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            gdim, _, _ = cute.arch.grid_dim()
            warp = tidx // 32
            lane = tidx % 32
            g = lane // 4
            q = lane % 4
            rank = bidx % S
            c = bidx // S
            clusters = gdim // S
            tiles = n // cfg.rows
            count = (tiles - c + clusters - 1) // clusters
            total = count * CPT
            smem = cute.arch.get_dyn_smem(cutlass.Int8, alignment=1024)
            smem32 = cute.recast_ptr(smem, dtype=cutlass.Int32)
            ring = smem + cfg.token_smem
            red = cute.recast_ptr(ring + cfg.ring_smem, dtype=cutlass.Float32)
            bars = cute.recast_ptr(ring + cfg.ring_smem + cfg.red_smem, dtype=cutlass.Int64)
            empty = bars + R
            if tidx == 0:
                for s in cutlass.range_constexpr(R):
                    cute.arch.mbarrier_init(bars + s, 1)
                    cute.arch.mbarrier_init(empty + s, cfg.threads)
                cute.arch.mbarrier_init_fence()
            cute.arch.sync_threads()
            if cutlass.const_expr(S > 1):
                cute.arch.inline_ptx("barrier.cluster.arrive.relaxed.aligned;")
            if warp == 0:
                for s in cutlass.range_constexpr(R):
                    if s < total:
                        self.issue(w, ring, bars, c, clusters, rank, cutlass.Int32(s), s, lane)
            wait_previous_grid(cfg)
            x32 = cute.recast_ptr(a, dtype=cutlass.Int32)
            for i in cutlass.range(tidx, (KC // 32) * NT, cfg.threads, unroll=1):
                gs = i // NT
                j = i % NT
                keep = ((cutlass.Int32(M - 1) - j) >> 31) ^ cutlass.Int32(-1)
                src = x32 + cute.assume((j & keep) * RH + rank * (KC // 2) + gs * 16, divby=4)
                u = cute.make_rmem_tensor(16, cutlass.Int32)
                for cc in cutlass.range_constexpr(4):
                    v = cute.make_tensor(src + 4 * cc, cute.make_layout(4)).load()
                    for e in cutlass.range_constexpr(4):
                        u[4 * cc + e] = v[e] & keep
                for h in cutlass.range_constexpr(2):
                    for hi in cutlass.range_constexpr(2):
                        off = (gs * 2 + h) * TILE + (j // 8) * v1.SBO + hi * v1.LBO + (j % 8) * 16
                        row = cute.make_rmem_tensor(4, cutlass.Int32)
                        for t in cutlass.range_constexpr(4):
                            row[t] = u[v1.staged_word(t, h, hi)]
                        cute.make_tensor(smem32 + cute.assume(off // 4, divby=4), cute.make_layout(4)).store(row.load())
            cute.arch.fence_proxy("async.shared", space="cta")
            cute.arch.sync_threads()
            if cutlass.const_expr(S > 1):
                cute.arch.inline_ptx("barrier.cluster.wait.aligned;")

            acc = cute.make_rmem_tensor(NA, cutlass.Float32)
            acc.fill(0.0)
            # (buffer, word): per step u, rows g (words 8u+0..3) and g + 8 (8u+4..7), read from the ring
            abuf = cute.make_rmem_tensor((2, 8 * U), cutlass.Int32)
            lane_off = (warp * 16 + g) * PITCH + q * 16
            desc0 = (cutlass.Int64((smem.toint() & 0x3FFFF) >> 4) | (cutlass.Int64(v1.LBO >> 4) << 16)
                     | (cutlass.Int64(v1.SBO >> 4) << 32))
            for ci in cutlass.range(total, unroll=1):
                s = ci % R
                kchunk = ci % CPT
                cute.arch.mbarrier_wait(bars + s, (ci // R) & 1)
                stage = ring + s * STAGE + lane_off
                self.lds(abuf, 0, stage, 0)
                for b in cutlass.range_constexpr(BPC):
                    if cutlass.const_expr(b + 1 < BPC):
                        self.lds(abuf, (b + 1) % 2, stage, (b + 1) * U)
                    descs = []
                    for u in cutlass.range_constexpr(U):
                        for h in cutlass.range_constexpr(2):
                            gs = kchunk * (cfg.chunk // 32) + b * U + u
                            descs.append(desc0 + cutlass.Int64((gs * 2 + h) * (TILE >> 4)))
                    regs = []
                    for u in cutlass.range_constexpr(U):
                        wb = 8 * u
                        bb = b % 2
                        regs += [abuf[bb, wb + 0], abuf[bb, wb + 4], abuf[bb, wb + 1], abuf[bb, wb + 5],
                                 abuf[bb, wb + 2], abuf[bb, wb + 6], abuf[bb, wb + 3], abuf[bb, wb + 7]]
                    res = cute.arch.inline_ptx(
                        wgmma_ptx(NT, U, cfg.halves), write_only_types=[cutlass.Float32] * NA,
                        read_only_args=regs + descs + [acc[e] for e in range(NA)],
                    )
                    for e in cutlass.range_constexpr(NA):
                        acc[e] = res[e]
                cute.arch.mbarrier_arrive(empty + s)
                if warp == 0:
                    if ci + R < total:
                        cute.arch.mbarrier_wait(empty + s, (ci // R) & 1)
                        self.issue(w, ring, bars, c, clusters, rank, ci + R, s, lane)
                if kchunk == CPT - 1:
                    tile = c + (ci // CPT) * clusters
                    self.finish(acc, red, rank, (ci // CPT) % 2, tidx, warp, g, q, tile, out, n)
                    acc.fill(0.0)

        @cute.jit
        def lds(self, abuf, buf, stage, step0):
            """Steps step0 .. step0 + unroll - 1 of the stage: 16 bytes of rows g and g + 8 each."""
            for u in cutlass.range_constexpr(self.cfg.unroll):
                for half in cutlass.range_constexpr(2):
                    addr = stage + (half * 8 * self.cfg.pitch + (step0 + u) * 64)
                    v = cute.arch.inline_ptx(LDS_PTX, write_only_types=[cutlass.Int32] * 4,
                                             read_only_args=[addr.toint()])
                    for e in cutlass.range_constexpr(4):
                        abuf[buf, 8 * u + 4 * half + e] = v[e]

        @cute.jit
        def issue(self, w, ring, bars, c, clusters, rank, ci, stage, lane):
            """Warp 0: chunk ``ci`` of the walk into ring stage ``stage``, one bulk copy per row (lane l: rows l + 32i)."""
            cfg = self.cfg
            tile = c + (ci // cfg.chunks) * clusters
            k0 = rank * cfg.kc + (ci % cfg.chunks) * cfg.chunk
            bar = bars + stage
            if lane == 0:
                cute.arch.mbarrier_arrive_and_expect_tx(bar, cfg.rows * cfg.chunk * 2)
            cute.arch.sync_warp()
            for i in cutlass.range_constexpr(cfg.rows // 32):
                r = lane + 32 * i
                src = w + cute.assume((tile * cfg.rows + r) * cfg.k + k0, divby=8)
                dst = ring + (stage * cfg.rows * cfg.pitch + r * cfg.pitch)
                cute.arch.inline_ptx(BULK_COPY_PTX, read_only_args=[dst.toint(), src.toint(),
                                                                    cutlass.Int32(cfg.chunk * 2), bar.toint()])

        @cute.jit
        def finish(self, acc, red, rank, parity, tid, warp, g, q, tile, out, n):
            cfg = self.cfg
            NA = cfg.nt // 2
            S = cfg.split
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
                row0 = tile * cfg.rows + warp * 16
                for e in cutlass.range_constexpr(NA):
                    tok = 8 * (e // 4) + 2 * q + e % 2
                    row = row0 + g + 8 * ((e % 4) // 2)
                    if tok < cfg.m:
                        out_t[tok * n + row] = acc[e].to(cutlass.BFloat16)

    out_dir.mkdir(parents=True, exist_ok=True)
    table = {}
    for cfg in occupancy_variants() if only == "occupancy" else variants():
        if only and only != "occupancy" and only not in cfg.name:
            continue
        cubin = compile_kernel(WgmmaV3(cfg), "sm_90a", str(out_dir), cfg.name)
        (out_dir / f"{cfg.name}.cubin").write_bytes(cubin)
        table[cfg.name] = {"m": cfg.m, "k": cfg.k, "threads": cfg.threads, "smem": cfg.smem, "rows": cfg.rows,
                           "split": cfg.split, "symbol": f"skinny_{cfg.name}_0"}
        print(cfg.name, len(cubin), "bytes", flush=True)
    (out_dir / "variants.json").write_text(json.dumps(table, indent=1, sort_keys=True))


if __name__ == "__main__":
    verb = sys.argv[1] if len(sys.argv) > 1 else ""
    if verb == "emulate":
        emulate_all()
    elif verb == "compile":
        build(Path(sys.argv[2]), sys.argv[3] if len(sys.argv) > 3 else "")
    else:
        print(__doc__)
        sys.exit(2)
