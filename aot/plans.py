"""Plan tables: ``kernels/plans/<arch>.json`` maps (n, k, m) to a kernel config, with provenance."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..kernels.config import ConfigError, KernelConfig
from ..runtime.manifest import CAPABILITY_FOR_ARCH, dumps

PLANS_DIR = Path(__file__).resolve().parent.parent / "kernels" / "plans"
SHAPES_FILE = "glm53-flash-shapes.json"

HEURISTIC_RULE = (
    "heuristic: vec=8; unroll=2 (1 if K is short); k_threads = the largest power of two <= 256 "
    "whose step divides K; 256 threads; cols = the largest of 4, 2, 1 that divides N and keeps "
    ">= 2 waves of CTAs on 132 SMs; runtime K; PDL on. Not measured on any GPU."
)


def decode_order(model: dict, tp: int, arch: str = "sm_90a") -> list[tuple[str, int, int]]:
    """The BF16 GEMMs of one decode step in layer order: (linear, n, k) per call.

    The order is the model file's ``step`` (aot/steps.py); the GEMMs are the arch's seed-set
    linears where the model has that seed set, else its BF16 linears.
    """
    from . import steps

    steps.validate(model, model.get("name", "model"))
    return steps.gemm_calls(steps.build(model, tp, 1, arch=arch))


def decode_steps(arch: str, shapes_file: Path) -> dict[int, list[tuple[int, int]]]:
    """Per TP of an arch's seed set, the (n, k) of every GEMM of one decode step; {} if the model file has
    no step or the step is not stated for every TP of the seed set."""
    from . import steps

    data = json.loads(Path(shapes_file).read_text())
    seed = data["seed_plan_sets"][arch]
    tps = seed["tp"] if isinstance(seed["tp"], list) else [seed["tp"]]
    if "step" not in data:
        return {}
    steps.validate(data, Path(shapes_file).name)
    if not set(tps) <= set(data["step"]["tp"]):
        return {}
    return {tp: [(n, k) for _, n, k in decode_order(data, tp, arch)] for tp in tps}


class PlanError(ValueError):
    """A plan table that is malformed or names an invalid config."""


@dataclass(frozen=True)
class PlanEntry:
    """One (n, k, m) -> config row."""

    n: int
    k: int
    m: int
    config: KernelConfig
    provenance: dict


def plan_path(arch: str) -> Path:
    """Where the plan table for ``arch`` lives."""
    return PLANS_DIR / f"{arch}.json"


def load(path: Path) -> tuple[dict, list[PlanEntry]]:
    """Read a plan table; every entry passes the config's validity check for its shape."""
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise PlanError(f"{path}: unreadable plan table ({exc})") from None
    header = raw.get("header", {})
    if header.get("arch") not in CAPABILITY_FOR_ARCH:
        raise PlanError(f"{path}: header arch {header.get('arch')!r} is not one of {sorted(CAPABILITY_FOR_ARCH)}")
    entries, seen = [], set()
    for row in raw.get("entries", []):
        key = (row["n"], row["k"], row["m"])
        if key in seen:
            raise PlanError(f"{path}: duplicate entry {key}")
        seen.add(key)
        try:
            cfg = KernelConfig.from_json(row["config"])
            cfg.check(n=row["n"], k=row["k"])
        except ConfigError as exc:
            raise PlanError(f"{path}: entry (n={key[0]}, k={key[1]}, m={key[2]}): {exc}") from None
        if cfg.m != row["m"]:
            raise PlanError(f"{path}: entry {key} has a config for m={cfg.m}")
        prov = row.get("provenance")
        if not isinstance(prov, dict) or prov.get("kind") not in ("measured", "heuristic"):
            raise PlanError(f"{path}: entry {key} needs provenance kind 'measured' or 'heuristic'")
        entries.append(PlanEntry(*key, cfg, prov))
    return header, sorted(entries, key=lambda e: (e.n, e.k, e.m))


def render(header: dict, entries: list[PlanEntry]) -> str:
    """The canonical, sorted JSON text of a plan table."""
    rows = [
        {"n": e.n, "k": e.k, "m": e.m, "config": e.config.to_json(), "provenance": e.provenance}
        for e in sorted(entries, key=lambda e: (e.n, e.k, e.m))
    ]
    return dumps({"header": header, "entries": rows})


def heuristic_config(n: int, k: int, m: int) -> KernelConfig:
    """The unmeasured starting config for a shape (HEURISTIC_RULE says how it is chosen)."""
    unroll = 2 if k >= 2 * 8 * 32 else 1
    k_threads = 256
    while k_threads > 1 and k % (k_threads * 8 * unroll):
        k_threads //= 2
    groups = 256 // k_threads
    cols = 1
    for c in (4, 2):
        if n % (groups * c) == 0 and n // (groups * c) >= 2 * 132:
            cols = c
            break
    cfg = KernelConfig(m=m, threads=256, k_threads=k_threads, cols=cols, vec=8, unroll=unroll)
    cfg.check(n=n, k=k)
    return cfg


def seed_shapes(arch: str, shapes_file: Path) -> list[tuple[int, int, int]]:
    """The (n, k, m) cells of an arch's seed set in the model's shapes file."""
    data = json.loads(Path(shapes_file).read_text())
    seed = data["seed_plan_sets"][arch]
    tps = seed["tp"] if isinstance(seed["tp"], list) else [seed["tp"]]
    shapes = {tuple(data["linears"][name]["tp"][str(tp)]) for name in seed["linears"] for tp in tps}
    cells = {(n, k, m) for n, k in shapes for m in seed["planned_M"]}
    if arch == "sm_121":
        # The SM121 pull request keeps (4096, 8192) at M=1 on cuBLAS (1.01x).
        cells.discard((4096, 8192, 1))
    return sorted(cells)


def heuristic_table(arch: str, shapes_file: Path) -> str:
    """A whole plan table of heuristic entries for an arch's seed set."""
    cap = CAPABILITY_FOR_ARCH[arch]
    header = {
        "arch": arch,
        "capability": list(cap),
        "dtype": "bfloat16",
        "source": f"seed set '{arch}' of {SHAPES_FILE}; no measurements yet",
    }
    entries = [
        PlanEntry(n, k, m, heuristic_config(n, k, m), {"kind": "heuristic", "rule": HEURISTIC_RULE})
        for n, k, m in seed_shapes(arch, shapes_file)
    ]
    return render(header, entries)
