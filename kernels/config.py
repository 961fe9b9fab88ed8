"""The kernel config: one frozen dataclass, one validity check, one variant name, one launch shape.

It has no cutlass import: the plan loader and the build (which also import cutlass)
and the runtime, which must check a manifest's configs without cutlass, share it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

# fp32 accumulators plus in-flight load registers a thread may hold. Above
# this ptxas spills on sm_90a (255 registers, a third kept for addressing).
REGISTER_BUDGET = 168
# A CTA shares the SM's 64K registers: above 65536 / threads per thread ptxas caps the
# count and spills (512-thread mma CTAs with 16 stages hit the 128 cap and took a
# 112-byte stack frame). The same third is kept back for addressing.
SM_REGISTERS = 65536
# Fully unrolling K beyond this many loop trips makes compile time and code
# size explode (measured on 2 cores: 2.3-2.7 s per variant at K=16384 against 0.24-0.39 s
# with a runtime K loop) for no gain.
MAX_STATIC_TRIPS = 64
# Tokens per call: vLLM pads decode batches to CUDA-graph sizes 1, 2, 4, 8, 16, 24, 32, ...; the "wgmma"
# kind's N runs to 32 (MAX_M), the mma kernel's A side has 16 rows (MAX_M_MMA, also the simt kernel's
# tuned range), the bulk kernel loads one token row per lane (A rows 0..7: MAX_M_BULK).
MAX_M = 32
MAX_M_MMA = 16
# vLLM's CUDA-graph decode sizes the kernels run (3, 5-7, 9-15 and 17-23, 25-31 never reach a projection
# under graphs): what `tune prepare` may be asked for beyond a seed set's own token counts.
VLLM_GRAPH_MS = (1, 2, 4, 8, 16, 24, 32)
# The token counts plans are made and reported for by default: the graph sizes up to MAX_M_MMA, where
# every kind competes; 24 and 32 are tuned on request (kind "wgmma" alone runs them).
DECODE_MS = (1, 2, 4, 8, 16)
# SMs of the H100 / H200 SXM (sm_90a), the GPU the plans are tuned on: waves and grid sizes count against it.
H200_SMS = 132
MAX_M_BULK = 8
KINDS = ("simt", "mma", "bulk", "wgmma")
# "wgmma": weight rows are the warpgroup MMA's 64-row side, tokens its N (m rounded up to 8, at most 32;
# rows past m are zeros).
# A stage is 64 k (128 bytes: one row of the 128-byte swizzle) of every row and token; the weight box
# comes by TMA through a tensor map the runtime encodes per weight (runtime/tensormaps.py).
WGMMA_ROWS, WGMMA_K = 64, 64
# Shared memory (static + dynamic) one CTA may take, per arch: 227 KB on the H100 / H200, 99 KB on the GB10
# (CUDA's per-block opt-in maxima). The config rules use the sm_90a figure (the tuned arch); the build and the
# runtime check each cubin against its own arch's (runtime/artifacts.py check_cubin).
SMEM_PER_CTA = {"sm_90a": 227 * 1024, "sm_121": 99 * 1024}
DYNAMIC_SMEM_LIMIT = SMEM_PER_CTA["sm_90a"]
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
# K slices per MMA tile ("mma" only): the 8 columns of an MMA's B side are 8 / slices
# weight rows x slices K slices, and its 16 A rows are tokens x the same slices.
SLICES = (1, 2, 4, 8)
MMA_A_ROWS = 16
# A tail variant serves any K that is a multiple of this (16-byte rows: every vector load is
# wholly inside K or wholly past it, so a load is either taken or replaced by zeros).
TAIL_K_GRAIN = 8
# Fields newer than the committed plan tables, and their defaults: to_json leaves them out when off.
QUIET_FIELDS = {"bias": False, "tail": False, "ring": False, "token_groups": 1, "token_stages": 0, "min_ctas": 0}
# "mma" with ``ring``: a 16-byte cp.async slot per lane, per stage, unrolled step and operand (each weight
# tile, each token load); a warp's slots of one operand are 32 x 16 = 512 contiguous bytes.
RING_SLOT = 16
# Token groups of a sliced "mma" tile: the A side holds m / token_groups tokens x slices.
TOKEN_GROUPS = (1, 2, 4)
# The fewest registers per thread a launch bound (``min_ctas``) may leave (at most 682 threads per SM, under
# sm_90's 2048 and sm_121's 1536): below it the accumulators and one weight stage of a sliced M = 16 tile no
# longer fit without spilling. A bound leaving 256 or more changes nothing (ptxas allocates at most 255).
MIN_CTAS_REGISTER_FLOOR = 96
PTXAS_MAX_REGISTERS = 255
# Registers an "mma" walk (``persist``) keeps beside its register rule: the weight row, token and output
# addresses, the walk's indices and the epilogue's temporaries (cuobjdump of the sm_90a walk variants).
PERSIST_ADDRESS_REGISTERS = 24
# Shared memory of one sm_90 SM (228 KB), which "wgmma" CTAs' and "mma" rings divide.
SM_SMEM = 228 * 1024


class ConfigError(ValueError):
    """A kernel config that breaks one of the validity rules; the message names the rule."""


@dataclass(frozen=True)
class LaunchShape:
    """How one variant is launched (``KernelConfig.launch``): a 1-D grid of 1-D blocks, in clusters along x."""

    # CTAs along x (y and z are 1); None when the shape was asked for without N
    grid: int | None
    block: tuple[int, int, int]
    # CTAs per cluster along x; 1 = no cluster attribute
    cluster: int
    # dynamic shared-memory bytes: the "wgmma" ring, the "mma" ring (``ring``); 0 for the rest, whose
    # buffers are static shared memory (STATIC_SMEM_LIMIT)
    smem: int
    # launched with programmatic stream serialization (the kernel's griddepcontrol wait then overlaps)
    pdl: bool


class WgmmaLayout(NamedTuple):
    """Byte offsets of a "wgmma" CTA's shared-memory regions (``KernelConfig.wgmma_layout``)."""

    tokens: int
    barriers: int
    reduction: int
    end: int


@dataclass(frozen=True, order=True)
class KernelConfig:
    """One skinny GEMM kernel variant: C[m, n] = A[m, k] @ W[n, k]^T (+ residual, or + bias).

    The CTA has ``threads`` threads in ``threads // k_threads`` groups; a group owns
    ``cols`` output columns (weight rows) and its ``k_threads`` threads split K.
    The kernel files' docstrings say how each kind maps threads to data.
    """

    # tokens (rows of A and C), baked in
    m: int
    # "simt" (kernels/skinny_gemm.py, scalar FMAs), "mma" (kernels/skinny_mma.py, tensor cores fed from
    # registers), "bulk" (kernels/skinny_bulk.py, tensor cores fed from a cp.async.bulk shared-memory ring),
    # "wgmma" (kernels/skinny_wgmma.py, warpgroup MMA with the weight rows as its M, fed by TMA)
    kind: str = "simt"
    threads: int = 256
    k_threads: int = 256
    cols: int = 2
    # bf16 per load (simt); 8 (one 16-byte load feeds two MMAs) for mma and bulk
    vec: int = 8
    # loads per column in flight (simt); 32-k steps per pipeline stage (mma) or ring chunk (bulk)
    unroll: int = 2
    # 0: K is a runtime value; else the K loop is fully unrolled for exactly this K
    static_k: int = 0
    # programmatic dependent launch: the kernel waits on the previous grid only before it touches
    # tokens, residual or output, so the previous kernel's tail overlaps its weight loads
    pdl: bool = True
    # each CTA first starts a bulk L2 prefetch of its weight rows, so the PDL wait overlaps HBM traffic
    prefetch: bool = True
    # register buffers in flight per warp (mma: software-pipelined K loop) or ring chunks (bulk)
    stages: int = 1
    # simt with pdl: trip 0's weight loads go out before the PDL wait (the mma kernel always does this
    # with its first stages-1 stages): the previous kernel's tail hides this kernel's HBM latency
    early: bool = False
    # mma: L2 fetch bytes per weight load (0 = no hint); larger prefetches a row's next steps, smaller
    # wastes less HBM time on lines the grid's tail never uses; the winner depends on the shape
    # (H200: 128 B was 3-9% faster on 4096x2048, 4096x4096, 6416x4096; no hint won 4096x1536)
    fetch: int = 256
    # mma: a cluster of this many CTAs shares a row group, each streaming 1/split of K and meeting in CTA 0's
    # shared memory: shorter CTAs make the grid's last partial wave cheaper (H200: 2-5% on M=4 mid shapes)
    split: int = 1
    # simt with early: cap the grid at this many CTAs that walk row groups persist apart and preload the next
    # group's first trip; no wave ends at once and the next kernel's CTAs find room (up to 8% faster alone, slower
    # inside the decode step: docs/perf.md "Ideas that lost"); 0 = off.
    # mma (static K): the same capped walk, each warp loading the tokens of its K range into registers once for
    # the whole kernel, so the walk streams weight only, and the next group's first stages load during the last
    # trip and the epilogue. Why: at M = 16 a warp loads 16 token bytes per 8 of weight from L1, twice M = 8's
    # L1 wavefronts per weight byte, and no M = 16 register config passed 80% of the H200's HBM peak on
    # 28672x4096 where the M = 8 pick reaches 89% (docs/perf.md "Next")
    persist: int = 0
    # mma: an MMA tile is 8/slices weight rows x slices K slices, so CTAs can be down to one row and a warp
    # load covers 64*slices contiguous bytes of a row (docs/perf.md "What won"); needs m*slices <= 16 (the A side's rows)
    slices: int = 1
    # the 4th pointer is a bias vector of N bf16 (0 = none), added in fp32 before the single rounding;
    # the ABI stays 40 bytes, so a bias variant takes no residual (calls with one run a non-bias variant)
    bias: bool = False
    # K need only be a multiple of 8 and N any size: the last K trip takes only the loads inside K (the
    # others are zeros, never products of masked values) and the last CTA's columns past N are neither
    # read (their loads read row N-1) nor written. Kind "wgmma": N any size, K still whole 64-k chunks (the
    # TMA box's rows past N land as zeros; the stores past N are masked)
    tail: bool = False
    # mma: the pipeline's ``stages`` live in shared memory, not registers: each lane copies its 16-byte
    # weight and token words by cp.async into its own slots and reads them back right before its MMAs,
    # so the bytes in flight cost no registers (on the H200 the register pipeline's 2-8 stages lost
    # 2-22 us per down_proj call inside the served step, the deep TMA rings of cuBLAS and "wgmma" none)
    ring: bool = False
    # mma with slices: the tokens run in this many groups of m / token_groups, each with its own A fragments
    # against the same weight fragments, so 16 tokens fit sliced tiles (m / token_groups * slices <= 16): the
    # unsliced tiles 16 tokens need load 8 rows x 64 B per warp and ran 38720x4096 at 82% of 4.8 TB/s (M=4, sliced: 93%)
    token_groups: int = 1
    # mma without ring: the tokens' register buffers (0: ``stages``, like the weight's). Tokens are L1/L2 reads, so
    # fewer stages ahead than the weight's HBM reads may do; each one fewer frees 4 x token_loads x token_groups
    # registers per step (at M = 16 in 2 groups, 4 stages: 64 of the 184 a 16-row CTA holds are tokens in flight)
    token_stages: int = 0
    # mma: a launch bound (nvvm.minctasm): ptxas keeps a thread under 65536 / (threads x min_ctas) registers,
    # spilling if it must, so that many CTAs stay resident per SM (0: no bound). At M = 16 the token groups'
    # registers hold a 256-thread CTA to one per SM (184 registers); on the H200 a bounded config ran a median
    # 11-20% faster than its unbounded twin, though each cell's best moved by 2% at most (qkv 6144x4096: 6%)
    min_ctas: int = 0

    @property
    def groups(self) -> int:
        """Column groups per CTA."""
        return self.threads // self.k_threads

    @property
    def cols_per_cta(self) -> int:
        """Output columns one CTA (one cluster, with ``split``) computes."""
        return self.groups * self.cols

    def row_groups(self, n):
        """Clusters of ``cols_per_cta`` columns covering N outputs (with ``tail`` the last one may pass N).

        Written with ``+`` and ``//`` only, so the JIT launcher can pass the DSL's traced Int32 ``n``
        (its ``//`` truncates, so a floor of a negative would be wrong there).
        """
        return (n + (self.cols_per_cta - 1)) // self.cols_per_cta if self.tail else n // self.cols_per_cta

    def grid(self, n: int) -> int:
        """CTAs the kernel launches for N outputs: a cluster of ``split`` CTAs per cols_per_cta columns, at most ``persist``."""
        groups = self.row_groups(n)
        return (min(groups, self.persist) if self.persist else groups) * self.split

    def launch(self, n: int | None = None, persist: bool = True) -> LaunchShape:
        """The launch shape: the one source the kernel launcher, the build's manifest record, the runtime's
        check of that record and the driver launch all read.

        ``grid`` is for ``n`` outputs (None without ``n``: every other field holds for any N). The JIT
        launcher passes ``persist=False``: there a walk does one row group per CTA, so the grid is uncapped.
        """
        if n is None:
            grid = None
        elif persist:
            grid = self.grid(n)
        else:
            grid = self.row_groups(n) * self.split
        smem = self.wgmma_smem if self.kind == "wgmma" else self.ring_smem
        return LaunchShape(grid=grid, block=(self.threads, 1, 1), cluster=self.split, smem=smem, pdl=self.pdl)

    @property
    def k_step(self) -> int:
        """K elements consumed by one trip of the (unrolled) K loop."""
        if self.kind == "mma":
            return self.k_threads // 32 * MMA_K_STEP * self.unroll * self.stages * self.split * self.slices
        if self.kind == "bulk":
            return self.k_threads // 32 * MMA_K_STEP * self.unroll
        if self.kind == "wgmma":
            return WGMMA_K * self.split
        return self.k_threads * self.vec * self.unroll

    @property
    def register_rule(self) -> tuple[int, str]:
        """(registers a thread holds for accumulators and loads in flight, the formula); addresses not counted."""
        if self.kind == "wgmma":
            # accumulators only: the operands stay in shared memory
            return self.nt // 2, "nt/2"
        if self.kind == "bulk":
            # accumulators + one step's weight fragments per tile + its token words, per unrolled step
            return self.cols // 2 + self.unroll * (self.cols // 2 + 4), "cols/2 + unroll*(cols/2 + 4)"
        if self.kind == "mma" and self.ring:
            # accumulators + one step's operands, read back from the ring right before its MMAs
            return (
                4 * self.mma_tiles + self.unroll * (4 * self.mma_tiles + 4 * self.token_loads),
                "4*tiles + unroll*(4*tiles + 4*token_loads) (ring)",
            )
        if self.walk:
            # accumulators + the weight's buffered steps + every step of the warp's K range's tokens, resident
            G = self.token_groups
            return (
                4 * self.mma_tiles * G
                + self.stages * self.unroll * 4 * self.mma_tiles
                + self.warp_steps * 4 * self.token_loads * G,
                "4*tiles*token_groups + stages*unroll*4*tiles + warp_steps*4*token_loads*token_groups (persist)",
            )
        if self.kind == "mma":
            # accumulators (4 per tile and token group) + per buffered step: 4 weight words per tile + 4 words per
            # token load and group (unsliced: tiles = cols / 8, one group and one token load, i.e.
            # cols/2 + stages*unroll*(cols/2 + 4))
            G = self.token_groups
            return (
                4 * self.mma_tiles * G
                + self.stages * self.unroll * 4 * self.mma_tiles
                + self.x_stages * self.unroll * 4 * self.token_loads * G,
                "4*tiles*token_groups + stages*unroll*4*tiles + token_stages*unroll*4*token_loads*token_groups",
            )
        regs = self.m * self.cols + self.unroll * (self.cols + self.m) * self.vec // 2
        if not self.persist:
            return regs, "m*cols + unroll*(cols+m)*vec/2"
        # the walk also holds the next group's first trip
        return (
            regs + self.unroll * self.cols * self.vec // 2,
            "m*cols + unroll*(cols+m)*vec/2 + unroll*cols*vec/2 (persist)",
        )

    @property
    def walk(self) -> bool:
        """The "mma" walk: ``persist`` on kind "mma" (the SIMT kernel's ``persist`` is its own walk)."""
        return self.kind == "mma" and self.persist > 0

    def without_pdl(self) -> KernelConfig:
        """This config launched without PDL (its twin in the tuner's decode phase): ``early`` and the SIMT walk need
        PDL, so they go too; the mma and wgmma walks run without it."""
        keep = self.walk or self.wgmma_walk
        return dataclasses.replace(self, pdl=False, early=False, persist=self.persist if keep else 0)

    @property
    def warp_steps(self) -> int:
        """32 x slices-k steps of one warp's K range ("mma" with ``static_k``: what a persist walk keeps in registers)."""
        return self.static_k // self.k_step * self.stages * self.unroll

    @property
    def register_budget(self) -> int:
        """Registers the register rule may claim per thread: a third of the thread's share kept for addresses, or for
        an "mma" walk (``persist``) a fixed PERSIST_ADDRESS_REGISTERS: its addresses do not grow with its tokens."""
        share = SM_REGISTERS // self.threads
        if self.walk:
            # a walk of 2 or more CTAs per SM (min_ctas) must fit under the bound's cap
            return min(PTXAS_MAX_REGISTERS, share // 8 * 8, self.register_cap or share) - PERSIST_ADDRESS_REGISTERS
        return min(REGISTER_BUDGET, share * 2 // 3)

    @property
    def mma_tiles(self) -> int:
        """MMA tiles ("mma"): each 8 / slices weight rows of a group's ``cols``."""
        return self.cols * self.slices // MMA_ROWS

    @property
    def outputs_per_thread(self) -> int:
        """Outputs each thread of a group sums and stores in the sliced epilogue ("mma" with slices): M x cols
        outputs over the group's k_threads threads, rounded up."""
        return -(-self.m * self.cols // self.k_threads)

    @property
    def smem_ctas(self) -> int:
        """CTAs of a "wgmma" or "mma" ring that one sm_90 SM's shared memory holds (2048 for the others: no bound)."""
        ring = self.launch().smem  # the dynamic ring; an mma ring's static reduction buffers come beside it
        return SM_SMEM // (ring + (self.mma_smem if self.ring else 0) + DSL_SMEM_RESERVE) if ring else 2048

    @property
    def register_cap(self) -> int | None:
        """The registers per thread ``min_ctas`` leaves (ptxas allocates in steps of 8), or None without a bound."""
        if not self.min_ctas:
            return None
        return SM_REGISTERS // (self.threads * self.min_ctas) // 8 * 8

    @property
    def x_stages(self) -> int:
        """The tokens' register buffers ("mma"): ``token_stages``, or ``stages`` when it is 0."""
        return self.token_stages or self.stages

    @property
    def token_loads(self) -> int:
        """Token loads per lane, step and token group ("mma"): 2 once a group's tokens x slices rows of the A side
        pass its first 8."""
        return 2 if self.m // self.token_groups * self.slices > MMA_ROWS else 1

    @property
    def mma_smem(self) -> int:
        """Shared-memory bytes of an "mma" CTA: the K-split warps' partials, with ``split`` the slots CTA 0 receives,
        and with ``slices`` every warp's partial of every output and slice (even for one warp)."""
        if self.slices > 1 or self.walk:
            # (groups, warps, m, cols, slices) fp32: each warp's partial of each output and slice; the walk
            # (``persist``) keeps two, one per group parity
            part = self.groups * (self.k_threads // 32) * self.m * self.cols * self.slices * 4
            return part * (2 if self.walk else 1)
        # (groups, tiles x c0, c1 (and c2, c3: A rows 8..15), 32 lanes) fp32 per warp
        per_warp = self.groups * (self.cols // MMA_ROWS * 2 * self.token_loads) * 32 * 4
        warps = self.k_threads // 32
        return (per_warp * warps if warps > 1 else 0) + per_warp * (self.split - 1)

    @property
    def ring_smem(self) -> int:
        """Dynamic shared-memory bytes of an "mma" CTA with ``ring`` (0 without): per warp, stage and unrolled step
        one 16-byte slot per lane for each weight tile and each token load."""
        if not self.ring:
            return 0
        return self.threads // 32 * self.stages * self.unroll * (self.mma_tiles + self.token_loads) * 32 * RING_SLOT

    @property
    def nt(self) -> int:
        """Tokens per warpgroup MMA ("wgmma"): its N, m rounded up to 8 (8, 16, 24 or 32); token rows m..nt-1 are zeros."""
        return -(-self.m // 8) * 8

    @property
    def wgmma_walk(self) -> bool:
        """The "wgmma" walk: ``persist`` CTAs walk the row groups ``gridDim`` apart, the tokens resident in shared memory."""
        return self.kind == "wgmma" and self.persist > 0

    @property
    def wgmma_stage(self) -> int:
        """Bytes of one ring stage ("wgmma"): the weight box (cols rows x 128 B), then the token box (nt rows x 128 B;
        none in the walk, whose tokens stay resident); multiples of the 1024-byte swizzle atom, so every box starts
        aligned to it."""
        return (self.cols + (0 if self.wgmma_walk else self.nt)) * WGMMA_K * 2

    @property
    def wgmma_tokens(self) -> int:
        """Bytes of the walk's resident tokens: every 64-k chunk of the static K, nt rows x 128 B (0 but in the walk)."""
        return self.static_k // WGMMA_K * self.nt * WGMMA_K * 2 if self.wgmma_walk else 0

    @property
    def wgmma_layout(self) -> WgmmaLayout:
        """Byte offsets in a "wgmma" CTA's dynamic shared memory (from its 1024-aligned start): the ring's stages
        from 0, then the walk's resident tokens, a full and an empty mbarrier per stage, and with ``split`` the
        slots CTA 0 receives (every consumer thread's accumulators from each other CTA); the kernel addresses
        exactly these."""
        tokens = self.stages * self.wgmma_stage
        barriers = tokens + self.wgmma_tokens
        reduction = barriers + 16 * self.stages
        end = reduction + (self.split - 1) * self.cols * 2 * (self.nt // 2) * 4
        return WgmmaLayout(tokens, barriers, reduction, end)

    @property
    def wgmma_smem(self) -> int:
        """Dynamic shared-memory bytes of a "wgmma" CTA: its layout and the 1024 bytes the ring's alignment may cost."""
        return self.wgmma_layout.end + 1024

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
            f"{'_b' if self.bias else ''}{'_t' if self.tail else ''}{'_r' if self.ring else ''}"
            f"{f'_tg{self.token_groups}' if self.token_groups != 1 else ''}"
            f"{f'_ts{self.token_stages}' if self.token_stages else ''}"
            f"{f'_mc{self.min_ctas}' if self.min_ctas else ''}"
        )

    @property
    def symbol(self) -> str:
        """The kernel's symbol in the cubin (the DSL appends ``_0``)."""
        return f"skinny_{self.name}_0"

    def to_json(self) -> dict:
        """Plain dict for plan tables and manifests (sorted by the JSON writer).

        Fields added after the committed plan tables (``QUIET_FIELDS``) are left out at their
        default, so tables, tuner output and manifests written before them stay byte-identical.
        """
        data = dataclasses.asdict(self)
        for name, default in QUIET_FIELDS.items():
            if data[name] == default:
                del data[name]
        return data

    @classmethod
    def from_json(cls, data: dict) -> KernelConfig:
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

        Order: every field's type and range, the options' combinations, the kind's own rules,
        the register budget and static K; with ``n``/``k`` also that this config can run that shape.
        """
        for field, rule, ok, need in _FIELD_RULES:
            value = getattr(self, field)
            if not ok(value):
                raise ConfigError(f"rule '{rule}': {field}={value!r} must be {need}")
        _option_rules(self)
        _KIND_RULES[self.kind](self)
        regs, rule = self.register_rule
        budget = self.register_budget
        if regs > budget:
            how = (
                f"{SM_REGISTERS} / threads={self.threads} at most {PTXAS_MAX_REGISTERS} and the launch bound's cap, "
                f"less {PERSIST_ADDRESS_REGISTERS}"
                if self.walk
                else f"min of {REGISTER_BUDGET} and two thirds of {SM_REGISTERS} / threads={self.threads}"
            )
            raise ConfigError(f"rule 'register budget': {rule} = {regs} exceeds {budget} ({how})")
        if self.static_k:
            if self.static_k % self.k_step:
                raise ConfigError(
                    f"rule 'static k': static_k={self.static_k} must be a positive multiple of the K step={self.k_step}"
                )
            # the wgmma walk's chunk loop stays a loop: its static K only sizes the resident tokens
            if self.kind != "wgmma" and self.static_k // self.k_step > MAX_STATIC_TRIPS:
                raise ConfigError(
                    f"rule 'static k': {self.static_k // self.k_step} unrolled trips exceed {MAX_STATIC_TRIPS}"
                )
        _shape_rules(self, n, k)


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# (field, rule, test, what the value must be): the type and range of every field, checked first.
_FIELD_RULES = (
    *(
        (f, "positive", lambda v: _is_int(v) and v >= 1, "a positive int")
        for f in ("m", "threads", "k_threads", "cols", "vec", "unroll", "stages")
    ),
    ("kind", "kind", lambda v: v in KINDS, f"one of {KINDS}"),
    *(
        (f, "flags", lambda v: isinstance(v, bool), "true or false")
        for f in ("pdl", "prefetch", "early", "bias", "tail", "ring")
    ),
    ("fetch", "fetch", lambda v: _is_int(v) and v in FETCH_SIZES, f"one of {FETCH_SIZES} bytes"),
    ("split", "split", lambda v: _is_int(v) and v in SPLITS, f"one of {SPLITS} CTAs per cluster"),
    ("persist", "persist", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = one CTA per row group)"),
    ("slices", "slices", lambda v: _is_int(v) and v in SLICES, f"one of {SLICES}"),
    ("static_k", "static k", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = K at run time)"),
    ("token_groups", "token groups", lambda v: _is_int(v) and v in TOKEN_GROUPS, f"one of {TOKEN_GROUPS}"),
    ("token_stages", "token stages", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = stages)"),
    ("min_ctas", "min ctas", lambda v: _is_int(v) and v >= 0, "an int >= 0 (0 = no launch bound)"),
)


def _option_rules(c: KernelConfig) -> None:
    """Which kinds and combinations each option works with, and the thread shape every kind shares."""
    if c.early and (c.kind != "simt" or not c.pdl):
        raise ConfigError(
            f"rule 'early': early needs kind 'simt' and pdl (kind={c.kind!r}, pdl={c.pdl}); the mma "
            "kernel always loads its first stages-1 stages before the PDL wait"
        )
    if c.kind != "mma" and c.fetch != 256:
        raise ConfigError(
            f"rule 'fetch': fetch={c.fetch} is an mma option; kind {c.kind!r} keeps the default 256 "
            "(its loads carry no hint, so another value would only duplicate the variant)"
        )
    if c.split != 1 and (c.kind not in ("mma", "wgmma") or c.prefetch):
        raise ConfigError(
            f"rule 'split': split={c.split} needs kind 'mma' or 'wgmma' without prefetch (kind={c.kind!r}, "
            f"prefetch={c.prefetch}): only those kernels reduce across a cluster"
        )
    if c.wgmma_walk:
        if c.split != 1 or not c.static_k or c.static_k // WGMMA_K < c.stages:
            raise ConfigError(
                f"rule 'persist': persist={c.persist} with kind 'wgmma' needs split 1 and a static K of at least "
                f"stages={c.stages} chunks of {WGMMA_K} (split={c.split}, static_k={c.static_k}): the walk keeps every "
                "token of K resident in shared memory and issues the first tile's first stages before the PDL wait"
            )
    elif c.walk:
        if c.prefetch or not c.static_k or c.ring or c.split != 1 or c.token_stages:
            raise ConfigError(
                f"rule 'persist': persist={c.persist} with kind 'mma' needs a static K, no prefetch, ring, split or "
                f"token_stages (static_k={c.static_k}, prefetch={c.prefetch}, ring={c.ring}, split={c.split}, "
                f"token_stages={c.token_stages}): the walk keeps every token of a warp's K range in registers, "
                "indexed statically, and streams the next group's weight from the last trip"
            )
    elif c.persist and (c.kind != "simt" or not c.early or c.prefetch or c.static_k):
        raise ConfigError(
            f"rule 'persist': persist={c.persist} needs kind 'simt' with early, without prefetch and with "
            f"a runtime K (kind={c.kind!r}, early={c.early}, prefetch={c.prefetch}, "
            f"static_k={c.static_k}), or kind 'mma' with a static K: the walk preloads each group's first "
            "trip, the first one before the PDL wait"
        )
    limit, why = M_LIMITS[c.kind]
    if c.m > limit:
        raise ConfigError(f"rule 'm range': m={c.m} exceeds {limit} for kind {c.kind!r} ({why})")
    if c.token_groups != 1 and (c.slices == 1 or c.ring or c.m % c.token_groups or c.m // c.token_groups < 2):
        raise ConfigError(
            f"rule 'token groups': token_groups={c.token_groups} needs slices > 1, no ring and m a multiple of it "
            f"with at least 2 tokens per group (slices={c.slices}, ring={c.ring}, m={c.m}): the groups share "
            "sliced weight fragments held in registers"
        )
    if c.token_stages and (c.kind != "mma" or c.ring or c.token_stages >= c.stages or c.stages % c.token_stages):
        raise ConfigError(
            f"rule 'token stages': token_stages={c.token_stages} needs kind 'mma' without ring and a proper divisor "
            f"of stages={c.stages} (kind={c.kind!r}, ring={c.ring}): a trip's D steps index the token buffers "
            "statically (0 = as many as stages)"
        )
    if c.min_ctas and (
        c.kind != "mma"
        or c.min_ctas < 2
        or not MIN_CTAS_REGISTER_FLOOR <= c.register_cap <= PTXAS_MAX_REGISTERS
        or c.register_rule[0] > c.register_cap
    ):
        raise ConfigError(
            f"rule 'min ctas': min_ctas={c.min_ctas} needs kind 'mma', at least 2 CTAs and a cap of "
            f"{SM_REGISTERS} / (threads x min_ctas) = {c.register_cap} registers between {MIN_CTAS_REGISTER_FLOOR} "
            f"and {PTXAS_MAX_REGISTERS} that holds the register rule's {c.register_rule[0]} (kind={c.kind!r}, "
            f"threads={c.threads}): above the cap ptxas would spill accumulators or loads in flight"
        )
    if c.min_ctas and c.ring and c.min_ctas > c.smem_ctas:
        raise ConfigError(
            f"rule 'min ctas': {c.min_ctas} CTAs of {c.ring_smem} bytes of ring + {c.mma_smem} of reduction "
            f"buffers + {DSL_SMEM_RESERVE} exceed an SM's {SM_SMEM} bytes of shared memory"
        )
    if c.slices != 1 and (c.kind != "mma" or c.split != 1 or c.m // c.token_groups * c.slices > MMA_A_ROWS):
        raise ConfigError(
            f"rule 'slices': slices={c.slices} needs kind 'mma', split 1 and m/token_groups*slices <= {MMA_A_ROWS} "
            f"(kind={c.kind!r}, split={c.split}, m={c.m}, token_groups={c.token_groups}): the A side's "
            f"{MMA_A_ROWS} rows hold every token of a group at every slice"
        )
    if c.tail and c.kind == "wgmma":
        if c.split != 1:
            raise ConfigError(
                f"rule 'tail': tail with kind 'wgmma' needs split 1 (split={c.split}): its tail is N's only, a weight "
                "box past N landing zeros and the stores masked, and a cluster's reduction is written for whole groups"
            )
    elif c.tail and (c.kind not in ("simt", "mma") or c.split != 1 or c.persist or c.static_k):
        raise ConfigError(
            f"rule 'tail': tail needs kind 'simt' or 'mma', split 1, no persist and a runtime K, or kind 'wgmma' with "
            f"split 1 (kind={c.kind!r}, split={c.split}, persist={c.persist}, static_k={c.static_k}): the tail trip "
            "and the column mask are written for one CTA per row group and a K known only at run time"
        )
    if c.ring and (c.kind != "mma" or c.stages < 2):
        raise ConfigError(
            f"rule 'ring': ring needs kind 'mma' and at least 2 stages (kind={c.kind!r}, stages={c.stages}): "
            "it moves the mma pipeline's stages into shared memory"
        )
    if c.bias and c.kind not in ("simt", "mma", "wgmma"):
        raise ConfigError(f"rule 'bias': bias is an epilogue of kinds 'simt', 'mma' and 'wgmma' (kind={c.kind!r})")
    if c.threads % 32 or c.threads > 1024:
        raise ConfigError(f"rule 'whole warps': threads={c.threads} must be a multiple of 32, at most 1024")
    # wgmma's k_threads is its whole CTA (384 with two consumers): _wgmma_rules checks it
    if c.kind != "wgmma" and (c.k_threads & (c.k_threads - 1) or c.threads % c.k_threads):
        raise ConfigError(
            f"rule 'k_threads split': k_threads={c.k_threads} must be a power of two dividing threads={c.threads}"
        )
    if c.vec not in (2, 4, 8):
        raise ConfigError(f"rule 'vector width': vec={c.vec} must be 2, 4 or 8 bf16 (4, 8 or 16 bytes)")


def _simt_rules(c: KernelConfig) -> None:
    if c.stages != 1:
        raise ConfigError(f"rule 'stages': stages={c.stages} must be 1 for kind 'simt' (no pipelined K loop)")
    if c.k_threads > 32 and c.m * c.cols > c.k_threads:
        raise ConfigError(f"rule 'reduction lanes': m*cols={c.m * c.cols} outputs exceed k_threads={c.k_threads}")


def _mma_rules(c: KernelConfig) -> None:
    rows = MMA_ROWS // c.slices
    if c.k_threads < 32 or c.vec != 8 or c.cols % rows:
        raise ConfigError(
            f"rule 'mma tile': k_threads={c.k_threads} must be whole warps, vec={c.vec} must be 8 "
            f"and cols={c.cols} a multiple of {rows} (8 / slices rows per tile)"
        )
    if c.mma_smem + DSL_SMEM_RESERVE > STATIC_SMEM_LIMIT:
        raise ConfigError(
            f"rule 'shared memory': {c.mma_smem} bytes of reduction buffers + {DSL_SMEM_RESERVE} the DSL "
            f"adds exceed {STATIC_SMEM_LIMIT}"
        )
    if c.ring and c.ring_smem + c.mma_smem + DSL_SMEM_RESERVE > DYNAMIC_SMEM_LIMIT:
        raise ConfigError(
            f"rule 'shared memory': {c.ring_smem} bytes of ring + {c.mma_smem} of reduction buffers + "
            f"{DSL_SMEM_RESERVE} the DSL adds exceed {DYNAMIC_SMEM_LIMIT}"
        )


def _bulk_rules(c: KernelConfig) -> None:
    if c.k_threads < 32 or c.vec != 8 or c.cols % MMA_ROWS or c.threads != c.k_threads or c.prefetch:
        raise ConfigError(
            f"rule 'bulk tile': k_threads={c.k_threads} must be whole warps and equal threads={c.threads}, "
            f"vec={c.vec} must be 8, cols={c.cols} a multiple of {MMA_ROWS}, and prefetch off "
            "(the ring's first chunks already go out before the PDL wait)"
        )
    if c.bulk_smem + DSL_SMEM_RESERVE > STATIC_SMEM_LIMIT:
        raise ConfigError(
            f"rule 'shared memory': {c.bulk_smem} bytes of weight ring + {DSL_SMEM_RESERVE} the DSL adds "
            f"exceed {STATIC_SMEM_LIMIT}"
        )


def _wgmma_rules(c: KernelConfig) -> None:
    warpgroups = c.threads // 128
    if (
        c.threads % 128
        or warpgroups not in (2, 3)
        or c.k_threads != c.threads
        or c.cols != WGMMA_ROWS * (warpgroups - 1)
        or c.vec != 8
        or c.unroll != 1
        or c.prefetch
        or bool(c.static_k) != bool(c.persist)
    ):
        raise ConfigError(
            f"rule 'wgmma tile': threads={c.threads} must be 256 or 384 (a producer warpgroup and 1 or 2 "
            f"consumers), k_threads={c.k_threads} equal to it, cols={c.cols} {WGMMA_ROWS} per consumer, vec={c.vec} 8, "
            f"unroll={c.unroll} 1, prefetch off and static_k={c.static_k} set exactly with persist={c.persist} (the "
            "TMA ring runs ahead of the PDL wait; only the walk's resident tokens need K at build time)"
        )
    if c.stages < 2:
        raise ConfigError(f"rule 'stages': stages={c.stages} must be at least 2 for kind 'wgmma' (a ring)")
    if c.wgmma_smem + DSL_SMEM_RESERVE > DYNAMIC_SMEM_LIMIT:
        raise ConfigError(
            f"rule 'shared memory': {c.wgmma_smem} bytes of ring, barriers and reduction + {DSL_SMEM_RESERVE} the DSL "
            f"adds exceed {DYNAMIC_SMEM_LIMIT}"
        )


# The most tokens each kind runs, and why.
M_LIMITS = {
    "simt": (MAX_M_MMA, "tuned and register-ruled up to 16 tokens"),
    "mma": (MAX_M_MMA, "the MMA's A side holds 16 token rows"),
    "bulk": (MAX_M_BULK, "a lane loads one token: A rows 8..15 stay zero"),
    "wgmma": (MAX_M, "the producer warpgroup copies a stage's nt x 8 token chunks in at most 2 turns"),
}

_KIND_RULES = {"simt": _simt_rules, "mma": _mma_rules, "bulk": _bulk_rules, "wgmma": _wgmma_rules}


def _shape_rules(c: KernelConfig, n: int | None, k: int | None) -> None:
    """Whether this config can run (n, k); either may be None (not checked)."""
    if k is not None:
        if c.tail and c.kind != "wgmma":  # wgmma's tail is N's only: K stays whole 64-k chunks
            if k % TAIL_K_GRAIN:
                raise ConfigError(f"rule 'k tail': K={k} is not a multiple of {TAIL_K_GRAIN} (16-byte rows)")
            if k < c.k_step:
                raise ConfigError(
                    f"rule 'k tail': K={k} is below one K step={c.k_step} (the first trip is never masked)"
                )
        elif k % c.k_step:
            raise ConfigError(f"rule 'k divisible': K={k} is not a multiple of the K step={c.k_step}")
        if c.static_k and k != c.static_k:
            raise ConfigError(f"rule 'static k': K={k} differs from the baked-in static_k={c.static_k}")
    if n is not None and n < 1:
        raise ConfigError(f"rule 'n positive': N={n} must be at least 1")
    if n is not None and k is not None and max(n * k, c.m * k, c.m * n) >= 2**31:
        # The kernels index the weight (N*K), the tokens (M*K) and the output (M*N) with 32-bit element offsets.
        raise ConfigError(
            f"rule 'int32 offsets': N*K={n * k}, M*K={c.m * k} and M*N={c.m * n} elements must stay below 2^31"
        )
    if n is not None and not c.tail and n % c.cols_per_cta:
        raise ConfigError(f"rule 'n divisible': N={n} is not a multiple of columns per CTA={c.cols_per_cta}")
