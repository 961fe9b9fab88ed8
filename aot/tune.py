"""Tune plan tables: prepare candidates on the CPU machine, measure them on the GPU, write the plan table.

  skinny-gemm tune prepare --arch sm_90a --shapes kernels/models/glm-5.3-flash.json --out DIR   (CPU, compiles)
  skinny-gemm tune measure DIR --results results.json                             (GPU, no compiler)
  skinny-gemm tune write results.json                                             (CPU, writes kernels/plans/<arch>.json)

`prepare` generates candidate configs per (n, k, m) cell (or takes them from plan tables,
`--from-plans`) and compiles them with the normal build (one manifest, no plans); where the
model file (seed set) or the one catalogue model has a served step (its "step" key), every
candidate also gets its no-PDL twin, and the served step of each TP at each M goes into
cells.json (`--no-decode`: none). `measure` checks every candidate against a float64
reference and times it against cuBLAS with the cold-L2 graph method (aot/measure.py), each
cell in a chain of its own shape; then it re-ranks each cell's fastest winners inside the
served step (aot/decode_phase.py: one CUDA graph of the whole step per TP, the ops between
the projections included, the other cells on their current choice, passes in order of each
shape's share of the step, then each kernel family swapped out whole; PDL on and off compete
in every entry), and keeps an M's step choices only if a repeated whole-step comparison
against every cell on its alone-fastest candidate (cuBLAS where the passes chose it or found it
faster than that candidate) confirms them. `write` keeps, per cell, the
decode-step choice or else the fastest correct candidate, if it beats cuBLAS by at least 5%,
with measured provenance. Cells that do not win stay on cuBLAS.

Why the second phase: a same-shape chain flatters kernels that load weight
before the PDL wait. Short kernels then cascade (each launches the next at
its start, so many are resident at once, all streaming), which cannot
happen between the long GEMMs of a real step: plans picked alone summed to
1032 us per TP4 step yet ran it in 1101 us; picking in the step brought
that to 1017 us (H200, GLM-5.3-Flash).
"""

from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path

from .decode_phase import CONFIRM_TRIALS, DECODE_PASSES, DECODE_TOP
from .prepare import FROM_RESULTS_BEST
from .results import CONFIRM_MARGIN, MIN_SPEEDUP


def add_arguments(p) -> None:
    """Register `tune`'s sub-verbs."""
    sub = p.add_subparsers(dest="phase", metavar="PHASE")
    sub.required = True
    pr = sub.add_parser("prepare", help="generate and compile candidates (CPU, needs nvidia-cutlass-dsl)")
    pr.add_argument("--arch", default="sm_90a")
    pr.add_argument(
        "--shapes",
        type=Path,
        help="the model file (kernels/models/glm-5.3-flash.json): its seed set gives the cells, its "
        "served step (the 'step' key) the decode phase; a file without a step skips that phase",
    )
    pr.add_argument(
        "--no-pdl-twins",
        dest="twins",
        action="store_false",
        help="do not add each candidate's no-PDL twin (added by default where the model file has a "
        "served step: PDL is then a per-entry choice of the decode phase)",
    )
    pr.add_argument(
        "--from-plans",
        type=Path,
        nargs="+",
        metavar="PLAN",
        help="each cell's candidates are the distinct configs these plan tables "
        "(kernels/plans/*.json format) hold for its (n, k, m), no cost-model cut, with their no-PDL twins "
        "where there is a decode phase (unless --no-pdl-twins); a cell none holds is skipped",
    )
    pr.add_argument(
        "--from-results",
        type=Path,
        nargs="+",
        metavar="RESULTS",
        help="also each cell's --best fastest exact candidates in these `tune measure` results (a previous "
        "run's front beside a new sweep); like --from-plans, no cut, twins as there",
    )
    pr.add_argument(
        "--best",
        type=_at_least_one,
        metavar="N",
        help=f"with --from-results: how many of each cell's fastest candidates (default {FROM_RESULTS_BEST})",
    )
    pr.add_argument(
        "--no-decode",
        dest="decode",
        action="store_false",
        help="write no decode steps: `tune measure` only times (and checks) each cell alone",
    )
    pr.add_argument(
        "--model",
        help="instead: a catalogue slug (kernels/models/<slug>.json), its BF16 cells; "
        "its served step (if it has one) at every asked TP the step states gives the decode phase",
    )
    pr.add_argument("--all", action="store_true", help="instead: every catalogue model at every TP it lists")
    pr.add_argument("--tp", type=int, nargs="+", help="with --model/--all: only these TP sizes")
    pr.add_argument(
        "--top",
        type=int,
        metavar="N",
        help="time only each cell's N best candidates by the cost model (plus the best of each family)",
    )
    pr.add_argument(
        "--per-family",
        type=int,
        default=2,
        metavar="F",
        help="with --top: also each kernel family's F best predicted (default 2)",
    )
    pr.add_argument("--out", required=True, type=Path, help="candidate directory to create")
    pr.add_argument("--jobs", type=int)
    pr.add_argument(
        "--m",
        type=int,
        nargs="+",
        metavar="M",
        help="only the cells of these token counts (default: every M of the seed set; catalogue: 1 2 4 8 16)",
    )
    me = sub.add_parser("measure", help="check and time candidates vs cuBLAS (GPU, from the installed wheel)")
    me.add_argument("dir", type=Path, help="a directory made by `tune prepare`")
    me.add_argument("--results", required=True, type=Path, help="results JSON to write")
    me.add_argument("--trials", type=int, default=5, help="timed replays per graph; the median is kept (default 5)")
    me.add_argument(
        "--decode-top",
        type=int,
        default=DECODE_TOP,
        metavar="N",
        help=f"re-time each cell's N fastest winners inside the whole decode step (default {DECODE_TOP}; "
        "0 skips that phase)",
    )
    me.add_argument(
        "--decode-passes",
        type=_at_least_one,
        default=DECODE_PASSES,
        metavar="N",
        help=f"passes of that phase over the cells; each pass re-times every cell with the others on "
        f"their latest choice, the last pass decides (default {DECODE_PASSES})",
    )
    me.add_argument(
        "--decode-read-cap",
        type=_at_least_one,
        metavar="MB",
        help="cap each read stand-in of the served step (attention, KDA, MoE, FP8 weights) at MB "
        "megabytes: the ops stay between the GEMMs, their time and noise shrink (default: the step's bytes)",
    )
    me.add_argument(
        "--confirm-trials",
        type=_at_least_zero,
        metavar="N",
        help=f"replays per graph of the confirm step, which keeps an M's decode choices only if the "
        f"whole step beats every cell on its alone-fastest by {CONFIRM_MARGIN * 100:g}%% (default "
        f"{CONFIRM_TRIALS} x --trials; 0 skips it and keeps the passes' choices)",
    )
    me.add_argument(
        "--decode-min-speedup",
        type=_positive,
        default=MIN_SPEEDUP,
        metavar="X",
        help=f"admit to that phase the candidates at X times cuBLAS's speed alone (default {MIN_SPEEDUP}, the plan's "
        "entry rule), and the no-PDL twin of each PDL one whatever its own; under the rule, near-ties are tried in "
        "the step, where a choice that the confirm step keeps is planned down to X (a twin: down to its PDL "
        "winner's X)",
    )
    mf = sub.add_parser("model-fit", help="refit the cost model on the committed H200 timings (CPU, numpy)")
    mf.add_argument("--out", type=Path, help="model JSON to write (default: the committed one next to the timings)")
    mc = sub.add_parser("model-check", help="how well the cost model predicts held-out timings (held out by shape)")
    mc.add_argument("--json", type=Path, help="also write the per-cell results here")
    mc.add_argument(
        "--by",
        choices=("shape", "m"),
        default="shape",
        help="hold out each (N, K) (default) or each token count M (how it extrapolates in M)",
    )
    wr = sub.add_parser("write", help="write kernels/plans/<arch>.json from measured results")
    wr.add_argument(
        "results",
        type=Path,
        nargs="*",
        help="results of `tune measure`; with several, a later file's cells replace an earlier one's",
    )
    wr.add_argument(
        "--runs",
        type=Path,
        metavar="RUNS_JSON",
        help="instead: the runs listed in a runs.json, in its order (the committed plan: "
        "kernels/plans/tuning/sm_90a/runs.json)",
    )
    wr.add_argument("--min-speedup", type=float, default=MIN_SPEEDUP)
    wr.add_argument(
        "--out",
        type=Path,
        help="the plan table to write (required: never the installed package's; in a "
        "source checkout kernels/plans/<arch>.json regenerates the committed one)",
    )
    p.set_defaults(func=main)


def _positive(text: str) -> float:
    """argparse type: a float > 0."""
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number > 0")
    return value


def _at_least_zero(text: str) -> int:
    """argparse type: an int >= 0."""
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} is not >= 0")
    return value


def _at_least_one(text: str) -> int:
    """argparse type: an int >= 1."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not >= 1")
    return value


def main(args) -> int:
    """Run one tuning phase; a bad request (unknown M, results of two archs, no cells) is one line on stderr, exit 2."""
    from .build import BuildError

    try:
        if args.phase == "prepare":
            from .prepare import prepare

            print(
                prepare(
                    args.arch,
                    args.shapes,
                    args.out,
                    args.jobs,
                    args.m,
                    args.model,
                    args.tp,
                    args.all,
                    args.top,
                    args.per_family,
                    args.twins,
                    args.from_plans,
                    args.decode,
                    args.from_results,
                    args.best,
                )
            )
        elif args.phase in ("model-fit", "model-check"):
            from . import costmodel

            if args.phase == "model-fit":
                print(costmodel.main(args.phase, args.out))
            else:
                print(costmodel.main(args.phase, args.json, args.by))
        elif args.phase == "measure":
            from .measure_cells import measure

            data = measure(
                args.dir,
                args.results,
                args.trials,
                decode_top=args.decode_top,
                decode_passes=args.decode_passes,
                read_cap_mb=args.decode_read_cap,
                confirm_trials=args.confirm_trials,
                decode_min_speedup=args.decode_min_speedup,
            )
            print(f"measured {len(data['cells'])} cells on {data['gpu']} -> {args.results}")
        else:
            from .results import results_files, write_plan

            path, planned, skipped = write_plan(results_files(args.results, args.runs), args.min_speedup, args.out)
            print(f"wrote {path}: {planned} cells planned, {skipped} left on cuBLAS")
    except (ValueError, OSError, BuildError) as exc:
        print(f"skinny-gemm tune {args.phase}: error: {exc}", file=sys.stderr)
        return 2
    except ModuleNotFoundError as exc:  # prepare's compile workers import the kernels, which import cutlass
        if not (exc.name or "").startswith("cutlass"):
            raise
        print(
            f"skinny-gemm tune {args.phase}: error: needs nvidia-cutlass-dsl (pip install nvidia-cutlass-dsl==4.8.1)",
            file=sys.stderr,
        )
        return 2
    return 0
