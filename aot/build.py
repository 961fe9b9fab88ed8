"""The AOT build: plan table -> distinct kernel variants -> cubins (cached, parallel) -> manifest, written last."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from tqdm import tqdm

from ..kernels.config import KernelConfig
from ..runtime.artifacts import check_cubin
from ..runtime.files import MANIFEST_CAP, FileProblem, read_bounded
from ..runtime.jsonfile import where
from ..runtime.manifest import CAPABILITY_FOR_ARCH, MANIFEST_NAME, PARAMS, SCHEMA, VariantError, dumps, write_atomic
from ..runtime.version import __version__
from . import plans

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
# Files whose content decides what a cubin holds: every Python file of kernels/
# (the kernels, their shared helpers and the config), found on disk rather than
# listed, so a new kernel file can never be left out of the digest. The digest
# keys the cache and is recorded in the manifest so verify can spot a stale artifact.
SOURCE_GLOB = "kernels/*.py"


def source_files(root: Path = PACKAGE_ROOT) -> list[str]:
    """The kernel source files under ``root``, as sorted relative paths."""
    return sorted(p.relative_to(root).as_posix() for p in root.glob(SOURCE_GLOB))


CUTLASS_DIST = "nvidia-cutlass-dsl"


class BuildError(RuntimeError):
    """The build could not produce a correct artifact set."""


@dataclass
class BuildResult:
    """What a build did, for the CLI summary and the tests."""

    arch: str
    out_dir: Path
    entries: int
    variants: int
    compiled: int
    cached: int
    seconds: float


def source_digest(root: Path = PACKAGE_ROOT) -> str:
    """sha256 over the kernel sources (path and bytes, in a fixed order)."""
    h = hashlib.sha256()
    for rel in source_files(root):
        try:  # bounded and non-blocking: a FIFO among the sources (verify --tree) must not hang
            blob = read_bounded(root / rel, MANIFEST_CAP)
        except FileProblem as exc:
            raise BuildError(f"{where(root / rel)}: kernel source {exc}") from None
        h.update(rel.encode() + b"\0" + blob + b"\0")
    return h.hexdigest()


def cutlass_version() -> str:
    """The installed nvidia-cutlass-dsl version, or raise a BuildError saying how to get it."""
    try:
        return metadata.version(CUTLASS_DIST)
    except metadata.PackageNotFoundError:
        raise BuildError(
            f"building needs {CUTLASS_DIST} (pip install 'skinny-gemm[build]' or see pyproject.toml); "
            "the runtime and verify do not"
        ) from None


def default_cache_dir() -> Path:
    """$SKINNY_GEMM_CACHE, else ~/.cache/skinny-gemm: shared by every build on this machine."""
    env = os.environ.get("SKINNY_GEMM_CACHE")
    return Path(env) if env else Path.home() / ".cache" / "skinny-gemm"


def _compile_worker(cfg_json: dict, arch: str) -> bytes:
    """Run in a worker process: compile one variant (imports cutlass there, not in the parent)."""
    from ..kernels import skinny_bulk, skinny_gemm, skinny_mma, skinny_wgmma

    cfg = KernelConfig.from_json(cfg_json)
    kernel = {"simt": skinny_gemm, "mma": skinny_mma, "bulk": skinny_bulk, "wgmma": skinny_wgmma}[cfg.kind]
    with tempfile.TemporaryDirectory(prefix="skinny-dump-") as dump:
        return kernel.compile_variant(cfg, arch, dump)


def _variant_record(cfg: KernelConfig, blob: bytes, arch: str) -> dict:
    """The manifest row of one variant (its launch fields from ``cfg.launch``), after the runtime's own cubin
    check (so the build never writes a cubin the runtime would refuse)."""
    try:
        info = check_cubin(blob, cfg, arch)
    except VariantError as exc:
        raise BuildError(f"{cfg.name}: {exc}") from None
    shape = cfg.launch()
    return {
        "id": cfg.name,
        "config": cfg.to_json(),
        "symbol": cfg.symbol,
        "file": f"{cfg.name}.cubin",
        "sha256": hashlib.sha256(blob).hexdigest(),
        "size": len(blob),
        "block": list(shape.block),
        "grid": {
            "cols_per_cta": cfg.cols_per_cta,
            "cluster": shape.cluster,
            "persist": cfg.persist,
            "rule": "grid = (min(n / cols_per_cta, persist or n) * cluster, 1, 1), clusters of (cluster, 1, 1) CTAs",
        },
        "dynamic_smem": shape.smem,
        "pdl": shape.pdl,
        "registers": info.kernels[cfg.symbol].registers,
        "params": [list(p) for p in PARAMS],
    }, info.toolkit


def build(
    arch: str,
    out_root: Path,
    plan_file: Path | None = None,
    cache_dir: Path | None = None,
    jobs: int | None = None,
    progress: bool = True,
) -> BuildResult:
    """Build ``out_root/<arch>/`` from a plan table: every variant's cubin, then manifest.json last."""
    if arch not in CAPABILITY_FOR_ARCH:
        raise BuildError(f"unknown arch {arch!r}; choose from {sorted(CAPABILITY_FOR_ARCH)}")
    plan_file = Path(plan_file).resolve() if plan_file else plans.plan_path(arch)
    header, entries = plans.load(plan_file)
    if header["arch"] != arch:
        raise BuildError(f"{plan_file} is the plan table for {header['arch']}, not {arch}")
    if not entries:
        raise BuildError(f"{plan_file}: no entries: its build would plan nothing (every shape falls back)")
    configs = {e.config for e in entries}
    mapping = [{"n": e.n, "k": e.k, "m": e.m, "variant": e.config.name} for e in entries]
    return build_configs(arch, configs, mapping, Path(out_root) / arch, plan_file, cache_dir, jobs, progress)


def build_configs(
    arch: str,
    configs,
    mapping: list[dict],
    out_dir: Path,
    plan_file: Path,
    cache_dir: Path | None = None,
    jobs: int | None = None,
    progress: bool = True,
) -> BuildResult:
    """Compile ``configs`` into ``out_dir`` (cached, in parallel) and write the manifest last, atomically.

    ``mapping`` is the manifest's plan list; ``plan_file`` is the file whose
    hash the manifest records (the plan table, or a tuner's candidate list).
    """
    from ..kernels.common import compile_options

    start = time.monotonic()
    configs = sorted(set(configs), key=lambda c: c.name)
    version = cutlass_version()
    sources = source_digest()
    options = compile_options(arch, "<tmp>")
    cache = Path(cache_dir) if cache_dir else default_cache_dir()
    cache.mkdir(parents=True, exist_ok=True)

    def cache_key(cfg: KernelConfig) -> Path:
        key = hashlib.sha256(f"{sources}|{cfg.name}|{arch}|{version}|{options}".encode()).hexdigest()
        return cache / f"{key[:32]}.cubin"

    blobs: dict[str, bytes] = {}
    todo = []
    for cfg in configs:
        hit = cache_key(cfg)
        if hit.exists():
            blobs[cfg.name] = hit.read_bytes()
        else:
            todo.append(cfg)
    bar = tqdm(total=len(configs), initial=len(blobs), desc=f"compile {arch}", unit="variant", disable=not progress)
    if todo:
        workers = max(1, min(jobs or os.cpu_count() or 1, len(todo)))
        # fork: workers inherit the registered skinny_gemm package; cutlass is imported only in them.
        ctx = multiprocessing.get_context("fork")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(_compile_worker, cfg.to_json(), arch): cfg for cfg in todo}
            for fut in as_completed(futures):
                cfg = futures[fut]
                blob = fut.result()
                tmp = cache_key(cfg).with_suffix(f".tmp{os.getpid()}")
                tmp.write_bytes(blob)
                os.replace(tmp, cache_key(cfg))
                blobs[cfg.name] = blob
                bar.update(1)
    bar.close()

    records, toolkits = [], set()
    for cfg in configs:
        record, toolkit = _variant_record(cfg, blobs[cfg.name], arch)
        records.append(record)
        toolkits.add(toolkit)

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    # The manifest is the commit marker: drop it first, so an interrupted build
    # leaves a directory that verify and the runtime both refuse.
    (out_dir / MANIFEST_NAME).unlink(missing_ok=True)
    for stale in out_dir.iterdir():
        if stale.is_file():
            stale.unlink()
        else:
            shutil.rmtree(stale)
    for cfg in configs:
        (out_dir / f"{cfg.name}.cubin").write_bytes(blobs[cfg.name])
    plan_file = Path(plan_file)
    manifest = {
        "schema": SCHEMA,
        "package_version": __version__,
        "arch": arch,
        "capability": list(CAPABILITY_FOR_ARCH[arch]),
        "dtype": "bfloat16",
        "toolchain": {"cutlass_dsl": version, "ptxas": sorted(toolkits), "compile_options": options},
        "plan_file": plan_file.relative_to(PACKAGE_ROOT).as_posix()
        if plan_file.is_relative_to(PACKAGE_ROOT)
        else plan_file.name,
        "plan_sha256": hashlib.sha256(plan_file.read_bytes()).hexdigest(),
        "source_sha256": sources,
        "abi": {"params": [list(p) for p in PARAMS], "bytes": sum(p[2] for p in PARAMS)},
        "variants": records,
        "plans": sorted(mapping, key=lambda p: (p["n"], p["k"], p["m"])),
    }
    write_atomic(out_dir / MANIFEST_NAME, dumps(manifest))
    return BuildResult(
        arch=arch,
        out_dir=out_dir,
        entries=len(mapping),
        variants=len(configs),
        compiled=len(todo),
        cached=len(configs) - len(todo),
        seconds=time.monotonic() - start,
    )


def main_summary(result: BuildResult) -> str:
    """One line saying what a build did."""
    return (
        f"{result.arch}: {result.entries} plan entries -> {result.variants} variants "
        f"({result.compiled} compiled, {result.cached} cached) in {result.seconds:.1f} s -> {result.out_dir}"
    )
