"""Plan tables: ``kernels/plans/<arch>.json`` maps (n, k, m) to a kernel config, with provenance."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from ..kernels.config import DECODE_MS, H200_SMS, MAX_M_MMA, MMA_K_STEP, TAIL_K_GRAIN, ConfigError, KernelConfig
from ..runtime import modelfile
from ..runtime.jsonfile import Fields, InputError, printable, read_json
from ..runtime.manifest import CAPABILITY_FOR_ARCH, config_of, dumps, write_atomic

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
SMS = H200_SMS


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

    data, _, tps = _seed_set(arch, shapes_file)
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


def plan_target(arch: str, out: Path | None) -> Path:
    """Where a CLI verb may write a plan table: ``out``, which must be given. Without it the target would be
    the package's own table (``plan_path``), and a CLI command never writes into the installed package; in a
    source checkout (pyproject.toml beside the package) an explicit ``--out`` may name the committed table,
    which is how it is regenerated. Raises PlanError (one line) otherwise."""
    own = plan_path(arch)
    if out is None:
        raise PlanError(f"refusing to write the package's own plan table {own}: pass --out FILE")
    out = Path(out)
    root = PLANS_DIR.parent.resolve()
    installed = not (root / "pyproject.toml").is_file()
    if installed and out.resolve().is_relative_to(root):
        raise PlanError(f"refusing to write {out}: it is inside the installed package ({root}); pick a path outside")
    return out


def _read(path: Path, what: str):
    """``path``'s JSON through the one bounded reader, and its field checker; any problem is one PlanError line."""
    try:
        return read_json(path, what), Fields(path, PlanError)
    except InputError as exc:
        raise PlanError(str(exc)) from None


def load(path: Path) -> tuple[dict, list[PlanEntry]]:
    """Read a plan table; every entry passes the config's validity check for its shape. Raises PlanError with
    one line naming the file (and the entry and field)."""
    raw, f = _read(path, "plan table")
    header = f.obj(f.get(f.obj(raw, "the plan table"), "header"), "field 'header'")
    if header.get("arch") not in CAPABILITY_FOR_ARCH:
        f.fail("header field 'arch'", header.get("arch"), f"one of {sorted(CAPABILITY_FOR_ARCH)}")
    entries, seen = [], set()
    for i, row in enumerate(f.lst(f.get(raw, "entries"), "field 'entries'")):
        place = f"entries[{i}] "
        f.obj(row, f"entries[{i}]")
        key = tuple(f.pos_int(f.get(row, x, place), f"{place}field {x!r}") for x in ("n", "k", "m"))
        if key in seen:
            raise PlanError(f"{f.name}: duplicate entry {key}")
        seen.add(key)
        try:
            cfg = config_of(f.obj(f.get(row, "config", place), f"{place}field 'config'"), n=key[0], k=key[1])
        except ConfigError as exc:
            raise PlanError(f"{f.name}: entry (n={key[0]}, k={key[1]}, m={key[2]}): {exc}") from None
        if cfg.m != key[2]:
            raise PlanError(f"{f.name}: entry {key} has a config for m={cfg.m}")
        prov = row.get("provenance")
        if not isinstance(prov, dict) or prov.get("kind") not in ("measured", "heuristic"):
            raise PlanError(f"{f.name}: entry {key} needs provenance kind 'measured' or 'heuristic'")
        for name, value in prov.items():
            if not printable(name) or isinstance(value, str) and not printable(value):
                f.fail(f"{place}provenance field {ascii(name)}", value, "printable text")
        entries.append(PlanEntry(*key, cfg, prov))
    return header, sorted(entries, key=lambda e: (e.n, e.k, e.m))


def render(header: dict, entries: list[PlanEntry]) -> str:
    """The canonical, sorted JSON text of a plan table."""
    rows = [
        {"n": e.n, "k": e.k, "m": e.m, "config": e.config.to_json(), "provenance": e.provenance}
        for e in sorted(entries, key=lambda e: (e.n, e.k, e.m))
    ]
    return dumps({"header": header, "entries": rows})


def write_table(path: Path, header: dict, entries: list[PlanEntry]) -> Path:
    """The one writer of plan tables (the heuristic verbs and `tune write` all end here): ``render``'s text,
    through a temporary file and a rename, so a reader never sees half a table."""
    path = Path(path)
    write_atomic(path, render(header, entries))
    return path


def heuristic_config(n: int, k: int, m: int, bias: bool = False) -> KernelConfig:
    """The unmeasured starting config for a shape (HEURISTIC_RULE and HEURISTIC_RULE_WIDE say how it is chosen).

    Raises PlanError naming the rule when no config of the kernels serves the shape; never another error.
    """
    for name, value in (("n", n), ("k", k), ("m", m)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise PlanError(
                f"no config for (n={n}, k={k}, m={m}): rule 'positive': {name}={value!r} must be a positive int"
            )
    if m > MAX_M_MMA:
        # Above 16 tokens only kind "wgmma" runs, and it has no guess: such a cell is planned only once measured.
        raise PlanError(
            f"no config for (n={n}, k={k}, m={m}): rule 'm range': m={m} exceeds {MAX_M_MMA}, the heuristic's kinds' "
            "limit (M up to 32 runs only kind 'wgmma', planned from measurements)"
        )
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
    cfg = KernelConfig(
        m=m,
        kind="mma",
        threads=k_threads,
        k_threads=k_threads,
        cols=8,
        vec=8,
        unroll=1,
        stages=4,
        prefetch=False,
        bias=bias,
    )
    return dataclasses.replace(cfg, tail=bool(k % cfg.k_step or n % cfg.cols_per_cta))


def seed_shapes(arch: str, shapes_file: Path) -> list[tuple[int, int, int]]:
    """The (n, k, m) cells of an arch's seed set in the model's shapes file; PlanError (one line, naming the file
    and the field) on a file that is not one."""
    data, seed, tps = _seed_set(arch, shapes_file)
    f = Fields(shapes_file, PlanError)
    by_tp = {tp: {lin.name: lin for lin in modelfile.linears(data, tp)} for tp in tps}
    shapes = set()
    for name in seed["linears"]:  # checked by _seed_set: names of the file's linears
        for tp in tps:
            if name not in by_tp[tp]:
                raise PlanError(f"{f.name}: linears.{name}.tp field {str(tp)!r} missing")
            shapes.add((by_tp[tp][name].n, by_tp[tp][name].k))
    ms = [
        f.pos_int(m, f"seed_plan_sets.{arch}.planned_M[{i}]", MAX_M_MMA)  # heuristic tables: no guess past 16
        for i, m in enumerate(
            f.lst(f.get(seed, "planned_M", f"seed_plan_sets.{arch} "), f"seed_plan_sets.{arch}.planned_M")
        )
    ]
    cells = {(n, k, m) for n, k in shapes for m in ms}
    # cells a measurement left on cuBLAS (the model file says which and why)
    for i, cell in enumerate(f.lst(seed.get("cuBLAS_cells", []), f"seed_plan_sets.{arch}.cuBLAS_cells")):
        if type(cell) is not list or len(cell) != 3:
            f.fail(f"seed_plan_sets.{arch}.cuBLAS_cells[{i}]", cell, "[n, k, m]")
        cells.discard(tuple(cell))
    return sorted(cells)


def _seed_set(arch: str, shapes_file: Path) -> tuple[dict, dict, list[int]]:
    """The shapes file (a model file, read by runtime/modelfile.py), its seed set for ``arch`` and that set's TPs.

    The seed set is checked first, then that it names linears of the file, then the linears themselves: each
    refusal is one PlanError line naming the file and the field."""
    try:
        data = modelfile.read(shapes_file, "shapes file")
    except InputError as exc:
        raise PlanError(str(exc)) from None
    f = Fields(shapes_file, PlanError)
    sets = f.obj(f.get(data, "seed_plan_sets"), "field 'seed_plan_sets'")
    seed = f.obj(f.get(sets, arch, "seed_plan_sets "), f"seed_plan_sets.{arch}")
    tp = f.get(seed, "tp", f"seed_plan_sets.{arch} ")
    tps = [f.pos_int(t, f"seed_plan_sets.{arch}.tp") for t in (tp if type(tp) is list else [tp])]
    linears = f.obj(f.get(data, "linears"), "field 'linears'")
    for i, name in enumerate(
        f.lst(f.get(seed, "linears", f"seed_plan_sets.{arch} "), f"seed_plan_sets.{arch}.linears")
    ):
        if type(name) is not str or name not in linears:
            f.fail(f"seed_plan_sets.{arch}.linears[{i}]", name, "the name of one of its linears")
    problems = modelfile.problems(data, complete=False)
    if problems:
        raise PlanError(f"{f.name}: {problems[0]}")
    return data, seed, tps


def heuristic_table(arch: str, shapes_file: Path) -> tuple[dict, list[PlanEntry]]:
    """The header and heuristic entries of a whole plan table for an arch's seed set."""
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
    return header, entries


def write_heuristic(archs: list[str], shapes_file: Path, out: Path | None, force: bool) -> list[Path]:
    """`plan --shapes`: the heuristic table of each arch's seed set, written to ``out`` (one arch; never the
    package's own table, see ``plan_target``); an existing file only with ``force``. Returns the paths written;
    PlanError (one line) on any refusal, before anything is written."""
    if out is not None and len(archs) != 1:
        raise PlanError(f"--out {out} takes one arch (pass --arch sm_90a or --arch sm_121)")
    todo = []
    for arch in archs:
        path = plan_target(arch, out)
        if path.exists() and not force:
            raise PlanError(f"{path} exists; pass --force to replace it with heuristic entries")
        todo.append((path, heuristic_table(arch, shapes_file)))
    return [write_table(path, *table) for path, table in todo]


# The token counts the catalogue is planned for: vLLM's decode graph sizes up to 16 (catalogue.json).
CATALOGUE_MS = DECODE_MS


@dataclass(frozen=True)
class CatalogueCell:
    """One (n, k, m) cell of catalogue models: whether any layer using it has a bias, and which layers use it."""

    n: int
    k: int
    m: int
    bias: bool
    uses: tuple[str, ...]


def catalogue_cells(model_tps: list[tuple[str, int]], ms=CATALOGUE_MS) -> list[CatalogueCell]:
    """The cells of the BF16 candidate linears of (model slug, tp) pairs at token counts ``ms``, merged by shape."""
    from . import models

    found: dict = {}
    for slug, tp in model_tps:
        data = models.load(slug)
        if tp not in modelfile.tps(data):
            raise PlanError(f"{slug}: no shapes at TP {tp} (it lists {modelfile.tps(data)})")
        for lin in modelfile.linears(data, tp):
            if lin.skip_reason is None:
                bias, uses = found.get((lin.n, lin.k), (False, ()))
                found[(lin.n, lin.k)] = (bias or lin.bias, (*uses, f"{slug}@tp{tp}:{lin.name}"))
    return [
        CatalogueCell(n, k, m, bias, tuple(sorted(uses)))
        for (n, k), (bias, uses) in sorted(found.items())
        for m in sorted(ms)
    ]


def _heuristic_or_reason(cell: CatalogueCell) -> tuple[KernelConfig | None, str | None]:
    """heuristic_config for one cell, or why it cannot serve it (its rule); a biased cell asks for a bias config."""
    import inspect

    kwargs = {}
    if cell.bias:
        if "bias" not in inspect.signature(heuristic_config).parameters:
            return None, "bias: heuristic_config in this tree makes no bias config"
        kwargs["bias"] = True
    try:
        return heuristic_config(cell.n, cell.k, cell.m, **kwargs), None
    except (PlanError, ConfigError) as exc:
        return None, str(exc)
    except (ValueError, ArithmeticError, TypeError) as exc:  # the planner must report, never raise
        return None, f"heuristic_config failed: {type(exc).__name__}: {exc}"


def catalogue_plan(cells: list[CatalogueCell]) -> tuple[list[PlanEntry], dict]:
    """Heuristic entries for the cells heuristic_config serves, and {(n, k, m): reason} for the others (left to cuBLAS)."""
    entries, reasons = [], {}
    for cell in cells:
        cfg, reason = _heuristic_or_reason(cell)
        if cfg is None:
            reasons[(cell.n, cell.k, cell.m)] = reason
        else:
            prov = {"kind": "heuristic", "rule": heuristic_rule(cfg), "uses": list(cell.uses)}
            entries.append(PlanEntry(cell.n, cell.k, cell.m, cfg, prov))
    return entries, reasons


def catalogue_header(arch: str, what: str) -> dict:
    """The header of a plan table of catalogue entries (heuristic: built and verified in CI, shipped only once
    measured)."""
    return {
        "arch": arch,
        "capability": list(CAPABILITY_FOR_ARCH[arch]),
        "dtype": "bfloat16",
        "source": f"catalogue ({what}), kernels/models; heuristic, no measurements yet",
    }


def catalogue_table(arch: str, entries: list[PlanEntry], what: str) -> str:
    """The text of a plan table of catalogue entries."""
    return render(catalogue_header(arch, what), entries)


def catalogue_report(entries: list[PlanEntry], reasons: dict) -> str:
    """Lines for `plan --model`: the counts, then each cell left to cuBLAS with its rule."""
    cells = len(entries) + len(reasons)
    variants = len({e.config for e in entries})
    lines = [f"{cells} cells: {len(entries)} heuristic entries ({variants} variants), {len(reasons)} left to cuBLAS"]
    lines += [f"  no plan ({n}, {k}) m={m}: {why}" for (n, k, m), why in sorted(reasons.items())]
    return "\n".join(lines)


def model_tps(model: str | None, tps: list[int] | None, every: bool) -> list[tuple[str, int]]:
    """(slug, tp) pairs of a `--model SLUG [--tp N ...]` or `--all [--tp N ...]` request (default: every TP a model
    lists; with --all, a model without an asked TP is left out of it)."""
    from . import models

    slugs = sorted(modelfile.catalogue()) if every else [model]
    pairs = []
    for slug in slugs:
        listed = modelfile.tps(models.load(slug))
        for tp in tps or listed:
            if tp in listed:
                pairs.append((slug, tp))
            elif not every:
                raise PlanError(f"{slug}: no shapes at TP {tp} (it lists {listed})")
    if not pairs:
        raise PlanError(f"no catalogue model lists TP {tps}")
    return pairs


def plan_models(arch: str, model: str | None, tps: list[int] | None, every: bool, ms, out: Path | None) -> str:
    """`plan --model/--all`: heuristic entries for catalogue cells (written to ``out`` if given) and the report."""
    pairs = model_tps(model, tps, every)
    entries, reasons = catalogue_plan(catalogue_cells(pairs, ms))
    text = catalogue_report(entries, reasons)
    if out:
        what = "all models" if every else ", ".join(f"{s} tp{tp}" for s, tp in pairs)
        write_table(plan_target(arch, out), catalogue_header(arch, what), entries)
        text += f"\nwrote {out} (heuristic entries: build and verify them; a wheel ships only measured ones)"
    return text
