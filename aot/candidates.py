"""The tuner's candidate configs per (n, k, m) cell: the spaces are data (kernels/candidates.json), expanded here.

Each space fixes some config fields and lists values for the others; `expand` takes their
itertools.product in the listed order, and `admissible` is the one filter: the config's own
validity check for the shape plus the rules the space names (RULES). The bulk-copy kernel
(kind "bulk") has no space: any bulk pick made the whole decode step ~50 us slower, whatever
its count of calls (H200, TP8 M=4), and the decode phase, which changes one cell at a time,
cannot leave that state once two cells are on bulk.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from functools import lru_cache
from pathlib import Path

from ..kernels.config import H200_SMS, MMA_ROWS, SM_REGISTERS, ConfigError, KernelConfig

SPACES_FILE = Path(__file__).resolve().parent.parent / "kernels" / "candidates.json"
CONFIG_FIELDS = {f.name for f in dataclasses.fields(KernelConfig)}
# Pseudo-fields a space may list besides config fields (kernels/candidates.json's 'about' says how they map).
PSEUDO_FIELDS = {"groups", "tiles"}
WHEN_KEYS = {"m_min", "m_max", "k_min", "k_max"}
# A static_k value that stands for each cell's own K (the "mma" walk's tokens are indexed statically).
STATIC_K_OF_CELL = "K"


class CandidateError(ValueError):
    """A candidate space file that is malformed; the message names the space and the field."""


@lru_cache(maxsize=4)
def spaces(path: Path = SPACES_FILE) -> dict:
    """The candidate spaces file, checked (cached per path)."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CandidateError(f"{path}: unreadable candidate spaces ({exc})") from None
    for space in data.get("spaces", []):
        where = f"{Path(path).name}: space {space.get('name')!r}"
        names = [f for axis in space.get("axes", []) for f in (axis[0] if isinstance(axis[0], list) else [axis[0]])]
        unknown = (set(names) | set(space.get("fixed", {}))) - CONFIG_FIELDS - PSEUDO_FIELDS
        if unknown:
            raise CandidateError(f"{where}: unknown config fields {sorted(unknown)}")
        if len(names) != len(set(names)):
            raise CandidateError(f"{where}: a field is listed twice in its axes")
        archs = space.get("archs", [])
        if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
            raise CandidateError(f"{where}: 'archs' must be a list of arch names")
        bad_when = set(space.get("when", {})) - WHEN_KEYS
        if bad_when:
            raise CandidateError(f"{where}: 'when' keys {sorted(bad_when)} are not {sorted(WHEN_KEYS)}")
        for rule, _ in space.get("rules", []):
            if rule not in RULES and rule not in CELL_RULES:
                raise CandidateError(f"{where}: unknown rule {rule!r} (known: {sorted({*RULES, *CELL_RULES})})")
    return data


def _applies(when: dict | None, n: int, k: int, m: int) -> bool:
    when = when or {}
    return (when.get("m_min", m) <= m <= when.get("m_max", m)) and (when.get("k_min", k) <= k <= when.get("k_max", k))


def _values(values: list, n: int, k: int, m: int) -> list:
    """An axis' values for one cell: plain values, and {value, when} ones whose range holds the cell."""
    return [
        v["value"] if isinstance(v, dict) else v
        for v in values
        if not isinstance(v, dict) or _applies(v.get("when"), n, k, m)
    ]


def _config(fields: dict, k: int) -> KernelConfig:
    """A config from a point of a space: the pseudo-fields become threads and cols, a static_k of "K" the cell's K."""
    fields = dict(fields)
    if fields.get("static_k") == STATIC_K_OF_CELL:
        fields["static_k"] = k
    groups = fields.pop("groups", 1)
    tiles = fields.pop("tiles", None)
    if tiles is not None:
        fields["cols"] = MMA_ROWS // fields.get("slices", 1) * tiles
    fields.setdefault("threads", fields["k_threads"] * groups)
    return KernelConfig(**fields)


def expand(space: dict, n: int, k: int, m: int, extra: dict | None = None) -> list[KernelConfig]:
    """Every config of one space for one cell, in itertools.product order of its axes (``extra`` fields on each)."""
    if not _applies(space.get("when"), n, k, m):
        return []
    names, value_lists = [], []
    for fields, values in space["axes"]:
        names.append(fields)
        value_lists.append(_values(values, n, k, m))
    found = []
    for point in itertools.product(*value_lists):
        fields = {"m": m, **space.get("fixed", {}), **(extra or {})}
        for name, value in zip(names, point):
            fields.update(zip(name, value) if isinstance(name, list) else [(name, value)])
        found.append(_config(fields, k))
    return found


def resident_ctas(cfg: KernelConfig) -> int:
    """CTAs of ``cfg`` one sm_90 SM holds at once: 2048 threads, 64K registers (an estimate: the
    config's register rule plus 24 for addresses and indices, in ptxas's 8-register steps, at most a
    launch bound's cap), and for "wgmma" and "mma" rings the SM's shared memory."""
    regs = -(-(cfg.register_rule[0] + 24) // 8) * 8
    if cfg.min_ctas:  # the launch bound caps the allocation (ptxas spills the rest)
        regs = min(regs, cfg.register_cap)
    return min(2048 // cfg.threads, SM_REGISTERS // (cfg.threads * regs), cfg.smem_ctas)


# Per-config rules a space may name (value: the rule's parameter), beyond the config check.
RULES = {
    # sliced tiles won only with short CTAs at K <= 4096 (the H200 sweep), with 5-32 trips above it (M = 8)
    "max_k_trips": lambda cfg, n, k, limit, sms: k // cfg.k_step <= limit,
    "min_k_trips": lambda cfg, n, k, limit, sms: k // cfg.k_step >= limit,
    # multi-group mma CTAs above 512 threads spilled
    "max_threads": lambda cfg, n, k, limit, sms: cfg.threads <= limit,
    # a cap that does not cap is a plain grid
    "persist_caps_grid": lambda cfg, n, k, _, sms: n // cfg.cols_per_cta > cfg.persist,
    # a walk whose CTAs cannot all be resident runs in waves, which is what it exists to avoid
    "persist_resident": lambda cfg, n, k, _, sms: cfg.persist <= sms * resident_ctas(cfg),
    # a tail costs its masks: offered where N needs it, and only there
    "tail_where_needed": lambda cfg, n, k, _, sms: cfg.tail == bool(n % cfg.cols_per_cta),
}


def _ctas_within(found: list[KernelConfig], n: int, factor_cap) -> list[KernelConfig]:
    """Configs within ``factor`` of the most CTAs any of them reaches (that most capped at ``cap``)."""
    factor, cap = factor_cap
    if not found:
        return found
    most = max(n // c.cols_per_cta for c in found)
    return [c for c in found if n // c.cols_per_cta * factor >= min(most, cap)]


# Rules over a space's whole admissible set for one cell.
CELL_RULES = {"ctas_within": _ctas_within}


def admissible(cfg: KernelConfig, n: int, k: int, rules=(), sms: int = H200_SMS) -> bool:
    """The one filter: the config check for this shape, then each named per-config rule of the space."""
    try:
        cfg.check(n=n, k=k)
    except ConfigError:
        return False
    return all(RULES[name](cfg, n, k, value, sms) for name, value in rules if name in RULES)


def space_candidates(name: str, n: int, k: int, m: int, extra: dict | None = None) -> list[KernelConfig]:
    """The admissible configs of one named space for one cell."""
    data = spaces()
    (space,) = [s for s in data["spaces"] if s["name"] == name]
    rules = space.get("rules", [])
    found = [c for c in expand(space, n, k, m, extra) if admissible(c, n, k, rules, data["sms"])]
    for rule, value in rules:
        if rule in CELL_RULES:
            found = CELL_RULES[rule](found, n, value)
    return found


def candidates(n: int, k: int, m: int, extra: dict | None = None, arch: str = "sm_90a") -> list[KernelConfig]:
    """Candidate configs for one cell: every space of kernels/candidates.json for ``arch`` in file order, each filtered.

    ``extra`` sets fields on every candidate (a cell that needs a config feature, e.g. a bias); a space with
    ``archs`` applies only to those (kind "wgmma" compiles for sm_90a alone).
    """
    return [
        c
        for space in spaces()["spaces"]
        if arch in space.get("archs", [arch])
        for c in space_candidates(space["name"], n, k, m, extra)
    ]


def max_candidates() -> int:
    """The most candidates one cell of the sm_90a seed set may get (the spaces file's bound)."""
    return spaces()["max_candidates"]


def slice_candidates(n: int, k: int, m: int) -> list[KernelConfig]:
    """The sliced mma configs for one cell."""
    return space_candidates("slice", n, k, m)


def persist_candidates(n: int, k: int, m: int) -> list[KernelConfig]:
    """The persistent SIMT configs for one cell (grids that cap and can be resident at once on the H200)."""
    return space_candidates("persist", n, k, m)


def rejections(n: int, k: int, m: int) -> str:
    """Which config rules the spaces' configs break for one cell, most common first: why it has no candidate."""
    counts: dict = {}
    for space in spaces()["spaces"]:
        for cfg in expand(space, n, k, m):
            try:
                cfg.check(n=n, k=k)
                rule = "a space rule"
            except ConfigError as exc:
                rule = str(exc).split(":")[0]
            counts[rule] = counts.get(rule, 0) + 1
    return ", ".join(f"{rule} x{count}" for rule, count in sorted(counts.items(), key=lambda kv: -kv[1])) or "no space"
