"""Load cost independent of the catalogue: with ~1000 variants in the manifest, loading reads the manifest and
nothing else and makes no load call into the driver; a first call of one shape loads and binds its variant only."""

from __future__ import annotations

import itertools
import json
import time

from helpers.artifacts import all_plans, bind_all, manifest_of

from skinny_gemm.kernels.config import ConfigError, KernelConfig
from skinny_gemm.runtime import artifacts, jsonfile, loader
from skinny_gemm.runtime.manifest import MANIFEST_NAME

SYNTHETIC = 1000


def synthetic_configs(count: int):
    """``count`` distinct valid SIMT configs (m, threads, k_threads, cols, unroll, flags varied)."""
    found = []
    space = itertools.product(
        range(1, 9), (128, 256, 512), (32, 64, 128, 256), (1, 2, 4), (1, 2), (True, False), (True, False)
    )
    for m, threads, kt, cols, unroll, pdl, prefetch in space:
        cfg = KernelConfig(
            m=m, threads=threads, k_threads=kt, cols=cols, vec=8, unroll=unroll, pdl=pdl, prefetch=prefetch
        )
        try:
            cfg.check(n=4096 * 4, k=4096)
        except ConfigError:
            continue
        found.append(cfg)
        if len(found) == count:
            return found
    raise AssertionError(f"only {len(found)} synthetic configs")


def add_catalogue(arch_dir, count: int) -> set:
    """Append ``count`` variants (their own cubin files, junk inside: nothing may read them) and a plan each;
    returns the plans' (n, k, m)."""
    data = json.loads((arch_dir / MANIFEST_NAME).read_text())
    template = data["variants"][0]
    taken = {v["id"] for v in data["variants"]}
    planned = {(p["n"], p["k"], p["m"]) for p in data["plans"]}
    # synthetic N values, stepping past any the real plan already has (a plan may appear once)
    free_n = (n for n in range(4096 * 4 + 256, 1 << 30, 256) if all((n, 4096, m) not in planned for m in range(1, 17)))
    added = set()
    for i, cfg in enumerate(c for c in synthetic_configs(count + len(taken)) if c.name not in taken):
        if i == count:
            break
        n = next(free_n)
        rec = {
            **template,
            "id": cfg.name,
            "config": cfg.to_json(),
            "symbol": cfg.symbol,
            "file": f"{cfg.name}.cubin",
            "block": [cfg.threads, 1, 1],
            "dynamic_smem": cfg.launch().smem,  # the template may be a ring variant
            "pdl": cfg.pdl,
            "grid": {**template["grid"], "cols_per_cta": cfg.cols_per_cta, "cluster": 1, "persist": 0},
        }
        (arch_dir / rec["file"]).write_bytes(b"\0" * rec["size"])
        data["variants"].append(rec)
        data["plans"].append({"n": n, "k": 4096, "m": cfg.m, "variant": cfg.name})
        added.add((n, 4096, cfg.m))
    (arch_dir / MANIFEST_NAME).write_text(json.dumps(data))
    return added


def count_reads(monkeypatch) -> list:
    """Every file the runtime reads from here on: [(path, bytes)]."""
    reads = []
    real = artifacts.read_bounded

    def spy(path, cap):
        blob = real(path, cap)
        reads.append((str(path), len(blob)))
        return blob

    monkeypatch.setattr(artifacts, "read_bounded", spy)
    monkeypatch.setattr(jsonfile, "read_bounded", spy)
    return reads


def test_load_of_a_thousand_variants_reads_the_manifest_only(fresh, art, monkeypatch):
    arch_dir = art / "sm_90a"
    real_plans = all_plans(art)
    add_catalogue(arch_dir, SYNTHETIC)
    assert len(manifest_of(art)["variants"]) >= SYNTHETIC
    reads = count_reads(monkeypatch)
    start = time.perf_counter()
    fake = fresh()
    seconds = time.perf_counter() - start
    print(
        f"\nload of {len(manifest_of(art)['variants'])} variants: {seconds * 1e3:.1f} ms on this CPU (a figure, not a limit)"
    )
    assert fake.warnings == [], [str(w.message) for w in fake.warnings]
    assert reads == [(str(arch_dir / MANIFEST_NAME), (arch_dir / MANIFEST_NAME).stat().st_size)]
    assert fake.count("cuLibraryLoadData") == 0 and fake.count("cuKernelGetFunction") == 0

    # The first call of a shape: its variant only (one cubin read, one library load, one function bound).
    table = loader.DEVICES[0].table
    key = min(real_plans)
    vid = table.variant_of(key)
    reads.clear()
    assert table.get(key) is not None
    assert [path for path, _ in reads] == [str(arch_dir / f"{vid}.cubin")]
    assert fake.count("cuLibraryLoadData") == 1 and fake.count("cuKernelGetFunction") == 1
    # Another shape of the same variant costs nothing more; a shape of another variant costs one more.
    for same in sorted(k for k in real_plans if k != key and table.variant_of(k) == vid):
        assert table.get(same) is not None and fake.count("cuLibraryLoadData") == 1
    other = next(k for k in sorted(real_plans) if table.variant_of(k) != vid)
    assert table.get(other) is not None and fake.count("cuLibraryLoadData") == 2


def test_synthetic_catalogue_refuses_only_what_is_called(fresh, art):
    """The synthetic cubins are junk: each is refused when one of its shapes is called, the real ones all bind."""
    arch_dir = art / "sm_90a"
    added = add_catalogue(arch_dir, 20)
    fresh()
    messages = bind_all()
    assert len(messages) == 20 and all("sha256 mismatch" in m for m in messages)
    assert set(loader.DEVICES[0].table) == all_plans(art) - added


def test_plan_for_checks_only_the_variants_of_its_shape(fresh, art, monkeypatch):
    import torch

    import skinny_gemm

    add_catalogue(art / "sm_90a", 200)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    fresh()
    reads = count_reads(monkeypatch)
    n, k, m = min(all_plans(art))
    assert skinny_gemm.plan_for(n, k, m) is not None
    planned = {vid for key, vid in loader.DEVICES[0].library.manifest.plans.items() if key[:2] == (n, k)}
    assert {path for path, _ in reads} == {str(art / "sm_90a" / f"{vid}.cubin") for vid in planned}
