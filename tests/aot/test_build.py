"""The build: entries collapse into variants, cubins match their arch, manifest last, reproducible, cached."""

import dataclasses
import hashlib
import json
import os
import zipfile
from pathlib import Path

import pytest
from helpers.artifacts import arch_wheels

from skinny_gemm.aot import build, plans
from skinny_gemm.runtime import elf
from skinny_gemm.runtime.manifest import ARCHS, PARAMS, parse


def test_build_collapses_entries_into_variants(built):
    for arch in ARCHS:
        result = built["results"][arch]
        _, entries = plans.load(plans.plan_path(arch))
        assert result.entries == len(entries)
        assert result.variants == len({e.config for e in entries})
        assert result.compiled == result.variants and result.cached == 0


def test_manifest_matches_plan_and_cubins(built):
    for arch in ARCHS:
        man = parse(built["root"] / arch / "manifest.json", expected_arch=arch)
        _, entries = plans.load(plans.plan_path(arch))
        assert set(man.plans) == {(e.n, e.k, e.m) for e in entries}
        for variant in man.variants.values():
            info = elf.inspect((man.directory / variant.file).read_bytes())
            assert info.arch == arch
            kernel = info.kernels[variant.symbol]
            assert kernel.params == [(i, off, size) for i, (_, off, size) in enumerate(PARAMS)]
            assert tuple(kernel.reqntid) == variant.block


def test_sm121_cubins_match_their_sm90a_twins(built, tmp_path):
    """No GB10 here: each sm_121 variant is compiled for sm_90a too; symbols and params must be identical."""
    m121 = parse(built["root"] / "sm_121" / "manifest.json")
    configs = [v.config for v in m121.variants.values()]
    plan = built["root"] / "sm_121" / "manifest.json"
    build.build_configs("sm_90a", configs, [], tmp_path / "twins", plan, cache_dir=built["cache"], progress=False)
    assert configs
    for variant in m121.variants.values():
        b = elf.inspect((m121.directory / variant.file).read_bytes())
        a = elf.inspect((tmp_path / "twins" / variant.file).read_bytes())
        assert (a.arch, b.arch) == ("sm_90a", "sm_121")
        assert a.kernels.keys() == b.kernels.keys() == {variant.symbol}
        assert a.kernels[variant.symbol].params == b.kernels[variant.symbol].params
        assert a.kernels[variant.symbol].reqntid == b.kernels[variant.symbol].reqntid


def _wheel_artifacts(wheel: Path, arch: str, dest: Path) -> Path:
    """The files of ``skinny_gemm/artifacts/<arch>/`` in ``wheel``, unpacked into ``dest``."""
    prefix = f"skinny_gemm/artifacts/{arch}/"
    dest.mkdir(parents=True)
    with zipfile.ZipFile(wheel) as whl:
        for name in whl.namelist():
            if name.startswith(prefix) and not name.endswith("/"):
                (dest / name[len(prefix) :]).write_bytes(whl.read(name))
    return dest


def test_second_clean_build_is_byte_identical(built, tmp_path):
    """Another build of this tree gives the session's clean build byte for byte, every cubin and the manifest.

    Where CI points $SKINNY_WHEELS at the wheels it built (.ci/run), the other build is theirs: the README's
    `pip wheel`, in pip's isolated build environment and another process, with the machine's compile cache
    (~/.cache/skinny-gemm) instead of the session build's empty one, so their cubins were compiled by that build
    or by an earlier one of the same sources and toolchain: a separate compile either way. Without it, a second
    clean build here.
    """
    given = os.environ.get("SKINNY_WHEELS")
    for arch in ARCHS:
        first = built["root"] / arch
        if given:
            (wheel,) = arch_wheels(Path(given), arch)
            second = _wheel_artifacts(wheel, arch, tmp_path / "wheel" / arch)
        else:
            build.build(arch, tmp_path / "again", cache_dir=tmp_path / "fresh-cache", jobs=2, progress=False)
            second = tmp_path / "again" / arch
        assert sorted(p.name for p in first.iterdir()) == sorted(p.name for p in second.iterdir())
        for path in first.iterdir():
            assert path.read_bytes() == (second / path.name).read_bytes(), path.name


def test_cached_rebuild_compiles_nothing(built, tmp_path):
    result = build.build("sm_90a", tmp_path, cache_dir=built["cache"], jobs=2, progress=False)
    assert result.compiled == 0 and result.cached == result.variants


def test_manifest_is_sorted_stable_json(built):
    path = built["root"] / "sm_90a" / "manifest.json"
    text = path.read_text()
    assert text == json.dumps(json.loads(text), indent=1, sort_keys=True) + "\n"
    raw = json.loads(text)
    assert [p for p in raw["plans"]] == sorted(raw["plans"], key=lambda p: (p["n"], p["k"], p["m"]))
    assert raw["toolchain"]["cutlass_dsl"] == "4.8.1"


@pytest.mark.parametrize(
    "kind, split, slices, cols, threads",
    # the last: sliced with two row groups per CTA and a second token load per lane (4 tokens x 4 slices)
    [("bulk", 1, 1, 8, 256), ("mma", 2, 1, 8, 256), ("mma", 1, 4, 4, 256), ("mma", 1, 4, 4, 512)],
)
def test_bulk_split_and_sliced_kernels_build_with_the_shared_abi(built, tmp_path, kind, split, slices, cols, threads):
    """The bulk-copy, cluster-split and sliced kernels (in no sm_121 plan) compile for both archs to the shared symbol and ABI."""
    from skinny_gemm.kernels.config import KernelConfig

    cfg = KernelConfig(
        m=4,
        kind=kind,
        threads=threads,
        k_threads=256,
        cols=cols,
        unroll=2 if kind == "bulk" else 1,
        stages=4,
        prefetch=False,
        split=split,
        slices=slices,
    )
    cfg.check(n=6416, k=4096)
    plan = built["root"] / "sm_90a" / "manifest.json"
    for arch in ARCHS:
        build.build_configs(arch, [cfg], [], tmp_path / arch, plan, cache_dir=built["cache"], progress=False)
        man = parse(tmp_path / arch / "manifest.json", expected_arch=arch)
        (variant,) = man.variants.values()
        info = elf.inspect((man.directory / variant.file).read_bytes())
        assert info.arch == arch
        kernel = info.kernels[cfg.symbol]
        assert kernel.params == [(i, off, size) for i, (_, off, size) in enumerate(PARAMS)]
        assert tuple(kernel.reqntid) == (threads, 1, 1)
        assert variant.cluster == split


def test_plan_cubins_unchanged_since_before_the_redesign(built, tmp_path):
    """Every cubin of the plans committed before the issue-12 redesign rebuilds byte-identical (the list is data)."""
    from skinny_gemm.kernels.config import KernelConfig

    before = json.loads((Path(__file__).parent / "cubins-before-redesign.json").read_text())["cubins"]
    for arch, cubins in before.items():
        configs = [KernelConfig.from_json(rec["config"]) for rec in cubins.values()]
        out = tmp_path / arch
        build.build_configs(arch, configs, [], out, plans.plan_path(arch), cache_dir=built["cache"], progress=False)
        for file, rec in cubins.items():
            assert hashlib.sha256((out / file).read_bytes()).hexdigest() == rec["sha256"], f"{arch}/{file}"


def test_new_path_variants_build_with_the_shared_abi(built, tmp_path):
    """The M <= 16, bias and tail variants the GPU suite runs (tests/helpers/new_paths.json) compile for
    both archs to the shared symbol, ABI and block, and their manifest maps every case."""
    from helpers import new_paths

    cases = new_paths.cases()
    assert {cfg.m for *_, cfg in cases} >= {1, 8, 16} and any(c.bias for *_, c in cases)
    assert {k for _, _, k, cfg in cases if cfg.tail} >= {3696, 7392, 2880}
    assert {n for _, n, _, cfg in cases if cfg.tail} >= {50272, 25136, 32776}
    for arch in ARCHS:
        out = new_paths.build(arch, tmp_path, cache_dir=built["cache"])
        man = parse(out / "manifest.json", expected_arch=arch)
        arch_cases = new_paths.cases(arch)
        assert any(c.kind == "wgmma" for *_, c in arch_cases) == (arch == "sm_90a")
        assert set(man.plans) == {(n, k, cfg.m) for _, n, k, cfg in arch_cases}
        for _, n, k, cfg in arch_cases:
            variant = man.variants[man.plans[(n, k, cfg.m)]]
            assert variant.config == cfg
            info = elf.inspect((man.directory / variant.file).read_bytes())
            assert info.arch == arch
            kernel = info.kernels[cfg.symbol]
            assert kernel.params == [(i, off, size) for i, (_, off, size) in enumerate(PARAMS)]
            assert tuple(kernel.reqntid) == (cfg.threads, 1, 1) == variant.block
            if cfg.min_ctas:  # the launch bound reached ptxas
                assert kernel.registers <= cfg.register_cap, (arch, cfg.name, kernel.registers)


def test_min_ctas_bound_caps_what_ptxas_allocates(built, tmp_path):
    """The same tile with and without the launch bound: 160 registers (one 256-thread CTA per SM) against the
    bound's 128 (two), so the field changes the cubin and not only the name."""
    from helpers import new_paths

    bounded = next(cfg for *_, cfg in new_paths.cases() if cfg.min_ctas == 2)
    twin = dataclasses.replace(bounded, min_ctas=0)
    plan = built["root"] / "sm_90a" / "manifest.json"
    regs = {}
    for cfg in (twin, bounded):
        out = tmp_path / cfg.name
        build.build_configs("sm_90a", [cfg], [], out, plan, cache_dir=built["cache"], progress=False)
        (variant,) = parse(out / "manifest.json", expected_arch="sm_90a").variants.values()
        regs[cfg.min_ctas] = elf.inspect((out / variant.file).read_bytes()).kernels[cfg.symbol].registers
    assert regs[2] <= 128 < regs[0], regs


def test_a_ring_over_an_archs_shared_memory_is_refused_by_its_build(built, tmp_path):
    """A ring of 192 KB runs on the H200 (227 KB a CTA) and not on the GB10 (99 KB): the sm_90a build writes it, the
    sm_121 build refuses it with one line naming the variant and both sizes, so no sm_121 wheel holds a variant
    the driver would refuse on every call. The ELF reader's static size is the config's reduction buffers plus
    the DSL's 1 KB."""
    from skinny_gemm.aot.build import BuildError
    from skinny_gemm.kernels.config import DSL_SMEM_RESERVE, SMEM_PER_CTA, KernelConfig

    cfg = KernelConfig(
        m=16, kind="mma", threads=128, k_threads=128, cols=32, unroll=1, stages=16, prefetch=False, fetch=128, ring=True
    )
    cfg.check(n=4096, k=14336)
    assert SMEM_PER_CTA["sm_121"] < cfg.ring_smem < SMEM_PER_CTA["sm_90a"]
    plan = built["root"] / "sm_90a" / "manifest.json"
    build.build_configs("sm_90a", [cfg], [], tmp_path / "sm_90a", plan, cache_dir=built["cache"], progress=False)
    man = parse(tmp_path / "sm_90a" / "manifest.json", expected_arch="sm_90a")
    (variant,) = man.variants.values()
    kernel = elf.inspect((man.directory / variant.file).read_bytes()).kernels[cfg.symbol]
    assert kernel.shared == cfg.mma_smem + DSL_SMEM_RESERVE
    with pytest.raises(
        BuildError,
        match=rf"{cfg.name}: .* {kernel.shared} bytes of static and {cfg.ring_smem} of dynamic shared memory, over the {SMEM_PER_CTA['sm_121']} a CTA may take on sm_121",
    ):
        build.build_configs("sm_121", [cfg], [], tmp_path / "sm_121", plan, cache_dir=built["cache"], progress=False)
    assert not (tmp_path / "sm_121" / "manifest.json").exists()
