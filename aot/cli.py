"""``skinny-gemm`` / ``python -m skinny_gemm``: build, verify, list, env, plan, bench, tune, coverage."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..kernels.config import DECODE_MS
from ..runtime.version import __version__

# What a verb imports from outside the standard library, by import name, and the requirement that brings it: the
# wheel's dependencies and extras (pyproject.toml). `pip install --no-deps` skips them; a verb that finds one
# missing says so in one line instead of a traceback.
PIP_REQUIREMENT = {
    "cuda": "cuda-bindings>=13,<14",
    "cutlass": "nvidia-cutlass-dsl[cu13]==4.8.1",
    "matplotlib": "matplotlib>=3.8",
    "numpy": "numpy>=1.26",
    "torch": "torch>=2.11,<2.14",
    "tqdm": "tqdm>=4.66",
}

DESCRIPTION = """\
skinny-gemm: AOT-compiled skinny BF16 GEMMs (1-16 tokens x large weights) for LLM decode.

Typical flow: `build` compiles every plan-table entry into cubins plus a manifest
(CPU only, needs nvidia-cutlass-dsl); `verify` proves a build dir or a wheel is
whole (no compiler needed); `env` shows what the runtime loaded on this machine.
"""


def _archs(value: str) -> list[str]:
    from ..runtime.manifest import CAPABILITY_FOR_ARCH

    archs = [a.strip() for a in value.split(",") if a.strip()]
    bad = [a for a in archs if a not in CAPABILITY_FOR_ARCH]
    if bad or not archs:
        raise argparse.ArgumentTypeError(f"unknown arch {bad or value!r}; choose from {sorted(CAPABILITY_FOR_ARCH)}")
    return archs


def cmd_build(args) -> int:
    """Compile the plan tables into <out>/<arch>/."""
    from .build import PACKAGE_ROOT, BuildError, build, main_summary
    from .plans import PlanError

    out = Path(args.out) if args.out else PACKAGE_ROOT / "artifacts"
    for arch in args.arch:
        try:
            result = build(
                arch, out, plan_file=args.plan, cache_dir=args.cache_dir, jobs=args.jobs, progress=not args.quiet
            )
        except (BuildError, PlanError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        except ModuleNotFoundError as exc:  # the compile workers import the kernels, which import cutlass
            if not (exc.name or "").startswith("cutlass"):
                raise
            print("error: build needs nvidia-cutlass-dsl (pip install nvidia-cutlass-dsl==4.8.1)", file=sys.stderr)
            return 2
        print(main_summary(result))
    return 0


def cmd_verify(args) -> int:
    """Check a build dir or wheel; one line per problem, non-zero exit if any."""
    from ..runtime.artifacts import artifacts_root
    from .verify import verify

    status = 0
    # No path: what the loader would load ($SKINNY_GEMM_ARTIFACTS or the package's artifacts).
    for path in args.paths or [artifacts_root()]:
        archs, problems = verify(Path(path), tree=args.tree)
        for line in problems:
            print(f"FAIL {line}")
        if problems:
            status = 1
        else:
            print(f"OK {path}: {', '.join(archs)} verified")
    return status


def cmd_list(args) -> int:
    """Print the plan entries of a manifest (or plan table) as a table."""
    from .build import PACKAGE_ROOT
    from .plans import load, plan_path

    for arch in args.arch:
        path = Path(args.plan) if args.plan else plan_path(arch)
        try:
            _, entries = load(path)
        except (ValueError, OSError, KeyError, TypeError, AttributeError) as exc:  # PlanError is a ValueError
            print(
                f"error: {exc}" if str(path) in str(exc) else f"error: {path}: not a plan table ({exc!r})",
                file=sys.stderr,
            )
            return 2
        print(
            f"# {arch}: {len(entries)} entries, {len({e.config for e in entries})} variants ({path.relative_to(PACKAGE_ROOT) if path.is_relative_to(PACKAGE_ROOT) else path})"
        )
        print(f"{'n':>6} {'k':>6} {'m':>2}  {'variant':<42} provenance")
        for e in entries:
            prov = e.provenance
            note = (
                prov["kind"]
                if prov["kind"] == "heuristic"
                else f"measured {prov.get('speedup', '?')}x {prov.get('gpu', '')} {prov.get('date', '')}"
            )
            print(f"{e.n:>6} {e.k:>6} {e.m:>2}  {e.config.name:<42} {note}")
    return 0


def cmd_env(args) -> int:
    """Print GPU, driver, manifest in use and what the runtime loaded or refused."""
    from ..runtime.diagnostics import env_report

    print(env_report())
    return 0


def cmd_plan(args) -> int:
    """Write heuristic plan tables for an arch's seed set (overwrites measured ones: use with care), or report a catalogue model's."""
    from .models import ModelError
    from .plans import PlanError, plan_models, write_heuristic

    if args.model or args.all:
        try:
            print(plan_models(args.arch[0], args.model, args.tp, args.all, args.m, args.out))
        except (ModelError, PlanError) as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        return 0
    if not args.shapes:
        print("error: plan needs --shapes FILE, --model SLUG or --all", file=sys.stderr)
        return 2
    try:
        written = write_heuristic(args.arch, Path(args.shapes), args.out, args.force)
    except PlanError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_coverage(args) -> int:
    """Which per-rank linears of a model this wheel's plans cover (runtime/coverage.py)."""
    from ..runtime.coverage import main as coverage_main

    return coverage_main(args)


def parser() -> argparse.ArgumentParser:
    """The argument parser, with a help text per verb."""
    p = argparse.ArgumentParser(
        prog="skinny-gemm", description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--version", action="version", version=f"skinny-gemm {__version__}")
    sub = p.add_subparsers(dest="verb", metavar="VERB")
    from ..runtime.manifest import ARCHS

    all_archs = ",".join(ARCHS)

    b = sub.add_parser("build", help="compile plan tables into cubins + manifest (CPU, needs nvidia-cutlass-dsl)")
    b.add_argument(
        "--arch", type=_archs, default=_archs(all_archs), help=f"comma-separated targets (default {all_archs})"
    )
    b.add_argument("--out", help="output root; writes <out>/<arch>/ (default: the package's artifacts/)")
    b.add_argument("--plan", help="plan table to build instead of kernels/plans/<arch>.json (one arch only)")
    b.add_argument("--cache-dir", help="compiled-cubin cache (default $SKINNY_GEMM_CACHE or ~/.cache/skinny-gemm)")
    b.add_argument("--jobs", type=int, help="parallel compile processes (default: CPU count)")
    b.add_argument("--quiet", action="store_true", help="no progress bar")
    b.set_defaults(func=cmd_build)

    v = sub.add_parser(
        "verify", help="check a build dir or wheel: hashes, ELF arch, symbols, param ABI, staleness, orphans"
    )
    v.add_argument(
        "paths",
        nargs="*",
        help="build dirs (holding <arch>/ or one <arch>/) or .whl files (default: installed artifacts)",
    )
    v.add_argument(
        "--tree",
        type=Path,
        help="source tree the build must match (default: the package running verify; a wheel is checked against itself)",
    )
    v.set_defaults(func=cmd_verify)

    ls = sub.add_parser("list", help="print plan entries and their variants")
    ls.add_argument("--arch", type=_archs, default=_archs(all_archs))
    ls.add_argument("--plan", help="a plan table file instead of kernels/plans/<arch>.json")
    ls.set_defaults(func=cmd_list)

    e = sub.add_parser("env", help="GPU, driver, manifest in use, variants loaded and refused")
    e.set_defaults(func=cmd_env)

    pl = sub.add_parser("plan", help="heuristic (unmeasured) plan tables: a seed set (--shapes) or catalogue models")
    pl.add_argument("--arch", type=_archs, default=_archs(all_archs))
    pl.add_argument("--shapes", help="the model's shapes file (glm53-flash-shapes.json): writes the table to --out")
    pl.add_argument(
        "--model", help="a catalogue slug (kernels/models/<slug>.json): report its BF16 cells' heuristic entries"
    )
    pl.add_argument("--all", action="store_true", help="every catalogue model at every TP it lists")
    pl.add_argument(
        "--tp", type=int, nargs="+", help="with --model/--all: only these TP sizes (default: every TP listed)"
    )
    pl.add_argument("--m", type=int, nargs="+", default=list(DECODE_MS), help="token counts (default 1 2 4 8 16)")
    pl.add_argument("--out", type=Path, help="write the heuristic plan table here (never into the installed package)")
    pl.add_argument("--force", action="store_true", help="replace an existing plan table")
    pl.set_defaults(func=cmd_plan)

    from ..runtime import coverage

    cov = sub.add_parser(
        "coverage",
        help="which per-rank linears of a model vLLM would route to this wheel's plans",
        description=coverage.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    coverage.add_arguments(cov)
    cov.set_defaults(func=cmd_coverage)

    from . import bench, tune

    raw = argparse.RawDescriptionHelpFormatter
    bench.add_arguments(
        sub.add_parser(
            "bench",
            help="plans vs cuBLAS on this GPU: per entry, decode step, startup",
            description=bench.__doc__,
            formatter_class=raw,
        )
    )
    tune.add_arguments(
        sub.add_parser(
            "tune",
            help="generate, build, measure candidate configs; write the plan table",
            description=tune.__doc__,
            formatter_class=raw,
        )
    )
    return p


def main(argv: list[str] | None = None) -> int:
    """Entry point of the console script."""
    p = parser()
    args = p.parse_args(argv)
    if args.verb is None:  # `skinny-gemm` / `python -m skinny_gemm` alone: the verbs, as --help lists them
        p.print_help()
        return 0
    try:
        return args.func(args)
    except ModuleNotFoundError as exc:
        name = exc.name or ""
        if name not in PIP_REQUIREMENT:  # a submodule of an installed package (a broken or other version): traceback
            raise
        print(
            f"error: {args.verb} needs {name}, not installed here (pip install '{PIP_REQUIREMENT[name]}')",
            file=sys.stderr,
        )
        return 2
    except BrokenPipeError:  # `skinny-gemm list | head`: the reader left; not an error
        sys.stderr.close()
        return 0
