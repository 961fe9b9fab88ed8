"""Plan files whose entries are sliced "mma" candidates, for `tune prepare --from-plans` (CPU).

    python docs/experiments/sliced_candidates.py OUTDIR N,K [N,K ...] [--m 8] [--token-groups 1] [--tiles 1,2,4]
        [--token-stages 0] [--min-ctas 0]

Per (N, K) at the given M: every valid sliced config (kind "mma", slices S with M / G x S <= 16 for token groups
G, CTAs of 64-512 threads that split K over all their warps, 1, 2 or 4 tiles (`--tiles`) of 8 / S rows, 2, 4 or 8 register
stages, L2 fetch 0 or 128 B, PDL on and off), into OUTDIR/sl-<i>.json, one config per cell and file, so that
`skinny-gemm tune prepare --model SLUG --m M --from-plans OUTDIR/sl-*.json kernels/plans/sm_90a.json ...` times
them beside the committed configs. At M = 8 (slices 2) this grid made the candidates of
kernels/plans/tuning/sm_90a/tune-sm_90a-h200-*-sliced.json (2026-12-03), less the 64-thread CTAs of 16 rows
that the epilogue's turns (178833e) admitted since (4 or 8 more configs per cell); kernels/candidates.json's `slice`
and `slice-long` spaces hold its winners (at K = 4096 the grid's CTAs of 5 or more trips are in neither). --token-groups 2,4 at M = 16 sets the token_groups
field (16 tokens in groups of 8 or 4 against the same sliced weight fragments), --token-stages 2 the token_stages
field (the tokens' register buffers fewer than the weight's), --min-ctas 2,3,4 adds each config's launch-bound
twins (min_ctas) where the bound fits more of its CTAs on an SM.
"""

import argparse
import dataclasses
from itertools import product
from pathlib import Path

# a sibling script (run from the repository root); importing it puts the source tree in place
from ring_candidates import add_cell, write_plans  # noqa: E402
from skinny_gemm.aot.candidates import resident_ctas  # noqa: E402
from skinny_gemm.kernels.config import MMA_ROWS, ConfigError, KernelConfig  # noqa: E402

THREADS = (64, 128, 256, 512)
TILES = (1, 2, 4)
STAGES = (2, 4, 8)
FETCH = (0, 128)
SLICES = (2, 4, 8)


def configs(n: int, k: int, m: int, groups: list[int], tiles_grid=TILES, lead=(0,), bounds=(0,)) -> list[KernelConfig]:
    """Every valid config of the grid for one cell, in grid order; after each, its launch-bound twins (``bounds``:
    min_ctas values above 0) where the bound lets more of its CTAs share an SM."""
    found = []
    grid = product(groups, SLICES, THREADS, tiles_grid, STAGES, FETCH, (True, False), lead)
    for g, s, t, tiles, st, fetch, pdl, ts in grid:
        extra = {"token_groups": g} if g != 1 else {}
        if ts:
            extra["token_stages"] = ts
        try:
            cfg = KernelConfig(
                m=m,
                kind="mma",
                threads=t,
                k_threads=t,
                cols=MMA_ROWS // s * tiles,
                vec=8,
                unroll=1,
                stages=st,
                pdl=pdl,
                prefetch=False,
                fetch=fetch,
                split=1,
                slices=s,
                **extra,
            )
            cfg.check(n=n, k=k)
        except (ConfigError, TypeError):
            continue
        found.append(cfg)
        for mc in bounds:
            if not mc:
                continue
            twin = dataclasses.replace(cfg, min_ctas=mc)
            try:
                twin.check(n=n, k=k)
            except ConfigError:
                continue
            if resident_ctas(twin) > resident_ctas(cfg):
                found.append(twin)
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out")
    ap.add_argument("cells", nargs="+", help="N,K")
    ap.add_argument("--m", type=int, default=8, help="token count (default 8)")
    ap.add_argument(
        "--token-groups",
        default="1",
        help="comma list of token groups (default 1)",
    )
    ap.add_argument(
        "--tiles",
        default=",".join(map(str, TILES)),
        help="comma list of MMA tiles per warp (default 1,2,4; 8 gives 32-row CTAs of 2 slices, more outputs than "
        "threads at M >= 8, which the sliced epilogue stores in turns)",
    )
    ap.add_argument(
        "--token-stages",
        default="0",
        help="comma list of the tokens' register buffers (default 0: as many as the weight's stages)",
    )
    ap.add_argument(
        "--min-ctas",
        default="0",
        help="comma list of launch bounds (CTAs per SM, min_ctas) added as twins where they fit more CTAs on an SM "
        "(default 0: none)",
    )
    args = ap.parse_args()
    bounds = tuple(int(v) for v in args.min_ctas.split(","))
    lead = tuple(int(v) for v in args.token_stages.split(","))
    tiles_grid = tuple(int(v) for v in args.tiles.split(","))
    groups = [int(v) for v in args.token_groups.split(",")]
    files: list[list[dict]] = []
    for a in args.cells:
        n, k = (int(v) for v in a.split(","))
        found = configs(n, k, args.m, groups, tiles_grid, lead, bounds)
        print(f"{n}x{k} M={args.m}: {len(found)} configs")
        add_cell(files, found, n, k, args.m, "sliced candidate")
    written = write_plans(Path(args.out), files, "sl", "sliced candidates")
    print(f"{len(written)} plan files in {args.out}")


if __name__ == "__main__":
    main()
