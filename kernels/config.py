"""The kernel config: one frozen dataclass, one validity check, one variant name.

It lives in ``runtime/`` (not ``kernels/``) because three parties need it: the
plan loader and the build (which also import cutlass) and the runtime, which
must check a manifest's configs without importing cutlass or ``kernels/``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

# bf16 elements per 16-byte vector load: the widest global load a thread issues.
MAX_VEC = 8
# fp32 accumulators plus in-flight load registers a thread may hold. Above
# this ptxas spills on sm_90a (255 registers, a third kept for addressing).
REGISTER_BUDGET = 168
# A CTA shares the SM's 64K registers: above 65536 / threads per thread ptxas caps the
# count and spills (v9: 512-thread mma CTAs with 16 stages hit the 128 cap and took a
# 112-byte stack frame). The same third is kept back for addressing.
SM_REGISTERS = 65536
# Fully unrolling K beyond this many loop trips makes compile time and code
# size explode (DESIGN.md: 2.3-2.7 s per variant at K=16384) for no gain.
MAX_STATIC_TRIPS = 64
MAX_M = 8
KINDS = ("simt", "mma", "bulk")
# mma.sync.m16n8k16 with the tokens as its 16-row side (rows >= M are zero): a
# warp's tile is 8 weight rows x 16 token rows x 16 k; one 16-byte load per lane
# feeds two MMAs, so a warp step covers 32 k.
MMA_ROWS, MMA_K_STEP = 8, 32
# Static shared memory a CTA may hold (the kernels take no dynamic shared memory:
# the launch contract has no smem field). Bulk-copy rows are padded by 64 bytes so
# the 8 lanes of each 128-byte phase of a fragment read hit distinct banks.
STATIC_SMEM_LIMIT, BULK_ROW_PAD = 48 * 1024, 64
# Shared memory the CuTe DSL adds to every kernel's own buffers (measured with
# cuobjdump -res-usage on sm_90a: 1024 B plus alignment).
DSL_SMEM_RESERVE = 1024
# L2 fetch sizes a weight load may request (PTX ld ... .L2::64B/128B/256B; 0 = no hint).
FETCH_SIZES = (0, 64, 128, 256)
# CTAs of one thread-block cluster that split a row group's K ("mma" only): 8 is
# the largest cluster every sm_90+ part launches without the non-portable opt-in.
SPLITS = (1, 2, 4, 8)
# K slices per MMA tile ("mma" only, v15): the 8 columns of an MMA's B side are 8 / slices
# weight rows x slices K slices, and its 16 A rows are tokens x the same slices.
SLICES = (1, 2, 4, 8)
MMA_A_ROWS = 16


class ConfigError(ValueError):
    """A kernel config that breaks one of the validity rules; the message names the rule."""


@dataclass(frozen=True, order=True)
class KernelConfig:
    """One skinny GEMM kernel variant: C[m, n] = A[m, k] @ W[n, k]^T (+ residual).

    ``kind`` picks the kernel: "simt" (kernels/skinny_gemm.py, scalar FMAs),
    "mma" (kernels/skinny_mma.py, tensor cores fed from registers) or "bulk"
    (kernels/skinny_bulk.py, tensor cores fed from a shared-memory ring that
    ``cp.async.bulk`` fills: one row group per CTA, a chunk is ``unroll`` 32-k
    steps per warp, ``stages`` chunks in the ring, the first ones issued
    before the PDL wait; at most 48 KB of shared memory). The CTA has ``threads`` threads
    split into ``threads // k_threads`` groups; each group owns ``cols`` output
    columns and its ``k_threads`` threads split K between them, ``vec`` elements
    per load, ``unroll`` loads per column in flight. For "mma", threads come in
    whole warps along K, ``cols`` is a multiple of 8 and ``vec`` is 8; a pipeline
    stage is ``unroll`` 32-k steps and ``stages`` of them are in flight per warp
    (register buffers, software-pipelined K loop; 1 = load a stage, then use it).
    ``static_k`` 0 means K is a runtime value; otherwise the K loop is
    fully unrolled for exactly that K. ``pdl`` launches with programmatic
    dependent launch (the kernel waits on the previous grid only before it
    touches tokens, residual or output); ``prefetch`` has each CTA start a bulk
    L2 prefetch of its weight rows first, so that wait overlaps HBM traffic.
    ``early`` ("simt" with ``pdl`` only) issues the first K trip's weight loads
    into registers before that wait, as the "mma" kernel always does with its
    first ``stages - 1`` stages: the previous kernel's tail then overlaps
    this kernel's HBM latency instead of adding to it. ``fetch`` ("mma" only)
    is the L2 fetch size in bytes each weight load asks for (PTX
    ``L2::128B``/``L2::256B``; 0 = no hint): a larger fetch brings a row's next
    steps into L2 early, a smaller one wastes less of HBM's time on lines the
    grid's tail never uses; which wins depends on the shape (docs/perf.md v4).
    ``split`` ("mma" only) has a thread-block cluster of that many CTAs share
    one row group, each streaming 1/split of K, the partial sums meeting in
    the first CTA's shared memory (distributed shared memory): the grid is
    ``split`` times larger and each CTA's life that much shorter, so a grid's
    last, partial wave costs less (docs/perf.md v6).
    ``persist`` ("simt" with ``early`` only; 0 = off) caps the grid at that many
    CTAs, each walking row groups ``persist`` apart and loading the next group's
    first K trip before it reduces the current one: CTAs never exit between
    groups, so no wave of them ends (and restarts its HBM ramp) at once, and a
    grid under half the SM's threads leaves room for the next kernel's CTAs to
    load their weight before the PDL wait (docs/perf.md v7).
    ``slices`` ("mma" only, without ``split``; 1 = off) makes an MMA tile
    8 / slices weight rows x ``slices`` K slices: B column j is row j // slices
    at slice j % slices, A row i is token i // slices at slice i % slices, and
    only the products of matching slices are kept and summed. A tile then has
    fewer rows (``cols`` a multiple of 8 / slices, down to one row per CTA),
    each warp load covers 64 * slices contiguous bytes of a row, and CTAs
    live shorter at the same bytes in flight (docs/perf.md v15). It needs
    m * slices <= 16 (the A side's rows).
    """

    m: int
    kind: str = "simt"
    threads: int = 256
    k_threads: int = 256
    cols: int = 2
    vec: int = 8
    unroll: int = 2
    static_k: int = 0
    pdl: bool = True
    prefetch: bool = True
    stages: int = 1
    early: bool = False
    fetch: int = 256
    split: int = 1
    persist: int = 0
    slices: int = 1

    @property
    def groups(self) -> int:
        """Column groups per CTA."""
        return self.threads // self.k_threads

    @property
    def cols_per_cta(self) -> int:
        """Output columns one CTA (one cluster, with ``split``) computes."""
        return self.groups * self.cols

    def grid(self, n: int) -> int:
        """CTAs the kernel launches for N outputs: a cluster of ``split`` CTAs per cols_per_cta columns, at most ``persist``."""
        groups = n // self.cols_per_cta
        return (min(groups, self.persist) if self.persist else groups) * self.split

    @property
    def k_step(self) -> int:
        """K elements consumed by one trip of the (unrolled) K loop."""
        if self.kind == "mma":
            return self.k_threads // 32 * MMA_K_STEP * self.unroll * self.stages * self.split * self.slices
        if self.kind == "bulk":
            return self.k_threads // 32 * MMA_K_STEP * self.unroll
        return self.k_threads * self.vec * self.unroll

    @property
    def register_rule(self) -> tuple[int, str]:
        """(registers a thread holds for accumulators and loads in flight, the formula); addresses not counted."""
        if self.kind == "bulk":
            # accumulators + one step's weight fragments per tile + its token words, per unrolled step
            return self.cols // 2 + self.unroll * (self.cols // 2 + 4), "cols/2 + unroll*(cols/2 + 4)"
        if self.kind == "mma":
            # accumulators (4 per tile) + per buffered step: 4 weight words per tile + 4 words per token load
            # (unsliced: tiles = cols / 8 and one token load, i.e. cols/2 + stages*unroll*(cols/2 + 4))
            return (4 * self.mma_tiles + self.stages * self.unroll * (4 * self.mma_tiles + 4 * self.token_loads),
                    "4*tiles + stages*unroll*(4*tiles + 4*token_loads)")
        regs = self.m * self.cols + self.unroll * (self.cols + self.m) * self.vec // 2
        if not self.persist:
            return regs, "m*cols + unroll*(cols+m)*vec/2"
        # the walk also holds the next group's first trip
        return (regs + self.unroll * self.cols * self.vec // 2,
                "m*cols + unroll*(cols+m)*vec/2 + unroll*cols*vec/2 (persist)")

    @property
    def mma_tiles(self) -> int:
        """MMA tiles ("mma"): each 8 / slices weight rows of a group's ``cols``."""
        return self.cols * self.slices // MMA_ROWS

    @property
    def token_loads(self) -> int:
        """Token loads per lane and step ("mma"): 2 once the m x slices rows of the A side pass its first 8."""
        return 2 if self.m * self.slices > MMA_ROWS else 1

    @property
    def mma_smem(self) -> int:
        """Shared-memory bytes of an "mma" CTA: the K-split warps' partials, with ``split`` the slots CTA 0 receives,
        and with ``slices`` every warp's partial of every output and slice (even for one warp)."""
        if self.slices > 1:
            # (groups, warps, m, cols, slices) fp32: each warp's partial of each output and slice
            return self.groups * (self.k_threads // 32) * self.m * self.cols * self.slices * 4
        per_warp = self.groups * (self.cols // MMA_ROWS * 2) * 32 * 4
        warps = self.k_threads // 32
        return (per_warp * warps if warps > 1 else 0) + per_warp * (self.split - 1)

    @property
    def bulk_smem(self) -> int:
        """Shared-memory bytes of a "bulk" CTA: the weight ring, its two mbarriers per stage, the K-split reduction."""
        ring = self.stages * self.cols * (self.k_step * 2 + BULK_ROW_PAD)
        # reduction: (warps, cols / 8 tiles x 2 values, 32 lanes) fp32
        return ring + 16 * self.stages + (self.k_threads // 32) * (self.cols // MMA_ROWS * 2) * 32 * 4

    @property
    def name(self) -> str:
        """The variant name: every field changes it; also the kernel symbol's stem.

        Fields added later append a part only when they differ from their
        default, so names (and plan tables) made before them stay valid.
        """
        k = f"k{self.static_k}" if self.static_k else "kdyn"
        return (
            f"{self.kind}_m{self.m}_t{self.threads}_kt{self.k_threads}_c{self.cols}_v{self.vec}"
            f"_u{self.unroll}_{k}_{'pdl' if self.pdl else 'nopdl'}{'_pf' if self.prefetch else ''}"
            f"{f'_s{self.stages}' if self.stages != 1 else ''}{'_e' if self.early else ''}"
            f"{f'_f{self.fetch}' if self.fetch != 256 else ''}{f'_x{self.split}' if self.split != 1 else ''}"
            f"{f'_p{self.persist}' if self.persist else ''}{f'_sl{self.slices}' if self.slices != 1 else ''}"
        )

    @property
    def symbol(self) -> str:
        """The kernel's symbol in the cubin (the DSL appends ``_0``)."""
        return f"skinny_{self.name}_0"

    def to_json(self) -> dict:
        """Plain dict for plan tables and manifests (sorted by the JSON writer)."""
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "KernelConfig":
        """Inverse of to_json; unknown or missing fields raise ConfigError."""
        fields = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - fields
        if unknown:
            raise ConfigError(f"unknown config fields: {sorted(unknown)}")
        try:
            return cls(**data)
        except TypeError as exc:
            raise ConfigError(str(exc)) from None

    def check(self, n: int | None = None, k: int | None = None) -> None:
        """The single validity check; raises ConfigError naming the broken rule.

        With ``n``/``k`` it also checks that this config can run that shape.
        """
        for field in ("m", "threads", "k_threads", "cols", "vec", "unroll", "stages"):
            value = getattr(self, field)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"rule 'positive': {field}={value!r} must be a positive int")
        if self.kind not in KINDS:
            raise ConfigError(f"rule 'kind': kind={self.kind!r} must be one of {KINDS}")
        for flag in ("pdl", "prefetch", "early"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"rule 'flags': {flag}={getattr(self, flag)!r} must be true or false")
        if self.early and (self.kind != "simt" or not self.pdl):
            raise ConfigError(
                f"rule 'early': early needs kind 'simt' and pdl (kind={self.kind!r}, pdl={self.pdl}); the mma "
                "kernel always loads its first stages-1 stages before the PDL wait"
            )
        if not isinstance(self.fetch, int) or isinstance(self.fetch, bool) or self.fetch not in FETCH_SIZES:
            raise ConfigError(f"rule 'fetch': fetch={self.fetch!r} must be one of {FETCH_SIZES} bytes")
        if self.kind != "mma" and self.fetch != 256:
            raise ConfigError(
                f"rule 'fetch': fetch={self.fetch} is an mma option; kind {self.kind!r} keeps the default 256 "
                "(its loads carry no hint, so another value would only duplicate the variant)"
            )
        if not isinstance(self.split, int) or isinstance(self.split, bool) or self.split not in SPLITS:
            raise ConfigError(f"rule 'split': split={self.split!r} must be one of {SPLITS} CTAs per cluster")
        if self.split != 1 and (self.kind != "mma" or self.prefetch):
            raise ConfigError(
                f"rule 'split': split={self.split} needs kind 'mma' without prefetch (kind={self.kind!r}, "
                f"prefetch={self.prefetch}): only the mma kernel reduces across a cluster"
            )
        if not isinstance(self.persist, int) or isinstance(self.persist, bool) or self.persist < 0:
            raise ConfigError(f"rule 'persist': persist={self.persist!r} must be an int >= 0 (0 = one CTA per row group)")
        if self.persist and (self.kind != "simt" or not self.early or self.prefetch or self.static_k):
            raise ConfigError(
                f"rule 'persist': persist={self.persist} needs kind 'simt' with early, without prefetch and with "
                f"a runtime K (kind={self.kind!r}, early={self.early}, prefetch={self.prefetch}, "
                f"static_k={self.static_k}): the walk preloads each group's first trip, the first one before "
                "the PDL wait, and loops over K at run time"
            )
        if self.m > MAX_M:
            raise ConfigError(f"rule 'm range': m={self.m} exceeds {MAX_M}")
        if not isinstance(self.slices, int) or isinstance(self.slices, bool) or self.slices not in SLICES:
            raise ConfigError(f"rule 'slices': slices={self.slices!r} must be one of {SLICES}")
        if self.slices != 1 and (self.kind != "mma" or self.split != 1 or self.m * self.slices > MMA_A_ROWS):
            raise ConfigError(
                f"rule 'slices': slices={self.slices} needs kind 'mma', split 1 and m*slices <= {MMA_A_ROWS} "
                f"(kind={self.kind!r}, split={self.split}, m={self.m}): the A side's {MMA_A_ROWS} rows hold "
                "every token at every slice"
            )
        if self.threads % 32 or self.threads > 1024:
            raise ConfigError(f"rule 'whole warps': threads={self.threads} must be a multiple of 32, at most 1024")
        if self.k_threads & (self.k_threads - 1) or self.threads % self.k_threads:
            raise ConfigError(
                f"rule 'k_threads split': k_threads={self.k_threads} must be a power of two dividing threads={self.threads}"
            )
        if self.vec not in (2, 4, 8):
            raise ConfigError(f"rule 'vector width': vec={self.vec} must be 2, 4 or 8 bf16 (4, 8 or 16 bytes)")
        if self.kind == "bulk":
            if (
                self.k_threads < 32
                or self.vec != 8
                or self.cols % MMA_ROWS
                or self.threads != self.k_threads
                or self.prefetch
            ):
                raise ConfigError(
                    f"rule 'bulk tile': k_threads={self.k_threads} must be whole warps and equal threads={self.threads}, "
                    f"vec={self.vec} must be 8, cols={self.cols} a multiple of {MMA_ROWS}, and prefetch off "
                    "(the ring's first chunks already go out before the PDL wait)"
                )
            if self.bulk_smem + DSL_SMEM_RESERVE > STATIC_SMEM_LIMIT:
                raise ConfigError(
                    f"rule 'shared memory': {self.bulk_smem} bytes of weight ring + {DSL_SMEM_RESERVE} the DSL adds "
                    f"exceed {STATIC_SMEM_LIMIT}"
                )
        elif self.kind == "mma":
            rows = MMA_ROWS // self.slices
            if self.k_threads < 32 or self.vec != 8 or self.cols % rows:
                raise ConfigError(
                    f"rule 'mma tile': k_threads={self.k_threads} must be whole warps, vec={self.vec} must be 8 "
                    f"and cols={self.cols} a multiple of {rows} (8 / slices rows per tile)"
                )
            if self.slices > 1 and self.m * self.cols > self.k_threads:
                raise ConfigError(
                    f"rule 'reduction lanes': m*cols={self.m * self.cols} outputs exceed k_threads={self.k_threads} "
                    "(one thread of the group sums each output's slices)"
                )
            if self.mma_smem + DSL_SMEM_RESERVE > STATIC_SMEM_LIMIT:
                raise ConfigError(
                    f"rule 'shared memory': {self.mma_smem} bytes of reduction buffers + {DSL_SMEM_RESERVE} the DSL "
                    f"adds exceed {STATIC_SMEM_LIMIT}"
                )
        else:
            if self.stages != 1:
                raise ConfigError(f"rule 'stages': stages={self.stages} must be 1 for kind 'simt' (no pipelined K loop)")
            if self.k_threads > 32 and self.m * self.cols > self.k_threads:
                raise ConfigError(
                    f"rule 'reduction lanes': m*cols={self.m * self.cols} outputs exceed k_threads={self.k_threads}"
                )
        regs, rule = self.register_rule
        budget = min(REGISTER_BUDGET, SM_REGISTERS // self.threads * 2 // 3)
        if regs > budget:
            raise ConfigError(
                f"rule 'register budget': {rule} = {regs} exceeds {budget} "
                f"(min of {REGISTER_BUDGET} and two thirds of {SM_REGISTERS} / threads={self.threads})"
            )
        if self.static_k:
            if self.static_k < 0 or self.static_k % self.k_step:
                raise ConfigError(
                    f"rule 'static k': static_k={self.static_k} must be a positive multiple of "
                    f"the K step={self.k_step}"
                )
            if self.static_k // self.k_step > MAX_STATIC_TRIPS:
                raise ConfigError(
                    f"rule 'static k': {self.static_k // self.k_step} unrolled trips exceed {MAX_STATIC_TRIPS}"
                )
        if k is not None:
            if k % self.k_step:
                raise ConfigError(f"rule 'k divisible': K={k} is not a multiple of the K step={self.k_step}")
            if self.static_k and k != self.static_k:
                raise ConfigError(f"rule 'static k': K={k} differs from the baked-in static_k={self.static_k}")
        if n is not None and n < 1:
            raise ConfigError(f"rule 'n positive': N={n} must be at least 1")
        if n is not None and k is not None and n * k >= 2**31:
            # The kernels index the weight with 32-bit element offsets.
            raise ConfigError(f"rule 'int32 offsets': N*K={n * k} elements must stay below 2^31")
        if n is not None and n % self.cols_per_cta:
            raise ConfigError(f"rule 'n divisible': N={n} is not a multiple of columns per CTA={self.cols_per_cta}")
