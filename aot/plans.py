"""Plan tables: ``kernels/plans/<arch>.json`` maps (n, k, m) to a kernel config, with provenance."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from ..kernels.config import MAX_M, MMA_K_STEP, TAIL_K_GRAIN, ConfigError, KernelConfig
from ..runtime.manifest import CAPABILITY_FOR_ARCH, dumps

PLANS_DIR = Path(__file__).resolve().parent.parent / "kernels" / "plans"
SHAPES_FILE = "glm53-flash-shapes.json"

HEURISTIC_RULE = (
    "heuristic: vec=8; unroll=2 (1 if K is short); k_threads = the largest power of two <= 256 "
    "whose step divides K; 256 threads; cols = the largest of 4, 2, 1 that divides N and keeps "
    ">= 2 waves of CTAs on 132 SMs; runtime K; PDL on. Not measured on any GPU."
)
HEURISTIC_RULE_WIDE = (
    "heuristic (wide): M <= 4 where the seed rule leaves fewer than 32 threads on K or fails: simt, 256 threads "
    "on K (halved while one step of 8 x unroll x k_threads passes K), unroll 2 if K >= 4096, the first of cols "
    "4, 2, 1 that keeps >= 2 waves on 132 SMs; M > 4: mma, one 8-row tile per CTA, 4 stages of one 32-k step, "
    "8 warps on K (halved while a K step passes K; below 128 k the simt rule), prefetch off; tail on where K or N is not a whole number "
    "of steps or CTAs; bias as asked; PDL on. Not measured on any GPU."
)
# SMs of the H200 (the seed rule's wave count)
SMS = 132


# sm_90a seed set (DESIGN.md): the FP8 checkpoint keeps these linears in BF16.
KDA_LAYER = ("kda_in_proj", "kda_f_b_proj", "kda_g_b_proj", "kda_o_proj")
MLA_LAYER = ("mla_fused_qkv_a", "mla_q_b_proj", "indexer_wq_b", "indexer_wk", "mla_o_proj")


def decode_order(shapes: dict, tp: int) -> list[tuple[str, int, int]]:
    """The BF16 GEMMs of one decode step in layer order: (name, n, k) per call.

    34 KDA and 11 MLA layers; the exact interleave is not in the shapes file, so
    MLA layers are spread evenly (one after every three KDA layers), then the LM head.
    """
    lin = shapes["linears"]
    kda, mla = lin["kda_in_proj"]["calls_per_step"], lin["mla_fused_qkv_a"]["calls_per_step"]
    order, k_left, m_left = [], kda, mla
    while k_left or m_left:
        for _ in range(min(3, k_left)):
            order += [(name, *lin[name]["tp"][str(tp)]) for name in KDA_LAYER]
            k_left -= 1
        if m_left:
            order += [(name, *lin[name]["tp"][str(tp)]) for name in MLA_LAYER]
            m_left -= 1
    order.append(("lm_head", *lin["lm_head"]["tp"][str(tp)]))
    return order


def decode_steps(arch: str, shapes_file: Path) -> dict[int, list[tuple[int, int]]]:
    """Per TP of an arch's seed set, the (n, k) of every GEMM of one decode step; {} if the set has other linears."""
    data = json.loads(Path(shapes_file).read_text())
    seed = data["seed_plan_sets"][arch]
    if not set(seed["linears"]) <= {*KDA_LAYER, *MLA_LAYER, "lm_head"}:
        return {}
    tps = seed["tp"] if isinstance(seed["tp"], list) else [seed["tp"]]
    return {tp: [(n, k) for _, n, k in decode_order(data, tp)] for tp in tps}


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


def heuristic_config(n: int, k: int, m: int, bias: bool = False) -> KernelConfig:
    """The unmeasured starting config for a shape (HEURISTIC_RULE and HEURISTIC_RULE_WIDE say how it is chosen).

    Raises PlanError naming the rule when no config of the kernels serves the shape; never another error.
    """
    for name, value in (("n", n), ("k", k), ("m", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(f"no config for (n={n}, k={k}, m={m}): rule 'positive': {name}={value!r} must be a positive int")
    if m > MAX_M:
        raise PlanError(f"no config for (n={n}, k={k}, m={m}): rule 'm range': m={m} exceeds {MAX_M}")
    if k % TAIL_K_GRAIN:
        raise PlanError(
            f"no config for (n={n}, k={k}, m={m}): rule 'k tail': K={k} is not a multiple of {TAIL_K_GRAIN} (16-byte rows)"
        )
    if m <= 4:
        cfg = _seed_simt(n, k, m, bias)
        if cfg is None:
            cfg = _tail_simt(n, k, m, bias)
    else:
        cfg = _mma(n, k, m, bias)
        try:
            cfg.check(n=n, k=k)
        except ConfigError:
            cfg = _tail_simt(n, k, m, bias)  # K below the smallest mma step
    try:
        cfg.check(n=n, k=k)
    except ConfigError as exc:
        raise PlanError(f"no config for (n={n}, k={k}, m={m}): {exc}") from None
    return cfg


def heuristic_rule(cfg: KernelConfig) -> str:
    """The provenance text of a heuristic config: the seed rule, or the wide one (tails, bias, M > 4)."""
    return HEURISTIC_RULE if cfg.kind == "simt" and not cfg.tail and not cfg.bias else HEURISTIC_RULE_WIDE


def _seed_simt(n: int, k: int, m: int, bias: bool) -> KernelConfig | None:
    """HEURISTIC_RULE (the seed tables' rule), or None where it fails or leaves fewer than a warp on K."""
    unroll = 2 if k >= 2 * 8 * 32 else 1
    k_threads = 256
    while k_threads > 1 and k % (k_threads * 8 * unroll):
        k_threads //= 2
    groups = 256 // k_threads
    cols = 1
    for c in (4, 2):
        if n % (groups * c) == 0 and n // (groups * c) >= 2 * SMS:
            cols = c
            break
    cfg = KernelConfig(m=m, threads=256, k_threads=k_threads, cols=cols, vec=8, unroll=unroll, bias=bias)
    try:
        cfg.check(n=n, k=k)
    except ConfigError:
        return None
    return cfg if k_threads >= 32 else None


def _tail_simt(n: int, k: int, m: int, bias: bool) -> KernelConfig:
    """The first of cols 4, 2, 1 (with >= 2 waves) that passes, 256 threads on K (halved while a step passes K); a tail
    only where the K step or the CTA's columns do not divide the shape."""
    unroll = 2 if k >= 2 * 8 * 256 else 1
    k_threads = 256
    while k_threads > 1 and k_threads * 8 * unroll > k:
        k_threads //= 2
    cfg = None
    for cols in (4, 2, 1):
        cfg = KernelConfig(m=m, threads=256, k_threads=k_threads, cols=cols, vec=8, unroll=unroll, bias=bias)
        cfg = dataclasses.replace(cfg, tail=bool(k % cfg.k_step or n % cfg.cols_per_cta))
        if cols > 1 and -(-n // cfg.cols_per_cta) < 2 * SMS:
            continue
        try:
            cfg.check(n=n, k=k)
            return cfg
        except ConfigError:
            continue
    return cfg


def _mma(n: int, k: int, m: int, bias: bool) -> KernelConfig:
    """M > 4: the tensor-core kernel (its cost is flat in M up to 16): one 8-row tile per CTA, 4 stages of
    one 32-k step, 8 warps on K (fewer if K is short); a tail only where the shape needs it."""
    k_threads = 256
    while k_threads > 32 and k_threads // 32 * MMA_K_STEP * 4 > k:
        k_threads //= 2
    cfg = KernelConfig(m=m, kind="mma", threads=k_threads, k_threads=k_threads, cols=8, vec=8, unroll=1, stages=4,
                       prefetch=False, bias=bias)
    return dataclasses.replace(cfg, tail=bool(k % cfg.k_step or n % cfg.cols_per_cta))


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
        PlanEntry(n, k, m, cfg, {"kind": "heuristic", "rule": heuristic_rule(cfg)})
        for n, k, m in seed_shapes(arch, shapes_file)
        for cfg in [heuristic_config(n, k, m)]
    ]
    return render(header, entries)
