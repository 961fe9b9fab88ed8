"""The committed sm_90a plan less some of its M = 16 entries, built into artifact folders for an engine A/B (CPU).

    python docs/experiments/m16_ab_plans.py OUTDIR [--python VENV/bin/python]

Why (docs/perf.md, "The walk plan, re-run"): at batch 16 the plugin-on engines' TPOT reps scatter 4.5-5.6 ms
where the plugin-off ones keep within 0.3 ms, and batch 8 (the same walks, no cluster split, no PDL on the walks)
does not scatter. Each variant drops one suspect, so the engine can tell which one the scatter comes from:

    no-m16        every M = 16 entry dropped: the on engine runs cuBLAS at batch 16 with our op still in the
                  graph (if it still scatters, the op's place in Inductor's graph is the cause, not a kernel)
    no-m16-walks  the M = 16 walks (``persist``: 132 CTAs of one per SM, PDL on o_proj) dropped
    no-m16-split  the M = 16 K splits across a cluster (``split`` 2: the down projections' rings) dropped
    m16-nopdl     every M = 16 entry kept, with PDL off (batch 8's walks run without PDL and do not scatter;
                  at M = 16 o_proj's walk and the down rings launch with PDL)

The third H200 lease of 2026-12-04 found the scatter in the on engines' prefills, not in their decode steps
(docs/perf.md, Next 0, Ready 1 and 5). The near-tie variants of that day (`m16-ties`, `ties-run`; docs/perf.md)
are in this script up to a44b6f3, where the near-tie runs moved into runs.json's runs: `ties-run` is the committed
plan since.

Each folder is OUTDIR/NAME/sm_90a (cubins and manifest, `skinny-gemm build --plan`), used through
$SKINNY_GEMM_ARTIFACTS; OUTDIR/NAME.json is its plan. On the H200, after `vllm_h200.sh install`:

    SKINNY_GEMM_ARTIFACTS=$PWD/OUTDIR/no-m16 TAG=no-m16 bash docs/experiments/vllm_h200.sh bench qwen3-8b \
        --batches 16 --runs 2 --reps 6 --profile

and the same with TAG unset and no override for the committed plan (each bench has its own off arm).
"""

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# name -> (entries dropped, entries whose PDL is turned off)
VARIANTS = {
    "no-m16": (lambda e: e["m"] == 16, lambda e: False),
    "no-m16-walks": (lambda e: e["m"] == 16 and e["config"].get("persist", 0) > 0, lambda e: False),
    "no-m16-split": (lambda e: e["m"] == 16 and e["config"].get("split", 1) > 1, lambda e: False),
    "m16-nopdl": (lambda e: False, lambda e: e["m"] == 16 and e["config"].get("pdl", False)),
}


def _cells(entries) -> list[str]:
    return sorted(f"{e['n']}x{e['k']} M={e['m']}" for e in entries)


def _edited(plan: dict, name: str, drop, nopdl) -> tuple[dict, list[str], str]:
    """The committed plan with the variant's entries dropped or PDL turned off; (plan, cells, what)."""
    kept = [{**e, "config": {**e["config"], "pdl": False}} if nopdl(e) else e for e in plan["entries"] if not drop(e)]
    cells = _cells([e for e in plan["entries"] if drop(e) or nopdl(e)])
    what = "dropped" if name.startswith("no-") else "PDL off"
    header = {
        **plan["header"],
        "source": plan["header"]["source"] + f"; A/B variant {name}, {what}: " + ", ".join(cells),
    }
    return {"header": header, "entries": sorted(kept, key=lambda e: (e["n"], e["k"], e["m"]))}, cells, what


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--python", default=sys.executable, help="the interpreter with cutlass (the build compiles)")
    p.add_argument("--only", choices=sorted(VARIANTS), action="append", help="build only these variants")
    args = p.parse_args(argv)
    plan = json.loads((ROOT / "kernels/plans/sm_90a.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (drop, nopdl) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        variant, cells, what = _edited(plan, name, drop, nopdl)
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(variant, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {len(cells)} entries {what} ({', '.join(cells)})", flush=True)
        cmd = [args.python, str(ROOT / "aot/source_tree.py"), "build", "--arch", "sm_90a", "--plan", str(path)]
        subprocess.run(cmd + ["--out", str(args.out / name), "--quiet"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
