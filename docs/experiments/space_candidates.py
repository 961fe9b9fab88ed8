"""Plan files whose entries are one candidate space's configs, for `tune prepare --from-plans` (CPU).

    python docs/experiments/space_candidates.py OUTDIR SPACE N,K [N,K ...] --m 16 [--pdl-twins]

Per (N, K) at the given M: the admissible configs of SPACE (a space of kernels/candidates.json, e.g. "walk", or
several joined by commas, e.g. "wgmma,wgmma-walk"), and
with --pdl-twins each one's no-PDL twin, into OUTDIR/sl-<i>.json, one config per cell and file (the names
docs/experiments/sliced_sweep.sh globs), so that a sweep times a whole space beside the committed configs with
no cost-model cut. `SPACE=walk bash docs/experiments/sliced_sweep.sh prepare ...` calls it.
"""

import argparse
from pathlib import Path

# a sibling script (run from the repository root); importing it puts the source tree in place
from ring_candidates import add_cell, write_plans  # noqa: E402
from skinny_gemm.aot.candidates import space_candidates  # noqa: E402
from skinny_gemm.aot.decode_phase import twin  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("space", help="a space name of kernels/candidates.json, or several joined by commas")
    p.add_argument("cells", nargs="+", metavar="N,K")
    p.add_argument("--m", type=int, required=True)
    p.add_argument("--pdl-twins", action="store_true", help="also each config's no-PDL twin")
    args = p.parse_args(argv)
    files: list = []
    for cell in args.cells:
        n, k = (int(v) for v in cell.split(","))
        found = [c for space in args.space.split(",") for c in space_candidates(space, n, k, args.m)]
        if args.pdl_twins:
            found += [t for t in (twin(c) for c in found) if t not in found]
        print(f"{n}x{k} M={args.m}: {len(found)} {args.space} configs")
        add_cell(files, found, n, k, args.m, f"{args.space} candidate")
    if not files:  # no plan file: sliced_sweep.sh skips the model
        print(f"space {args.space!r} has no config for these cells at M={args.m}")
        return 0
    write_plans(args.out, files, "sl", f"{args.space} candidates")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
