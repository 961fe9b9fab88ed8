"""The config dataclass: one validity check, rules named in errors, a name that every field changes."""

import dataclasses

import pytest

from skinny_gemm.aot import plans
from skinny_gemm.kernels.config import ConfigError, KernelConfig


@pytest.mark.parametrize("arch", ["sm_90a", "sm_121"])
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
        (dict(m=1, kind="bulk", threads=256, k_threads=256, cols=16, unroll=4, stages=4, prefetch=False), "shared memory"),
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
        # 4 tokens x 16 columns = 64 outputs, each summed by one of the group's 32 threads
        (dict(m=4, kind="mma", threads=32, k_threads=32, cols=16, prefetch=False, slices=2), "reduction lanes"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, slices=True), "slices"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, slices=2.0), "slices"),
        (dict(m=1, kind="mma", threads=256, cols=8, prefetch=False, split=2.0), "split"),
        (dict(m=1, kind="mma", threads=256, cols=8, fetch=128.0), "fetch"),
        (dict(m=17, kind="mma", threads=256, cols=8, prefetch=False, slices=2), "m range"),
        # 32 warps x 8 tokens x 32 columns x 2 slices x 4 B = 64 KB of slice partials
        (dict(m=8, kind="mma", threads=1024, k_threads=1024, cols=32, prefetch=False, slices=2), "shared memory"),
        # 16 rows are 8 tiles of 2: 4 x 8 + 8 stages x (4 x 8 weight + 4 x 2 token words) = 352 registers
        (dict(m=4, kind="mma", threads=128, k_threads=128, cols=16, unroll=1, stages=8, prefetch=False, slices=4),
         "register budget"),
        # 8 groups x 4 tiles x 2 values x 32 lanes x 4 B = 8 KB per slot, 7 slots sent to CTA 0
        (dict(m=1, kind="mma", threads=256, k_threads=32, cols=32, unroll=1, prefetch=False, split=8), "shared memory"),
        # the walk's stash of the next trip pushes cols=16, unroll=2 over the register budget
        (dict(m=1, threads=256, k_threads=256, cols=16, unroll=2, prefetch=False, early=True, persist=528),
         "register budget"),
        # 4 + 16 stages x 8 = 132 registers fit one thread's budget, not a 512-thread CTA's share
        # of the SM (ptxas capped it at 128 and spilled, perf.md v9); 256 threads fit
        (dict(m=4, kind="mma", threads=512, k_threads=128, cols=8, unroll=1, stages=16, prefetch=False),
         "register budget"),
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
    split = KernelConfig(m=1, kind="mma", threads=256, k_threads=256, cols=8, unroll=1, stages=4, prefetch=False, split=4)
    split.check(n=4096, k=4096)
    with pytest.raises(ConfigError, match="rule 'k divisible'"):
        split.check(n=4096, k=2048)  # 4 CTAs x 8 warps x 4 stages x 32 k = 4096
    assert split.grid(4096) == 4096 // 8 * 4
    walk = KernelConfig(m=1, threads=256, k_threads=256, cols=1, unroll=2, prefetch=False, early=True, persist=792)
    assert (walk.grid(6416), walk.grid(160)) == (792, 160), "persist caps the grid, never raises it"
    static = dataclasses.replace(cfg, static_k=4096)
    with pytest.raises(ConfigError, match="rule 'static k'"):
        static.check(n=4096, k=8192)


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
    one_row = KernelConfig(m=2, kind="mma", threads=128, k_threads=128, cols=1, unroll=1, stages=4, prefetch=False,
                           slices=8)
    one_row.check(n=6416, k=4096)
    assert (one_row.cols_per_cta, one_row.grid(6416), one_row.mma_tiles) == (1, 6416, 1)
    assert one_row.k_step == 4 * 32 * 4 * 8 and one_row.token_loads == 2  # A rows 8..15 hold token 1
    assert KernelConfig(m=1, kind="mma", threads=128, k_threads=128, cols=1, slices=8).token_loads == 1
    with pytest.raises(ConfigError, match="rule 'k divisible'"):
        one_row.check(n=6416, k=2048)


def test_json_round_trip_and_unknown_fields():
    cfg = KernelConfig(m=3, kind="mma", threads=128, k_threads=64, cols=16, unroll=4)
    assert KernelConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(ConfigError, match="unknown config fields"):
        KernelConfig.from_json({**cfg.to_json(), "colour": 1})
