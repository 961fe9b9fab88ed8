"""The config dataclass: one validity check, rules named in errors, a name that every field changes."""

import dataclasses

import pytest

from skinny_gemm.aot import plans
from skinny_gemm.kernels.config import ConfigError, KernelConfig, LaunchShape
from skinny_gemm.runtime.manifest import ARCHS


@pytest.mark.parametrize("arch", ARCHS)
def test_every_plan_entry_is_valid(arch):
    header, entries = plans.load(plans.plan_path(arch))
    assert header["arch"] == arch
    assert entries, "plan table is empty"
    for e in entries:
        e.config.check(n=e.n, k=e.k)
        assert e.config.m == e.m
        assert e.provenance["kind"] in ("measured", "heuristic")


def test_sm121_plan_is_the_pull_request_set():
    _, entries = plans.load(plans.plan_path("sm_121"))
    cells = {(e.n, e.k, e.m) for e in entries}
    assert len(cells) == 20
    assert (4096, 8192, 1) not in cells and (4096, 8192, 2) in cells
    assert all(e.provenance["kind"] == "heuristic" for e in entries), "no GB10 measurement exists"


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        (dict(m=17), "m range"),
        (dict(m=1, threads=100), "whole warps"),
        (dict(m=1, threads=256, k_threads=96), "k_threads split"),
        (dict(m=1, vec=3), "vector width"),
        (dict(m=8, cols=16, unroll=8), "register budget"),
        (dict(m=1, static_k=100), "static k"),
        (dict(m=1, kind="tensor"), "kind"),
        (dict(m=1, kind="mma", k_threads=16, threads=256), "mma tile"),
        (dict(m=1, pdl=1), "flags"),
        (dict(m=0), "positive"),
        (dict(m=1, kind="mma", threads=256, cols=8, early=True), "early"),
        (dict(m=1, pdl=False, early=True), "early"),
        (dict(m=1, kind="mma", threads=256, cols=8, fetch=100), "fetch"),
        (dict(m=1, fetch=128), "fetch"),
        (dict(m=1, kind="bulk", threads=256, k_threads=128, cols=8, prefetch=False), "bulk tile"),
        (dict(m=1, kind="bulk", threads=256, k_threads=256, cols=8, prefetch=True), "bulk tile"),
        (
            dict(m=1, kind="bulk", threads=256, k_threads=256, cols=16, unroll=4, stages=4, prefetch=False),
            "shared memory",
        ),
        (dict(m=1, kind="bulk", threads=256, k_threads=256, cols=8, unroll=1, prefetch=False, fetch=128), "fetch"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, split=3), "split"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=True, split=2), "split"),
        (dict(m=1, threads=256, prefetch=False, split=2), "split"),
        (dict(m=1, threads=256, prefetch=False, early=False, persist=528), "persist"),
        (dict(m=1, threads=256, prefetch=True, early=True, persist=528), "persist"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, persist=528), "persist"),
        (dict(m=1, threads=256, prefetch=False, early=True, persist=-1), "persist"),
        (dict(m=1, threads=256, prefetch=False, early=True, persist=528, static_k=4096), "persist"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, slices=3), "slices"),
        (dict(m=1, threads=256, prefetch=False, slices=2), "slices"),
        # 4 tokens x 8 slices are 32 rows of the A side, which has 16
        (dict(m=4, kind="mma", threads=256, cols=8, prefetch=False, slices=8), "slices"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, split=2, slices=2), "slices"),
        # a tile of 2 slices is 4 rows
        (dict(m=1, kind="mma", threads=128, k_threads=128, cols=6, prefetch=False, slices=2), "mma tile"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, slices=True), "slices"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, slices=2.0), "slices"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, split=2.0), "split"),
        (dict(m=1, kind="mma", threads=256, cols=8, fetch=128.0), "fetch"),
        (dict(m=17, kind="mma", threads=256, cols=8, prefetch=False, slices=2), "m range"),
        # 32 warps x 8 tokens x 32 columns x 2 slices x 4 B = 64 KB of slice partials
        (dict(m=8, kind="mma", threads=1024, k_threads=1024, cols=32, prefetch=False, slices=2), "shared memory"),
        # 16 rows are 8 tiles of 2: 4 x 8 + 8 stages x (4 x 8 weight + 4 x 2 token words) = 352 registers
        (
            dict(m=4, kind="mma", threads=128, k_threads=128, cols=16, unroll=1, stages=8, prefetch=False, slices=4),
            "register budget",
        ),
        # 8 groups x 4 tiles x 2 values x 32 lanes x 4 B = 8 KB per slot, 7 slots sent to CTA 0
        (dict(m=1, kind="mma", threads=256, k_threads=32, cols=32, unroll=1, prefetch=False, split=8), "shared memory"),
        # the walk's stash of the next trip pushes cols=16, unroll=2 over the register budget
        (
            dict(m=1, threads=256, k_threads=256, cols=16, unroll=2, prefetch=False, early=True, persist=528),
            "register budget",
        ),
        # 4 + 16 stages x 8 = 132 registers fit one thread's budget, not a 512-thread CTA's share
        # of the SM (ptxas capped it at 128 and spilled to a 112-byte stack); 256 threads fit
        (
            dict(m=4, kind="mma", threads=512, k_threads=128, cols=8, unroll=1, stages=16, prefetch=False),
            "register budget",
        ),
    ],
)
def test_invalid_config_names_the_rule(kwargs, rule):
    with pytest.raises(ConfigError, match=f"rule '{rule}'"):
        KernelConfig(**kwargs).check()


def test_register_budget_shrinks_with_the_cta():
    KernelConfig(m=4, kind="mma", threads=256, k_threads=128, cols=8, unroll=1, stages=16, prefetch=False).check()


def test_shape_rules_name_the_rule():
    cfg = KernelConfig(m=1, threads=256, k_threads=256, cols=4, unroll=2)
    with pytest.raises(ConfigError, match="rule 'n divisible'"):
        cfg.check(n=4102, k=4096)
    with pytest.raises(ConfigError, match="rule 'k divisible'"):
        cfg.check(n=4096, k=4000)
    with pytest.raises(ConfigError, match="rule 'n positive'"):
        cfg.check(n=0, k=4096)
    with pytest.raises(ConfigError, match="rule 'int32 offsets'"):
        cfg.check(n=1 << 20, k=4096)
    split = KernelConfig(
        m=1, kind="mma", threads=256, k_threads=256, cols=8, unroll=1, stages=4, prefetch=False, split=4
    )
    split.check(n=4096, k=4096)
    with pytest.raises(ConfigError, match="rule 'k divisible'"):
        split.check(n=4096, k=2048)  # 4 CTAs x 8 warps x 4 stages x 32 k = 4096
    assert split.grid(4096) == 4096 // 8 * 4
    walk = KernelConfig(m=1, threads=256, k_threads=256, cols=1, unroll=2, prefetch=False, early=True, persist=792)
    assert (walk.grid(6416), walk.grid(160)) == (792, 160), "persist caps the grid, never raises it"
    static = dataclasses.replace(cfg, static_k=4096)
    with pytest.raises(ConfigError, match="rule 'static k'"):
        static.check(n=4096, k=8192)


def test_launch_shape_is_the_config_s():
    """KernelConfig.launch is the one launch shape: the grid of grid(n), one block of threads, split-CTA clusters,
    no dynamic shared memory, the config's PDL; the JIT launcher's (persist=False) grid is uncapped."""
    split = KernelConfig(
        m=1, kind="mma", threads=256, k_threads=256, cols=8, unroll=1, stages=4, prefetch=False, split=4
    )
    assert split.launch(4096) == LaunchShape(grid=split.grid(4096), block=(256, 1, 1), cluster=4, smem=0, pdl=True)
    assert split.launch().grid is None and split.launch() == dataclasses.replace(split.launch(4096), grid=None)
    walk = KernelConfig(m=1, threads=128, k_threads=128, cols=1, unroll=2, prefetch=False, early=True, persist=792)
    assert (walk.launch(6416).grid, walk.launch(6416, persist=False).grid) == (792, 6416)
    assert walk.launch(6416).block == (128, 1, 1) and walk.launch(6416).cluster == 1
    tail = KernelConfig(m=1, threads=256, k_threads=64, cols=2, tail=True)
    assert tail.launch(4097).grid == tail.launch(4097, persist=False).grid == -(-4097 // tail.cols_per_cta)


def _variants(cfg):
    """One changed value per field, each still a valid config."""
    changes = {
        "m": 2,
        "kind": "mma",
        "threads": 512,
        "k_threads": 128,
        "cols": 32,
        "vec": 4,
        "unroll": 4,
        "static_k": 4096,
        "pdl": not cfg.pdl,
        "prefetch": not cfg.prefetch,
        "stages": 2,
        "early": not cfg.early,
        "fetch": 128,
        "split": 2,
        "persist": 528,
        "slices": 2,
        "bias": True,
        "tail": True,
        "ring": True,
        "token_groups": 2,
        "token_stages": 1,
        "min_ctas": 2,
    }
    assert set(changes) == {f.name for f in dataclasses.fields(KernelConfig)}, "a new field needs a case here"
    return changes


def test_every_field_changes_name_and_symbol():
    base = KernelConfig(m=1, kind="simt", threads=256, k_threads=256, cols=16, vec=8, unroll=2)
    for field, value in _variants(base).items():
        other = dataclasses.replace(base, **{field: value})
        assert other.name != base.name, field
        assert other.symbol != base.symbol, field


def test_slices_shape_the_tile():
    """A sliced tile is 8 / slices rows: one row per CTA at 8 slices, a K step of 32 k per slice and warp."""
    one_row = KernelConfig(
        m=2, kind="mma", threads=128, k_threads=128, cols=1, unroll=1, stages=4, prefetch=False, slices=8
    )
    one_row.check(n=6416, k=4096)
    assert (one_row.cols_per_cta, one_row.grid(6416), one_row.mma_tiles) == (1, 6416, 1)
    assert one_row.k_step == 4 * 32 * 4 * 8 and one_row.token_loads == 2  # A rows 8..15 hold token 1
    assert KernelConfig(m=1, kind="mma", threads=128, k_threads=128, cols=1, slices=8).token_loads == 1
    with pytest.raises(ConfigError, match="rule 'k divisible'"):
        one_row.check(n=6416, k=2048)


def test_sliced_outputs_take_turns_over_the_group():
    """More outputs than a group's threads (M x cols > k_threads) are valid: each thread sums ceil(M x cols /
    k_threads) of them in the sliced epilogue, so a CTA can hold more rows per token read."""
    wide = KernelConfig(
        m=8, kind="mma", threads=128, k_threads=128, cols=32, unroll=1, stages=2, prefetch=False, slices=2
    )
    wide.check(n=28672, k=4096)
    assert (wide.m * wide.cols, wide.outputs_per_thread, wide.mma_tiles) == (256, 2, 8)
    assert KernelConfig(m=8, kind="mma", threads=256, cols=16, prefetch=False, slices=2).outputs_per_thread == 1
    # 4 tokens x 20 columns = 80 outputs over 32 threads: 3 turns, the last one partly idle
    odd = KernelConfig(m=4, kind="mma", threads=32, k_threads=32, cols=20, prefetch=False, slices=2)
    odd.check(n=4000, k=4096)
    assert odd.outputs_per_thread == 3


def test_json_round_trip_and_unknown_fields():
    cfg = KernelConfig(m=3, kind="mma", threads=128, k_threads=64, cols=16, unroll=4)
    assert KernelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="unknown config fields"):
        KernelConfig.from_json({**cfg.to_json(), "colour": 1})


MMA = {"kind": "mma", "vec": 8, "unroll": 1, "stages": 4, "prefetch": False}


@pytest.mark.parametrize("m", range(1, 17))
def test_m_up_to_16_for_simt_and_mma(m):
    KernelConfig(m=m, threads=256, k_threads=256, cols=1, unroll=2).check(n=4096, k=4096)
    mma = KernelConfig(m=m, threads=256, k_threads=256, cols=8, **MMA)
    mma.check(n=4096, k=4096)
    assert mma.token_loads == (2 if m > 8 else 1)
    if m <= 8:
        KernelConfig(m=m, kind="bulk", threads=256, k_threads=256, cols=8, unroll=1, stages=4, prefetch=False).check()


WGMMA = {"kind": "wgmma", "threads": 256, "k_threads": 256, "cols": 64, "unroll": 1, "stages": 4, "prefetch": False}


@pytest.mark.parametrize("m, nt", [(1, 8), (8, 8), (9, 16), (16, 16), (17, 24), (24, 24), (25, 32), (32, 32)])
def test_wgmma_runs_up_to_32_tokens_with_n_the_next_multiple_of_8(m, nt):
    """vLLM pads a decode batch past 16 to 24 or 32 (its graph sizes): only kind "wgmma" runs there, its MMA's N
    (the token box, the accumulators, the stage's bytes) the token count rounded up to 8."""
    cfg = KernelConfig(m=m, **WGMMA)
    cfg.check(n=4096, k=4096)
    assert cfg.nt == nt and cfg.wgmma_stage == (64 + nt) * 128


@pytest.mark.parametrize(
    "kwargs, limit",
    [
        (WGMMA, 32),
        ({"kind": "mma", "threads": 256, "cols": 8, "prefetch": False}, 16),
        ({"threads": 256, "k_threads": 256, "cols": 1}, 16),  # simt
        ({"kind": "bulk", "threads": 256, "k_threads": 256, "cols": 8, "prefetch": False}, 8),
    ],
)
def test_each_kind_refuses_one_token_past_its_limit_naming_the_kind(kwargs, limit):
    KernelConfig(m=limit, **kwargs).check()
    with pytest.raises(
        ConfigError, match=f"rule 'm range': m={limit + 1} exceeds {limit} for kind '{kwargs.get('kind', 'simt')}'"
    ):
        KernelConfig(m=limit + 1, **kwargs).check()


WALK = {**WGMMA, "m": 16, "static_k": 4096, "persist": 132}


def test_the_wgmma_walk_keeps_every_token_of_k_resident_beside_a_weight_only_ring():
    walk = KernelConfig(**WALK)
    walk.check(n=28672, k=4096)
    plain = KernelConfig(**{**WALK, "static_k": 0, "persist": 0})
    assert walk.wgmma_stage == 64 * 128 and plain.wgmma_stage == (64 + 16) * 128
    assert walk.wgmma_tokens == 4096 * 16 * 2 and plain.wgmma_tokens == 0
    assert walk.wgmma_smem - plain.wgmma_smem == walk.wgmma_tokens - 4 * 16 * 128
    assert walk.launch(28672).grid == 132 and walk.launch(6144).grid == 96  # at most one CTA per row group
    assert walk.name.endswith("_k4096_pdl_s4_p132")


@pytest.mark.parametrize("m", [4, 8, 16, 24, 32])
def test_every_wgmma_candidates_regions_are_ordered_aligned_and_inside_its_launch(m):
    """The ring's stages, the walk's tokens (on a 1024-byte swizzle atom), the barriers (8-byte aligned) and the
    cluster's reduction slots follow each other without overlap, and the launch reserves all of them."""
    from skinny_gemm.aot.candidates import space_candidates

    found = [
        c
        for space in ("wgmma", "wgmma-walk")
        for n, k in ((28672, 4096), (4096, 1024))
        for c in space_candidates(space, n, k, m)
    ]
    assert any(c.wgmma_walk for c in found) or m > 24
    for c in found:
        lay = c.wgmma_layout
        assert lay.tokens == c.stages * c.wgmma_stage and lay.tokens % 1024 == 0, c.name
        assert lay.barriers == lay.tokens + c.wgmma_tokens and lay.barriers % 8 == 0, c.name
        assert lay.reduction == lay.barriers + 16 * c.stages <= lay.end, c.name
        assert c.launch().smem == lay.end + 1024, c.name


def test_the_wgmma_tail_is_n_only():
    """Kind "wgmma" with ``tail`` serves any N (plain or walk) and still only whole 64-k chunks, split 1 only."""
    KernelConfig(**{**WGMMA, "m": 16, "tail": True}).check(n=3336, k=4096)
    KernelConfig(**{**WALK, "tail": True}).check(n=19360, k=4096)
    for kwargs, n, k, rule in (
        ({**WGMMA, "m": 16, "tail": True}, 3336, 4104, "k divisible"),
        ({**WGMMA, "m": 16, "tail": True, "split": 2}, 3336, 4096, "tail"),
        ({**WGMMA, "m": 16}, 3336, 4096, "n divisible"),
    ):
        with pytest.raises(ConfigError, match=f"rule '{rule}'"):
            KernelConfig(**kwargs).check(n=n, k=k)


def test_the_wgmma_walks_no_pdl_twin_stays_a_walk():
    """The decode phase's no-PDL twin of a wgmma walk keeps ``persist``: a static K without it is no config."""
    from skinny_gemm.aot.decode_phase import twin

    t = twin(KernelConfig(**WALK))
    t.check(n=28672, k=4096)
    assert (t.pdl, t.persist, t.static_k) == (False, 132, 4096)


def test_the_wgmma_walks_k_is_bounded_by_shared_memory_not_by_the_unrolled_trip_cap():
    """Its chunk loop stays a loop: 192 chunks of K at 8 tokens pass where an unrolled kernel stops at 64 trips."""
    KernelConfig(**{**WALK, "m": 8, "static_k": 12288}).check(n=28672, k=12288)
    with pytest.raises(ConfigError, match="rule 'static k'"):
        KernelConfig(m=8, kind="mma", threads=256, cols=8, prefetch=False, static_k=65 * 256).check()


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        ({**WALK, "static_k": 0}, "persist"),  # the resident tokens are sized by K
        ({**WALK, "persist": 0}, "wgmma tile"),  # a static K without the walk
        ({**WALK, "split": 2}, "persist"),
        ({**WALK, "static_k": 192}, "persist"),  # 3 chunks under 4 stages
        ({**WALK, "static_k": 8192}, "shared memory"),  # 256 KB of tokens
        ({**WALK, "m": 32, "static_k": 4096}, "shared memory"),  # 256 KB of tokens at N = 32
    ],
)
def test_the_wgmma_walk_names_its_rule(kwargs, rule):
    with pytest.raises(ConfigError, match=f"rule '{rule}'"):
        KernelConfig(**kwargs).check()


def test_m_above_8_doubles_the_unsliced_reduction_buffers():
    """Past 8 tokens the accumulators' c2, c3 (A rows 8..15) are real outputs: the K-split warps share twice as much."""
    m8, m16 = (KernelConfig(m=m, threads=256, k_threads=256, cols=8, **MMA) for m in (8, 16))
    assert m16.mma_smem == 2 * m8.mma_smem
    assert m16.register_rule[0] == m8.register_rule[0] + 4 * m8.stages * m8.unroll


@pytest.mark.parametrize(
    "kwargs, rule",
    [
        ({"m": 9, "kind": "bulk", "threads": 256, "k_threads": 256, "cols": 8, "prefetch": False}, "m range"),
        ({"m": 1, "bias": 1}, "flags"),
        ({"m": 1, "tail": "yes"}, "flags"),
        (
            {"m": 1, "kind": "bulk", "threads": 256, "k_threads": 256, "cols": 8, "prefetch": False, "bias": True},
            "bias",
        ),
        (
            {"m": 1, "kind": "bulk", "threads": 256, "k_threads": 256, "cols": 8, "prefetch": False, "tail": True},
            "tail",
        ),
        ({"m": 1, "threads": 256, "cols": 8, "split": 2, "tail": True, **MMA}, "tail"),
        ({"m": 1, "prefetch": False, "early": True, "persist": 528, "tail": True}, "tail"),
        ({"m": 1, "static_k": 4096, "tail": True}, "tail"),
        ({"m": 1, "static_k": -4096}, "static k"),
        ({"m": 1, "static_k": 4096.0}, "static k"),
        # 16 tokens x 2 columns: 32 + 2 x 18 x 4 = 176 registers
        ({"m": 16, "threads": 256, "k_threads": 256, "cols": 2, "unroll": 2}, "register budget"),
        ({"m": 16, "threads": 256, "cols": 8, "slices": 2, **MMA}, "slices"),
        ({"m": 1, "ring": 1}, "flags"),
        ({"m": 1, "ring": True}, "ring"),  # simt
        (
            {
                "m": 1,
                "kind": "wgmma",
                "threads": 256,
                "k_threads": 256,
                "cols": 64,
                "unroll": 1,
                "stages": 4,
                "prefetch": False,
                "ring": True,
            },
            "ring",
        ),
        ({**MMA, "m": 16, "threads": 128, "k_threads": 128, "cols": 8, "stages": 1, "ring": True}, "ring"),
        # 8 warps x 24 stages x (8 tiles + 2 token loads) x 512 B = 960 KB of ring
        ({**MMA, "m": 16, "threads": 256, "cols": 64, "stages": 24, "ring": True}, "shared memory"),
        ({"m": 16, "threads": 256, "cols": 8, "token_groups": 2, **MMA}, "token groups"),  # unsliced
        ({"m": 6, "threads": 256, "cols": 4, "slices": 2, "token_groups": 4, **MMA}, "token groups"),  # 6 % 4
        ({"m": 16, "threads": 256, "cols": 4, "slices": 4, "token_groups": 2, **MMA}, "slices"),  # 8 x 4 rows
        ({"m": 16, "threads": 256, "cols": 4, "slices": 2, "token_groups": 3, **MMA}, "token groups"),
        ({"m": 1, "threads": 256, "k_threads": 64, "cols": 4, "min_ctas": 2}, "min ctas"),  # simt
        ({"m": 16, "threads": 256, "cols": 8, "min_ctas": 1, **MMA}, "min ctas"),  # a bound of one CTA is none
        (
            {"m": 16, "threads": 512, "k_threads": 256, "cols": 8, "min_ctas": 4, **MMA},
            "min ctas",
        ),  # 2048 threads: 32 registers, under the floor
        ({"m": 16, "threads": 256, "cols": 8, "min_ctas": 3, **MMA}, "min ctas"),  # 85 -> 80 registers
        ({"m": 8, "threads": 64, "cols": 8, "slices": 2, "min_ctas": 2, **MMA}, "min ctas"),  # 512: bounds nothing
        # the register rule's 160 (accumulators and loads in flight) over the bound's 128
        ({"m": 16, "threads": 256, "cols": 16, "slices": 2, "token_groups": 2, "min_ctas": 2, **MMA}, "min ctas"),
        # 2 x (192 KB of ring + its reduction buffers) over the SM's 228 KB
        (
            {**MMA, "m": 16, "threads": 256, "k_threads": 128, "cols": 32, "stages": 8, "ring": True, "min_ctas": 2},
            "min ctas",
        ),
    ],
)
def test_new_fields_name_their_rule(kwargs, rule):
    with pytest.raises(ConfigError, match=f"rule '{rule}'"):
        KernelConfig(**kwargs).check()


TAIL_SHAPES = [(4096, 3696), (8192, 7392), (5120, 2880), (50272, 2880), (25136, 2880), (32776, 5376)]


@pytest.mark.parametrize("n, k", TAIL_SHAPES)
def test_tail_configs_serve_the_shapes_plain_ones_refuse(n, k):
    simt = KernelConfig(m=4, threads=256, k_threads=64, cols=4, unroll=2)
    mma = KernelConfig(m=16, threads=256, k_threads=128, cols=16, **MMA)
    for cfg in (simt, mma):
        with pytest.raises(ConfigError, match="rule '(k|n) divisible'"):
            cfg.check(n=n, k=k)
        tail = dataclasses.replace(cfg, tail=True)
        tail.check(n=n, k=k)
        dataclasses.replace(tail, bias=True).check(n=n, k=k)
        assert tail.grid(n) == -(-n // tail.cols_per_cta)


def test_tail_shape_rules_name_the_rule():
    tail = KernelConfig(m=1, threads=256, k_threads=256, cols=4, unroll=2, tail=True)
    tail.check(n=7, k=4104)
    with pytest.raises(ConfigError, match="rule 'k tail'"):
        tail.check(n=4096, k=4100)  # not 16-byte rows
    with pytest.raises(ConfigError, match="rule 'k tail'"):
        tail.check(n=4096, k=2048)  # below one step of 256 x 8 x 2
    with pytest.raises(ConfigError, match="rule 'n positive'"):
        tail.check(n=0, k=4096)
    with pytest.raises(ConfigError, match="rule 'int32 offsets'"):
        tail.check(n=1 << 19, k=4096)
    assert (tail.grid(4096), tail.grid(4097)) == (1024, 1025)


def test_int32_offsets_cover_tokens_and_output_at_m16():
    """At M=16 the tokens (M*K) and the output (M*N) pass 2^31 before the weight (N*K) does."""
    cfg = KernelConfig(
        m=16, kind="simt", threads=32, k_threads=1, cols=1, vec=2, unroll=1, pdl=False, prefetch=False, tail=True
    )
    cfg.check(n=8, k=1 << 26)  # N*K, M*K, M*N all below 2^31
    with pytest.raises(ConfigError, match=r"rule 'int32 offsets'.*M\*K=2147483648"):
        cfg.check(n=1, k=1 << 27)  # N*K 2^27 fits, M*K = 2^31 does not
    with pytest.raises(ConfigError, match=r"rule 'int32 offsets'.*M\*N=2147483648"):
        cfg.check(n=1 << 27, k=8)


def test_bias_and_tail_change_nothing_when_off():
    """Configs written before the fields existed keep their names (and so their cubins' symbols)."""
    cfg = KernelConfig(m=2, kind="mma", threads=256, k_threads=256, cols=8, unroll=1, stages=4, prefetch=False)
    assert cfg.name == "mma_m2_t256_kt256_c8_v8_u1_kdyn_pdl_s4"
    assert KernelConfig.from_json({k: v for k, v in cfg.to_json().items() if k not in ("bias", "tail")}) == cfg


REQUIRED = [*TAIL_SHAPES, (4096, 4096), (6416, 4096), (38720, 4096), (2048, 1536)]


@pytest.mark.parametrize("n, k", REQUIRED)
@pytest.mark.parametrize("bias", [False, True])
def test_heuristic_serves_the_issue_shapes_at_every_first_class_m(n, k, bias):
    for m in (1, 2, 3, 4, 8, 16):
        cfg = plans.heuristic_config(n, k, m, bias=bias)
        cfg.check(n=n, k=k)
        assert (cfg.m, cfg.bias) == (m, bias)
        assert cfg.tail == bool(k % cfg.k_step or n % cfg.cols_per_cta), "a tail only where the shape needs it"


@pytest.mark.parametrize(
    "n, k, m, rule",
    [
        (4096, 4100, 1, "k tail"),
        (4096, 4096, 17, "m range"),
        (0, 4096, 1, "positive"),
        (4096, 4096, 0, "positive"),
        (1 << 20, 4096, 1, "int32 offsets"),
        (4096, 4096.0, 1, "positive"),
    ],
)
def test_heuristic_refuses_with_plan_error_naming_the_rule(n, k, m, rule):
    with pytest.raises(plans.PlanError, match=f"rule '{rule}'"):
        plans.heuristic_config(n, k, m)


def test_heuristic_never_raises_another_error_on_small_or_odd_shapes():
    for n in (1, 3, 8, 100, 4097):
        for k in (8, 64, 200, 456, 1000, 2056):
            for m in (1, 5, 16):
                try:
                    plans.heuristic_config(n, k, m).check(n=n, k=k)
                except plans.PlanError as exc:
                    assert "rule '" in str(exc)


def test_heuristic_keeps_the_committed_sm121_table():
    """The seed rule is unchanged: it re-derives every config of kernels/plans/sm_121.json."""
    _, entries = plans.load(plans.plan_path("sm_121"))
    for e in entries:
        assert plans.heuristic_config(e.n, e.k, e.m) == e.config, (e.n, e.k, e.m)
        assert plans.heuristic_rule(e.config) == e.provenance["rule"]


def test_json_leaves_new_fields_out_when_off():
    """Plan tables and manifests written before bias, tail and ring existed stay byte-identical."""
    cfg = KernelConfig(m=1)
    assert not {"bias", "tail", "ring"} & set(cfg.to_json())
    on = dataclasses.replace(cfg, bias=True, tail=True, ring=True)
    assert on.to_json()["bias"] is True and on.to_json()["tail"] is True and on.to_json()["ring"] is True
    assert KernelConfig.from_json(on.to_json()) == on and KernelConfig.from_json(cfg.to_json()) == cfg


def test_ring_moves_the_stages_into_dynamic_shared_memory():
    """ring: one 16-byte slot per lane, stage, step and operand (tiles + token loads), launched as dynamic shared
    memory; the registers hold one step's operands whatever the depth, so deep rings pass the register budget."""
    base = dict(kind="mma", threads=128, k_threads=128, vec=8, unroll=1, prefetch=False, fetch=128)
    ring = KernelConfig(m=16, cols=32, stages=16, ring=True, **base)
    ring.check(n=4096, k=14336)
    assert ring.name.endswith("_f128_r") and ring.symbol.endswith("_r_0")
    assert ring.ring_smem == 4 * 16 * (4 + 2) * 32 * 16 == 196608
    assert ring.launch(4096).smem == ring.ring_smem and ring.launch(4096).grid == 128
    assert ring.register_rule[0] == 4 * 4 + (4 * 4 + 4 * 2)
    m8 = dataclasses.replace(ring, m=8)
    assert m8.ring_smem == 4 * 16 * (4 + 1) * 32 * 16  # one token load per step below 9 tokens
    registers = dataclasses.replace(ring, ring=False)
    assert registers.ring_smem == 0 and registers.launch(4096).smem == 0
    with pytest.raises(ConfigError, match="rule 'register budget'"):
        registers.check()  # the same depth in registers: 16 + 16 x 24 words
    # the dynamic ring and the static reduction buffers share the 227 KB a CTA may take
    split = KernelConfig(m=16, cols=64, stages=8, split=2, ring=True, **base)
    split.check(n=4096, k=4096)
    assert split.ring_smem + split.mma_smem + 1024 <= 227 * 1024
    with pytest.raises(ConfigError, match="rule 'shared memory'"):
        dataclasses.replace(split, stages=12).check()


def test_token_groups_put_16_tokens_on_sliced_tiles():
    """m / token_groups tokens x slices fill the A side; each group loads its own tokens and holds its accumulators."""
    cfg = KernelConfig(
        m=16,
        kind="mma",
        threads=256,
        k_threads=256,
        cols=8,
        unroll=1,
        stages=2,
        prefetch=False,
        slices=2,
        token_groups=2,
    )
    cfg.check(n=38720, k=4096)
    assert (cfg.mma_tiles, cfg.token_loads, cfg.name.endswith("_sl2_tg2")) == (2, 2, True)
    one = KernelConfig(
        m=8, kind="mma", threads=256, k_threads=256, cols=8, unroll=1, stages=2, prefetch=False, slices=2
    )
    # twice the accumulators and token words of the one-group tile, the same weight words
    assert cfg.register_rule[0] == one.register_rule[0] + 4 * 2 + 2 * 4 * 2
    assert "token_groups" not in one.to_json() and cfg.to_json()["token_groups"] == 2


def test_min_ctas_caps_registers_per_thread():
    """A launch bound of min_ctas CTAs leaves 65536 / (threads x min_ctas) registers, in ptxas's steps of 8; the
    field stays out of the JSON and the name when off, so earlier plans and cubins keep theirs."""
    from helpers import new_paths

    capped = next(cfg for *_, cfg in new_paths.cases() if cfg.min_ctas == 2)
    twin = dataclasses.replace(capped, min_ctas=0)
    capped.check(n=28672, k=4096)
    assert (twin.register_cap, capped.register_cap) == (None, 128)
    assert dataclasses.replace(twin, threads=128, k_threads=128, cols=8, min_ctas=5).register_cap == 96
    assert capped.name == twin.name + "_mc2" and "min_ctas" not in twin.to_json()
    assert KernelConfig.from_json(capped.to_json()) == capped
