"""The manifest contract and its one validator: schema, parameter ABI, arch mapping, every field typed and bounded.

The loader, ``verify`` and ``env`` all read manifests through ``parse``. It
checks the manifest as a whole (header, ABI, the variant index and the plan
index) and refuses the manifest on any problem there; each variant's own
record (config, symbol, hash, launch shape, parameters) is checked by
``Manifest.variant`` when that variant is first needed, and a problem there
refuses that variant only. The loader needs only the variants of the shapes a
process runs, so a catalogue of a thousand variants costs one JSON parse.
"""

from __future__ import annotations

import dataclasses
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

from ..kernels.config import ConfigError, KernelConfig
from .files import CUBIN_CAP, MANIFEST_CAP, plain_name
from .jsonfile import InputError, printable, read_json

SCHEMA = 1
MANIFEST_NAME = "manifest.json"

# The kernel-parameter ABI every variant shares (kernels/skinny_gemm.py):
# (name, offset, size) in declaration order; 40 bytes in all.
PARAMS = (("a", 0, 8), ("w", 8, 8), ("out", 16, 8), ("residual", 24, 8), ("n", 32, 4), ("k", 36, 4))
PARAM_BYTES = 40

# Capability -> the one target whose cubins run there. sm_90a code runs only on
# 9.0 (an sm_121 cubin on an H200 fails with CUDA_ERROR_NO_BINARY_FOR_GPU); plain sm_121
# code on 12.1, since the kernels use no arch-specific instruction on GB10.
ARCH_FOR_CAPABILITY = {(9, 0): "sm_90a", (12, 1): "sm_121"}
CAPABILITY_FOR_ARCH = {arch: cap for cap, arch in ARCH_FOR_CAPABILITY.items()}
# Every target a build can hold, in build order (CMakeLists.txt, which cannot import this, keeps its own list).
ARCHS = tuple(ARCH_FOR_CAPABILITY.values())


# Bounds of the numbers a manifest may hold: n and k are i32 kernel parameters.
I32_MAX = 2**31 - 1
MAX_THREADS = 1024
MAX_CLUSTER = 8
MAX_DYNAMIC_SMEM = 228 * 1024
MAX_TEXT = 4096
SHA256_HEX = frozenset("0123456789abcdef")


# The JSON type of each config field, from the dataclass (a float where an int belongs is refused here,
# before any rule does arithmetic with it). A field of another type is left to the config's own check.
_TYPES = {"int": int, "bool": bool, "str": str, int: int, bool: bool, str: str}
CONFIG_TYPES = {f.name: _TYPES[f.type] for f in dataclasses.fields(KernelConfig) if f.type in _TYPES}


class ManifestError(ValueError):
    """A manifest that is malformed or does not match this package; the message names the file."""


class VariantError(ValueError):
    """One variant record that is malformed; the message is the reason (the caller names the file)."""


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


@dataclass(eq=False)
class Manifest:
    """A parsed manifest: header and indexes checked; variant records checked on first use (``variant``)."""

    path: Path
    raw: dict
    arch: str
    package_version: str
    files: dict[str, str]  # variant id -> cubin file name (a plain name, checked)
    plans: dict[tuple[int, int, int], str]  # (n, k, m) -> variant id (an id in ``files``)
    records: dict[str, dict] = field(default_factory=dict, repr=False)  # variant id -> its raw record
    keys: dict[str, list] = field(default_factory=dict, repr=False)  # variant id -> the (n, k, m) that name it
    _checked: dict = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    @property
    def directory(self) -> Path:
        """The folder holding the manifest and its cubins."""
        return self.path.parent

    def variant(self, vid: str) -> Variant:
        """The checked record of variant ``vid`` (cached); raises VariantError with the reason."""
        with self._lock:
            if vid not in self._checked:
                try:
                    self._checked[vid] = _variant(self, vid)
                except VariantError as exc:
                    self._checked[vid] = exc
            found = self._checked[vid]
        if isinstance(found, VariantError):
            raise found
        return found

    def problem(self, vid: str) -> str | None:
        """Why variant ``vid``'s record is refused, or None."""
        try:
            self.variant(vid)
        except VariantError as exc:
            return str(exc)
        return None

    @property
    def variants(self) -> dict[str, Variant]:
        """Every variant whose record passes (checks them all: for verify, env and tools, not the loader)."""
        return {vid: self.variant(vid) for vid in self.files if self.problem(vid) is None}


def launch_problem(v: Variant) -> str | None:
    """Why a variant's recorded launch shape contradicts the one its config gives (``KernelConfig.launch``),
    or None: the one comparison of a record's block, columns per CTA, cluster, dynamic shared memory and PDL."""
    cfg, shape = v.config, v.config.launch()
    recorded = (v.block, v.cols_per_cta, v.cluster, v.dynamic_smem, v.pdl)
    if recorded != (shape.block, cfg.cols_per_cta, shape.cluster, shape.smem, shape.pdl):
        return (
            f"launch shape (block {v.block}, cols_per_cta {v.cols_per_cta}, cluster {v.cluster}, "
            f"dynamic_smem {v.dynamic_smem}, pdl {v.pdl}) contradicts its config"
        )
    return None


def dumps(data: dict) -> str:
    """The one JSON encoding of plans and manifests: sorted keys, stable, newline-terminated."""
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` through a temporary file and a rename, so readers never see half a file."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def load_json(path: Path, cap: int = MANIFEST_CAP):
    """Read a JSON file through the one bounded reader (runtime/jsonfile.py); raises ManifestError naming the file."""
    try:
        return read_json(path, "manifest", cap, follow_links=False)
    except InputError as exc:
        raise ManifestError(str(exc)) from None


def file_name_ok(name) -> bool:
    """A cubin or plan file name a manifest may hold: a plain name inside the folder, printable and encodable
    (a newline could forge a line of verify's report, an escape sequence reaches the terminal)."""
    return plain_name(name) and printable(name) and len(name) <= 255


def plan_path_ok(name) -> bool:
    """The plan table a manifest names, relative to the source tree verify reads it from (``kernels/plans/x.json``):
    every part a plain printable name, so it can never point outside that tree."""
    return type(name) is str and len(name) <= MAX_TEXT and all(file_name_ok(part) for part in name.split("/"))


def _is_int(value, lo: int, hi: int) -> bool:
    return type(value) is int and lo <= value <= hi


def _is_text(value) -> bool:
    return type(value) is str and len(value) <= MAX_TEXT and printable(value)


def _is_sha256(value) -> bool:
    return type(value) is str and len(value) == 64 and set(value) <= SHA256_HEX


def _field(record: dict, key: str, ok, what: str, error=ManifestError, where: str = ""):
    """record[key] if ok(it), else raise ``error`` naming the field and what it must be."""
    if key not in record:
        raise error(f"{where}field {key!r} missing")
    value = record[key]
    if not ok(value):
        raise error(f"{where}field {key!r} is {_show(value)}, must be {what}")
    return value


def _show(value) -> str:
    text = ascii(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _block_ok(value) -> bool:
    return (
        type(value) is list
        and len(value) == 3
        and all(_is_int(b, 1, MAX_THREADS) for b in value)
        and value[0] * value[1] * value[2] <= MAX_THREADS
    )


def _params_ok(value) -> bool:
    return (
        type(value) is list
        and [tuple(p) if type(p) is list else p for p in value] == list(PARAMS)
        and all(type(p[1]) is int and type(p[2]) is int for p in value)
    )


def parse(path: Path, expected_version: str | None = None, expected_arch: str | None = None) -> Manifest:
    """Read and check a manifest's header and indexes; raises ManifestError with one reason naming the file."""
    path = Path(path)
    raw = load_json(path)
    try:
        return _manifest(path, raw, expected_version, expected_arch)
    except ManifestError as exc:
        raise ManifestError(f"{path}: {exc}") from None


def _manifest(path: Path, raw, expected_version, expected_arch) -> Manifest:
    if type(raw) is not dict:
        raise ManifestError(f"manifest is {type(raw).__name__}, must be an object")
    if raw.get("schema") != SCHEMA or type(raw.get("schema")) is not int:
        raise ManifestError(f"manifest schema {_show(raw.get('schema'))}, this package reads schema {SCHEMA}")
    version = _field(raw, "package_version", _is_text, "a string")
    if expected_version is not None and version != expected_version:
        raise ManifestError(f"built by skinny-gemm {version!r}, this is {expected_version!r}")
    arch = raw.get("arch")
    if not (type(arch) is str and arch in CAPABILITY_FOR_ARCH):
        raise ManifestError(f"unknown arch {_show(arch)}")
    if expected_arch is not None and arch != expected_arch:
        raise ManifestError(f"manifest is for {arch}, expected {expected_arch}")
    cap = raw.get("capability")
    cap_ok = type(cap) is list and len(cap) == 2 and all(type(c) is int for c in cap)
    if not cap_ok or tuple(cap) != CAPABILITY_FOR_ARCH[arch]:
        raise ManifestError(f"capability {_show(cap)} does not match arch {arch}")
    abi = raw.get("abi")
    params = abi.get("params") if type(abi) is dict else None
    if not _params_ok(params) or abi.get("bytes") != PARAM_BYTES or type(abi.get("bytes")) is not int:
        raise ManifestError(
            f"parameter ABI {_show(abi)} differs from this runtime's {list(PARAMS)} ({PARAM_BYTES} bytes)"
        )
    _field(raw, "dtype", lambda v: v == "bfloat16", "'bfloat16'")
    _field(raw, "plan_file", plan_path_ok, "a relative path of plain printable names (no '..', not absolute)")
    for key in ("plan_sha256", "source_sha256"):
        _field(raw, key, _is_sha256, "a sha256 hex string")
    tool = _field(raw, "toolchain", lambda v: type(v) is dict, "an object")
    _field(tool, "cutlass_dsl", _is_text, "a string", where="toolchain ")
    _field(tool, "compile_options", _is_text, "a string", where="toolchain ")
    _field(
        tool,
        "ptxas",
        lambda v: type(v) is list and len(v) <= 16 and all(_is_text(t) for t in v),
        "a list of strings",
        where="toolchain ",
    )
    variants = _field(raw, "variants", lambda v: type(v) is list, "a list")
    files: dict[str, str] = {}
    records: dict[str, dict] = {}
    for i, rec in enumerate(variants):
        if type(rec) is not dict:
            raise ManifestError(f"variants[{i}] is {_show(rec)}, must be an object")
        vid = _field(
            rec,
            "id",
            lambda v: _is_text(v) and v and printable(v),
            "a non-empty printable string",
            where=f"variants[{i}] ",
        )
        name = _field(
            rec,
            "file",
            file_name_ok,
            "a plain printable file name inside the artifact folder",
            where=f"variant {vid!r} ",
        )
        if vid in records:
            raise ManifestError(f"variant id {vid!r} appears twice")
        if name == MANIFEST_NAME or name in files.values():
            raise ManifestError(f"variant {vid!r} file {name!r} is not a file of its own")
        files[vid], records[vid] = name, rec
    plans: dict[tuple[int, int, int], str] = {}
    keys: dict[str, list] = {}
    for i, p in enumerate(_field(raw, "plans", lambda v: type(v) is list, "a list")):
        if type(p) is not dict:
            raise ManifestError(f"plans[{i}] is {_show(p)}, must be an object")
        key = tuple(
            _field(p, f, lambda v: _is_int(v, 1, I32_MAX), f"an int in 1..{I32_MAX}", where=f"plans[{i}] ")
            for f in ("n", "k", "m")
        )
        vid = _field(
            p, "variant", lambda v: type(v) is str and v in records, "the id of a variant", where=f"plans[{i}] "
        )
        if key in plans:
            raise ManifestError(f"plan {key} appears twice")
        plans[key] = vid
        keys.setdefault(vid, []).append(key)
    if not plans and not files:
        # Every shape would fall back without a word. (Variants without plans are a `tune prepare` candidate
        # folder, loaded by name through load_dir.)
        raise ManifestError("no variants and no plans: every shape would fall back")
    return Manifest(
        path=path, raw=raw, arch=arch, package_version=version, files=files, plans=plans, records=records, keys=keys
    )


def config_of(raw: dict, n: int | None = None, k: int | None = None) -> KernelConfig:
    """The checked KernelConfig of a JSON config object (for shape (n, k) when given); raises ConfigError with
    one line: ``config field 'x' is ..., must be ...`` or ``invalid config: <rule>``."""
    for name, kind in CONFIG_TYPES.items():
        if name in raw and type(raw[name]) is not kind:
            raise ConfigError(f"config field {name!r} is {_show(raw[name])}, must be {kind.__name__}")
    try:
        cfg = KernelConfig.from_json(raw)
        cfg.check(n=n, k=k)
    except ConfigError as exc:
        raise ConfigError(f"invalid config: {exc}") from None
    except (TypeError, ValueError, ArithmeticError) as exc:  # a rule that met a value it did not expect
        raise ConfigError(f"invalid config: {exc}") from None
    return cfg


def _variant(man: Manifest, vid: str) -> Variant:
    """Check one variant record and the plan entries that name it; raises VariantError."""
    rec = man.records[vid]
    where = ""
    cfg_raw = _field(rec, "config", lambda v: type(v) is dict, "an object", VariantError, where)
    try:
        cfg = config_of(cfg_raw)
    except ConfigError as exc:
        raise VariantError(str(exc)) from None
    if vid != cfg.name:
        raise VariantError(f"variant id {vid!r} does not match its config ({cfg.name})")
    symbol = _field(rec, "symbol", lambda v: v == cfg.symbol, f"{cfg.symbol!r} (its config's symbol)", VariantError)
    sha = _field(rec, "sha256", _is_sha256, "a sha256 hex string", VariantError)
    size = _field(rec, "size", lambda v: _is_int(v, 64, CUBIN_CAP), f"an int in 64..{CUBIN_CAP}", VariantError)
    block = _field(rec, "block", _block_ok, f"three ints, at most {MAX_THREADS} threads", VariantError)
    grid = _field(rec, "grid", lambda v: type(v) is dict, "an object", VariantError)
    cols = _field(grid, "cols_per_cta", lambda v: _is_int(v, 1, I32_MAX), "a positive int", VariantError, "grid ")
    cluster = _field(
        grid, "cluster", lambda v: _is_int(v, 1, MAX_CLUSTER), f"an int in 1..{MAX_CLUSTER}", VariantError, "grid "
    )
    _field(grid, "persist", lambda v: v == cfg.persist, f"{cfg.persist} (its config's persist)", VariantError, "grid ")
    smem = _field(
        rec, "dynamic_smem", lambda v: _is_int(v, 0, MAX_DYNAMIC_SMEM), f"an int in 0..{MAX_DYNAMIC_SMEM}", VariantError
    )
    pdl = _field(rec, "pdl", lambda v: type(v) is bool, "true or false", VariantError)
    if "registers" in rec and not _is_int(rec["registers"], 0, 255):
        raise VariantError(f"field 'registers' is {_show(rec['registers'])}, must be an int in 0..255")
    params = rec.get("params")
    if not _params_ok(params):
        raise VariantError(f"parameter layout {_show(params)} differs from the runtime ABI {list(PARAMS)}")
    variant = Variant(
        id=vid,
        config=cfg,
        symbol=symbol,
        file=man.files[vid],
        sha256=sha,
        size=size,
        block=tuple(block),
        cols_per_cta=cols,
        cluster=cluster,
        dynamic_smem=smem,
        pdl=pdl,
        params=PARAMS,
    )
    launch = launch_problem(variant)
    if launch:
        raise VariantError(launch)
    for n, k, m in man.keys.get(vid, ()):
        if m != cfg.m:
            raise VariantError(f"plan {(n, k, m)} maps to this variant, built for m={cfg.m}")
        try:
            cfg.check(n=n, k=k)
        except ConfigError as exc:
            raise VariantError(f"plan {(n, k, m)} cannot run on this variant: {exc}") from None
    return variant
