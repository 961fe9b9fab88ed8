"""Plan files whose entries are "mma" ring candidates, for `tune prepare --from-plans` (CPU).

    python docs/experiments/ring_candidates.py OUTDIR N,K [N,K ...] [--wide] [--unroll 1,2] [--fetch 128,256]
        [--per-sm 1,2,4] [--runs]

For each M in 8 and 16 and each (N, K), per CTA shape below (fetch 128 B, PDL), the deepest valid ring that
leaves two CTAs per SM and the deepest that leaves one, into plan files OUTDIR/ring-<i>.json, one config per
cell and file, so that `skinny-gemm tune prepare --model SLUG --m 8 16 --from-plans OUTDIR/ring-*.json ...`
times them all. This grid made the candidates of kernels/plans/tuning/sm_90a/tune-sm_90a-h200-*-tp1-ring.json;
the first sweep (docs/results/ring/tune-ring-first-sweep-llama-h200.json) had CTA shapes of 8-32 rows per warp.
The second sweep (the *-ring2.json runs) added --unroll 1,2,4 (a stage of 2 or 4 steps: each lane's copies of a
row cover 128 or 256 contiguous bytes per stage), --fetch 256 and, for the 8B models, --wide (lost: 10-20%
slower alone) and the whole-row copies of docs/experiments/ring-runs.patch (lost: 2-5% slower alone).
"""

import argparse
import json
import sys
from itertools import product
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "aot"))
import source_tree  # noqa: E402

source_tree.register(run_init=False)
from skinny_gemm.kernels.config import ConfigError, KernelConfig  # noqa: E402

# (threads, k_threads, cols, split) and the depths tried with each; the ring's depth is bounded by shared memory.
# 8 rows per warp lost on every cell of the first sweep (the tokens' copies cost more shared-memory traffic
# than the weight's), so the CTA shapes have 16-64 rows per warp.
SHAPES = [
    (128, 128, 16, 1), (256, 256, 16, 1), (256, 128, 16, 1), (128, 128, 32, 1), (256, 128, 32, 1),
    (64, 64, 32, 1), (128, 128, 32, 2), (128, 128, 64, 1), (128, 128, 64, 2), (64, 64, 64, 1),
]
# 128 rows per warp (--wide): half the token copies per weight byte of 64 (at M = 16 a CTA of 64 rows per warp
# copies 1 KB of tokens per 4 KB of weight), at 136 registers; cluster splits keep the grid over 132 SMs. Lost on
# the H200 (10-20% slower alone than the best of SHAPES, docs/perf.md "Ideas that lost").
WIDE = [
    (32, 32, 128, 1), (32, 32, 128, 2), (32, 32, 128, 4), (64, 64, 128, 1), (64, 64, 128, 2),
    (128, 128, 128, 1), (128, 128, 128, 2), (64, 32, 128, 1),
]
DEPTHS = [4, 6, 7, 8, 12, 14, 16, 24, 28, 32]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("cells", nargs="+", help="N,K")
    ap.add_argument("--wide", action="store_true", help="also the WIDE CTA shapes (128 rows per warp)")
    ap.add_argument("--unroll", default="1", help="comma list: 32-k steps per ring stage (default 1)")
    ap.add_argument("--fetch", default="128", help="comma list: L2 fetch bytes of the weight copies (default 128)")
    ap.add_argument("--only", default="", help="keep only configs whose name contains this")
    ap.add_argument(
        "--runs",
        action="store_true",
        help="the weight copied as whole rows (the runs field of docs/experiments/ring-weight-runs.patch; unroll 2, 4 or 8)",
    )
    ap.add_argument(
        "--per-sm",
        default="1,2",
        help="comma list: per CTA shape, the deepest ring that leaves this many CTAs per SM by shared memory and "
        "not the next larger listed count (default 1,2)",
    )
    args = ap.parse_args()
    if args.runs and "runs" not in KernelConfig.__dataclass_fields__:
        sys.exit("ring_candidates.py: --runs needs the runs field: git apply docs/experiments/ring-weight-runs.patch")
    shapes = SHAPES + WIDE if args.wide else SHAPES
    variants = [(int(u), int(f)) for u in args.unroll.split(",") for f in args.fetch.split(",")]
    out = Path(args.out)
    cells = [tuple(int(v) for v in a.split(",")) for a in args.cells]
    files: list[list[dict]] = []
    for n, k in cells:
        for m in (8, 16):
            found = []
            for (threads, kt, cols, split), (unroll, fetch), d in product(shapes, variants, DEPTHS):
                cfg = KernelConfig(
                    m=m,
                    kind="mma",
                    threads=threads,
                    k_threads=kt,
                    cols=cols,
                    vec=8,
                    unroll=unroll,
                    stages=d,
                    pdl=True,
                    prefetch=False,
                    fetch=fetch,
                    split=split,
                    ring=True,
                    **({"runs": True} if args.runs else {}),
                )
                try:
                    cfg.check(n=n, k=k)
                except ConfigError:
                    continue
                if args.only in cfg.name:
                    found.append(cfg)
            # per CTA shape the deepest ring that leaves each listed count of CTAs per SM (default: two, then one)
            counts = sorted({int(v) for v in args.per_sm.split(",")}, reverse=True)
            keep = []
            for shape, variant in product(shapes, variants):
                mine = [
                    c
                    for c in found
                    if (c.threads, c.k_threads, c.cols, c.split) == shape and (c.unroll, c.fetch) == variant
                ]
                for i, count in enumerate(counts):
                    more = counts[i - 1] if i else None
                    fit = [c for c in mine if c.smem_ctas >= count and (more is None or c.smem_ctas < more)]
                    keep += [max(fit, key=lambda c: c.stages)] if fit else []
            add_cell(files, keep, n, k, m, "ring candidate")
    for path, entries in write_plans(out, files, "ring", "ring candidates"):
        print(path, [KernelConfig.from_json(e["config"]).name for e in entries][:3], len(entries))


def add_cell(files: list[list[dict]], configs: list[KernelConfig], n: int, k: int, m: int, why: str) -> None:
    """Spread one cell's configs over the plan files, the i-th config into file i (a plan holds one per cell)."""
    for i, cfg in enumerate(configs):
        while len(files) <= i:
            files.append([])
        files[i].append({"config": cfg.to_json(), "k": k, "m": m, "n": n, "provenance": {"kind": "heuristic", "why": why}})


def write_plans(out: Path, files: list[list[dict]], prefix: str, source: str) -> list[tuple[Path, list[dict]]]:
    """Write OUT/<prefix>-<i>.json, sorted stable plan tables for `tune prepare --from-plans`."""
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for i, entries in enumerate(files):
        plan = {
            "entries": sorted(entries, key=lambda e: (e["n"], e["k"], e["m"])),
            "header": {"arch": "sm_90a", "capability": [9, 0], "dtype": "bfloat16", "source": source},
        }
        path = out / f"{prefix}-{i}.json"
        path.write_text(json.dumps(plan, indent=1, sort_keys=True) + "\n")
        written.append((path, entries))
    return written


if __name__ == "__main__":
    main()
