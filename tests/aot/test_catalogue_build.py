"""Catalogue plans: every catalogue cell gets a heuristic entry that builds and verifies for sm_90a, or a reason.

The entries stay heuristic until the H200 measures them: they are built here, but the wheel
ships only the committed (measured) sm_90a plan.
"""

import time

import pytest

from skinny_gemm.aot import build, plans, verify
from skinny_gemm.runtime import modelfile

# A reason names the config rule heuristic_config hit, or the bias a config of this tree cannot add.
REASON_PREFIXES = ("bias", "heuristic_config failed")


@pytest.fixture(scope="module")
def catalogue():
    """Every catalogue model at every TP it lists, M 1, 2, 4, 8, 16: (cells, entries, reasons)."""
    cells = plans.catalogue_cells(plans.model_tps(None, None, True), plans.CATALOGUE_MS)
    entries, reasons = plans.catalogue_plan(cells)
    return cells, entries, reasons


@pytest.fixture(scope="module")
def catalogue_cache(tmp_path_factory):
    """One compile cache for the module: the first catalogue build compiles from empty, the next reuses it."""
    return tmp_path_factory.mktemp("catalogue-cache")


def test_every_catalogue_cell_gets_an_entry_or_a_reason(catalogue):
    cells, entries, reasons = catalogue
    keys = {(c.n, c.k, c.m) for c in cells}
    assert len(keys) == len(cells) and len({(c.n, c.k) for c in cells}) * len(plans.CATALOGUE_MS) == len(cells)
    assert {(e.n, e.k, e.m) for e in entries} | set(reasons) == keys
    assert not {(e.n, e.k, e.m) for e in entries} & set(reasons)
    for why in reasons.values():
        assert "rule" in why or why.startswith(REASON_PREFIXES), why
    by_rule: dict = {}
    for (n, k, m), why in sorted(reasons.items()):
        by_rule.setdefault(why.split(":")[0], []).append(f"{n}x{k}@m{m}")
    for rule, where in sorted(by_rule.items()):  # the shapes left to cuBLAS, shown with -s
        print(f"left to cuBLAS by {rule}: {len(where)} cells, e.g. {', '.join(where[:4])}")
    for e in entries:
        e.config.check(n=e.n, k=e.k)
        assert e.config.m == e.m and e.provenance["kind"] == "heuristic" and e.provenance["uses"]


def test_each_entry_names_the_rule_that_chose_it(catalogue):
    """A tensor-core (or tail, or bias) entry is labelled with the wide rule that made it, never the seed SIMT rule."""
    _, entries, _ = catalogue
    for e in entries:
        assert e.provenance["rule"] == plans.heuristic_rule(e.config)
    mma = [e for e in entries if e.config.kind == "mma"]
    assert mma and all(e.provenance["rule"] == plans.HEURISTIC_RULE_WIDE for e in mma)


def test_biased_cells_ask_for_a_bias_config(catalogue):
    cells, entries, reasons = catalogue
    biased = {(c.n, c.k, c.m) for c in cells if c.bias}
    assert (1280, 8192, 1) in biased, "Qwen2.5-72B's TP8 qkv carries a bias"
    for e in entries:
        if (e.n, e.k, e.m) in biased:
            assert getattr(e.config, "bias", False), "a biased layer's entry must add its bias"


def test_catalogue_entries_build_and_verify_for_sm90a(catalogue, catalogue_cache, tree_copy, tmp_path):
    """Every heuristic entry compiles for sm_90a and the build verifies (hashes, ELF arch, symbols, ABI)."""
    _, entries, _ = catalogue
    plan = tree_copy / "catalogue-sm_90a.json"
    plan.write_text(plans.catalogue_table("sm_90a", entries, "all models"))
    start = time.monotonic()
    result = build.build("sm_90a", tmp_path / "out", plan_file=plan, cache_dir=catalogue_cache, jobs=2, progress=False)
    print(f"catalogue build: {result.entries} entries, {result.variants} variants in {time.monotonic() - start:.1f} s")
    assert result.entries == len(entries) and result.variants == len({e.config for e in entries})
    archs, problems = verify.verify(tmp_path / "out", tree=tree_copy)
    assert (archs, problems) == (["sm_90a"], [])
    # negative control: verify is not vacuous on this build
    victim = next((tmp_path / "out" / "sm_90a").glob("*.cubin"))
    blob = bytearray(victim.read_bytes())
    blob[len(blob) // 2] ^= 0xFF
    victim.write_bytes(bytes(blob))
    _, problems = verify.verify(tmp_path / "out", tree=tree_copy)
    assert any("sha256 mismatch" in p for p in problems)


def test_a_catalogue_build_loads_in_bounded_work(catalogue, catalogue_cache, tree_copy, tmp_path, fresh, monkeypatch):
    """Every heuristic entry built (real cubins) and loaded by the runtime (driver faked): the load reads the
    manifest alone and loads nothing into the driver; a first call loads and binds its own variant only."""
    from skinny_gemm.runtime import artifacts, jsonfile, loader

    _, entries, _ = catalogue
    plan = tree_copy / "catalogue-sm_90a.json"
    plan.write_text(plans.catalogue_table("sm_90a", entries, "all models"))
    build.build("sm_90a", tmp_path / "out", plan_file=plan, cache_dir=catalogue_cache, jobs=2, progress=False)
    monkeypatch.setenv(artifacts.ENV_ARTIFACTS, str(tmp_path / "out"))
    reads = []
    real = artifacts.read_bounded

    def spy(path, cap):
        reads.append(str(path))
        return real(path, cap)

    monkeypatch.setattr(artifacts, "read_bounded", spy)
    monkeypatch.setattr(jsonfile, "read_bounded", spy)  # the manifest's reader
    fake = fresh()
    assert fake.warnings == [], [str(w.message) for w in fake.warnings]
    assert reads == [str(tmp_path / "out" / "sm_90a" / "manifest.json")], "the load reads the manifest alone"
    assert fake.count("cuLibraryLoadData") == 0
    table = loader.DEVICES[0].bind()
    assert len(table) == len(entries)
    key = (entries[0].n, entries[0].k, entries[0].m)
    reads.clear()
    assert table.get(key) is not None
    assert reads == [str(tmp_path / "out" / "sm_90a" / f"{table.variant_of(key)}.cubin")]
    assert fake.count("cuLibraryLoadData") == 1 and fake.count("cuKernelGetFunction") == 1


def test_the_wheel_ships_only_measured_sm90a_entries():
    _, entries = plans.load(plans.plan_path("sm_90a"))
    assert entries and all(e.provenance["kind"] == "measured" for e in entries)


def test_catalogue_size():
    """The numbers docs/tuning.md states: models, distinct BF16 candidate shapes, cells at M 1, 2, 4, 8, 16."""
    pairs = plans.model_tps(None, None, True)
    cells = plans.catalogue_cells(pairs, plans.CATALOGUE_MS)
    assert len(modelfile.catalogue()) == 16 and len(pairs) == 48
    assert len({(c.n, c.k) for c in cells}) == 161 and len(cells) == 805
