"""The manifest contract: schema, parameter ABI, arch mapping, and the checks both the runtime and verify run."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

from ..kernels.config import ConfigError, KernelConfig

SCHEMA = 1
MANIFEST_NAME = "manifest.json"

# The kernel-parameter ABI every variant shares (kernels/skinny_gemm.py):
# (name, offset, size) in declaration order; 40 bytes in all.
PARAMS = (("a", 0, 8), ("w", 8, 8), ("out", 16, 8), ("residual", 24, 8), ("n", 32, 4), ("k", 36, 4))
PARAM_BYTES = 40

# Capability -> the one target whose cubins run there. sm_90a code runs only on
# 9.0; plain sm_121 code on 12.1 (DESIGN.md: map capability to target exactly).
ARCH_FOR_CAPABILITY = {(9, 0): "sm_90a", (12, 1): "sm_121"}
CAPABILITY_FOR_ARCH = {arch: cap for cap, arch in ARCH_FOR_CAPABILITY.items()}


class ManifestError(ValueError):
    """A manifest that is malformed or does not match this package."""


@dataclass(frozen=True)
class Variant:
    """One kernel variant as the manifest records it."""

    id: str
    config: KernelConfig
    symbol: str
    file: str
    sha256: str
    size: int
    block: tuple[int, int, int]
    cols_per_cta: int
    cluster: int
    dynamic_smem: int
    pdl: bool
    params: tuple[tuple[str, int, int], ...]


@dataclass(frozen=True)
class Manifest:
    """A parsed, structurally checked manifest."""

    path: Path
    raw: dict
    arch: str
    package_version: str
    variants: dict[str, Variant]
    plans: dict[tuple[int, int, int], str]

    @property
    def directory(self) -> Path:
        """The folder holding the manifest and its cubins."""
        return self.path.parent


def launch_problem(v: Variant) -> str | None:
    """Why a variant's recorded launch shape (block, columns per CTA, cluster, PDL) contradicts its config, or None."""
    cfg = v.config
    if (v.block, v.cols_per_cta, v.cluster, v.pdl) != ((cfg.threads, 1, 1), cfg.cols_per_cta, cfg.split, cfg.pdl):
        return (
            f"launch shape (block {v.block}, cols_per_cta {v.cols_per_cta}, cluster {v.cluster}, pdl {v.pdl}) "
            "contradicts its config"
        )
    return None


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def dumps(data: dict) -> str:
    """The one JSON encoding of plans and manifests: sorted keys, stable, newline-terminated."""
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def parse(path: Path, expected_version: str | None = None, expected_arch: str | None = None) -> Manifest:
    """Read and structurally check a manifest; raises ManifestError with one clear reason."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ManifestError(f"{path}: unreadable manifest ({exc})") from None
    if not isinstance(raw, dict) or raw.get("schema") != SCHEMA:
        found = raw.get("schema") if isinstance(raw, dict) else None
        raise ManifestError(f"{path}: manifest schema {found!r}, this package reads schema {SCHEMA}")
    if expected_version is not None and raw.get("package_version") != expected_version:
        raise ManifestError(
            f"{path}: built by skinny-gemm {raw.get('package_version')!r}, this is {expected_version!r}"
        )
    arch = raw.get("arch")
    if arch not in CAPABILITY_FOR_ARCH:
        raise ManifestError(f"{path}: unknown arch {arch!r}")
    if expected_arch is not None and arch != expected_arch:
        raise ManifestError(f"{path}: manifest is for {arch}, expected {expected_arch}")
    if tuple(raw.get("capability", ())) != CAPABILITY_FOR_ARCH[arch]:
        raise ManifestError(f"{path}: capability {raw.get('capability')} does not match arch {arch}")
    abi_raw = raw.get("abi")
    abi = [tuple(p) for p in abi_raw.get("params", [])] if isinstance(abi_raw, dict) else []
    if [(n, o, s) for n, o, s in abi] != [tuple(p) for p in PARAMS]:
        raise ManifestError(f"{path}: parameter ABI {abi} differs from this runtime's {list(PARAMS)}")
    variants = {}
    try:
        for v in raw["variants"]:
            cfg = KernelConfig.from_json(v["config"])
            cfg.check()
            if v["id"] != cfg.name or v["symbol"] != cfg.symbol:
                raise ManifestError(f"{path}: variant {v['id']!r} does not match its config ({cfg.name})")
            variants[v["id"]] = Variant(
                id=v["id"],
                config=cfg,
                symbol=v["symbol"],
                file=v["file"],
                sha256=v["sha256"],
                size=int(v["size"]),
                block=tuple(v["block"]),
                cols_per_cta=int(v["grid"]["cols_per_cta"]),
                cluster=int(v["grid"]["cluster"]),
                dynamic_smem=int(v["dynamic_smem"]),
                pdl=bool(v["pdl"]),
                params=tuple(tuple(p) for p in v["params"]),
            )
        plans = {}
        for p in raw["plans"]:
            key = (int(p["n"]), int(p["k"]), int(p["m"]))
            if p["variant"] not in variants:
                raise ManifestError(f"{path}: plan {key} names unknown variant {p['variant']!r}")
            variants[p["variant"]].config.check(n=key[0], k=key[1])
            if variants[p["variant"]].config.m != key[2]:
                raise ManifestError(f"{path}: plan {key} maps to variant {p['variant']} built for another M")
            plans[key] = p["variant"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ManifestError(f"{path}: malformed manifest ({exc!r})") from None
    except ConfigError as exc:
        raise ManifestError(f"{path}: invalid config: {exc}") from None
    return Manifest(
        path=path,
        raw=raw,
        arch=arch,
        package_version=raw.get("package_version"),
        variants=variants,
        plans=plans,
    )
