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
    m16-ties      every entry kept, plus the M = 16 cells of Llama-3.1-8B and Qwen3-8B that stay on cuBLAS because
                  their kernels only tie it alone (gate_up and the heads), each on its fastest correct candidate in
                  the committed wgmma-walk runs: does our down_proj run faster after our gate_up than after
                  cuBLAS's (docs/perf.md, "The kernel before it")? `--only m16-ties` builds just that one.
    ties-run      the plan `tune write` gives with the two near-tie runs (--decode-min-speedup 0.97, runs.json's
                  not_used) after the committed runs: exactly the decode choices their confirm steps kept (Llama's
                  M = 16 cells including gate_up and the head; Qwen3-8B's head), which no engine has run yet.

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
# name -> (entries dropped, entries whose PDL is turned off, whether the tie cells are added)
VARIANTS = {
    "no-m16": (lambda e: e["m"] == 16, lambda e: False, False),
    "no-m16-walks": (lambda e: e["m"] == 16 and e["config"].get("persist", 0) > 0, lambda e: False, False),
    "no-m16-split": (lambda e: e["m"] == 16 and e["config"].get("split", 1) > 1, lambda e: False, False),
    "m16-nopdl": (lambda e: False, lambda e: e["m"] == 16 and e["config"].get("pdl", False), False),
    "m16-ties": (lambda e: False, lambda e: False, True),
    "ties-run": (lambda e: False, lambda e: False, False),
}
TIES_RUN_FILES = ("tune-sm_90a-h200-llama-3.1-8b-tp1-m16-ties.json", "tune-sm_90a-h200-qwen3-8b-tp1-m16-ties.json")


def ties_run_plan(scratch: Path) -> dict:
    """The plan `tune write` makes of runs.json's runs followed by TIES_RUN_FILES."""
    sys.path.insert(0, str(ROOT / "aot"))
    import source_tree

    source_tree.register(run_init=False)
    from skinny_gemm.aot.results import results_files, write_plan

    tuning = ROOT / "kernels/plans/tuning/sm_90a"
    files = results_files([], tuning / "runs.json") + [tuning / name for name in TIES_RUN_FILES]
    path, _, _ = write_plan(files, out=scratch / "ties-run-written.json")
    return json.loads(path.read_text())


TIE_RUNS = ("llama-3.1-8b-tp1-m16-wgmma-walk", "qwen3-8b-tp1-m16-wgmma-walk")


def tie_entries(plan: dict) -> list[dict]:
    """Plan entries for the M = 16 cells of TIE_RUNS that the plan leaves on cuBLAS: each cell's fastest correct
    candidate in that run, with its alone timing as provenance."""
    planned = {(e["n"], e["k"], e["m"]) for e in plan["entries"]}
    out = []
    for run in TIE_RUNS:
        data = json.loads((ROOT / f"kernels/plans/tuning/sm_90a/tune-sm_90a-h200-{run}.json").read_text())
        for row in data["cells"]:
            if (row["n"], row["k"], row["m"]) in planned:
                continue
            timed = [(c["us"], c["config"]) for c in row["candidates"].values() if c["bad_elements"] == 0 and c["us"]]
            us, config = min(timed, key=lambda t: t[0])
            prov = {"kind": "measured", "gpu": data["gpu"], "date": data["date"], "method": data["method"],
                    "cublas_us": round(row["cublas_us"], 3), "plan_us": round(us, 3),
                    "speedup": round(row["cublas_us"] / us, 3), "chosen_in": "A/B variant m16-ties"}
            out.append({"n": row["n"], "k": row["k"], "m": row["m"], "config": config, "provenance": prov})
            planned.add((row["n"], row["k"], row["m"]))
    return out


def _cells(entries) -> list[str]:
    return sorted(f"{e['n']}x{e['k']} M={e['m']}" for e in entries)


def _edited(plan: dict, name: str, drop, nopdl, ties: bool) -> tuple[dict, list[str], str]:
    """The committed plan with the variant's entries dropped, PDL turned off or tie cells added; (plan, cells, what)."""
    kept = [{**e, "config": {**e["config"], "pdl": False}} if nopdl(e) else e for e in plan["entries"] if not drop(e)]
    added = tie_entries(plan) if ties else []
    cells = _cells(added or [e for e in plan["entries"] if drop(e) or nopdl(e)])
    what = "added" if ties else "dropped" if name.startswith("no-") else "PDL off"
    header = {**plan["header"], "source": plan["header"]["source"] + f"; A/B variant {name}, {what}: " + ", ".join(cells)}
    entries = sorted(kept + added, key=lambda e: (e["n"], e["k"], e["m"]))
    return {"header": header, "entries": entries}, cells, what


def _ties_run(plan: dict, scratch: Path) -> tuple[dict, list[str], str]:
    """`ties_run_plan` and the entries it adds or changes against the committed plan; (plan, cells, what)."""
    written = ties_run_plan(scratch)
    before = {(e["n"], e["k"], e["m"]): e["config"] for e in plan["entries"]}
    changed = [e for e in written["entries"] if before.get((e["n"], e["k"], e["m"])) != e["config"]]
    return written, _cells(changed), "new or changed"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    p.add_argument("--python", default=sys.executable, help="the interpreter with cutlass (the build compiles)")
    p.add_argument("--only", choices=sorted(VARIANTS), action="append", help="build only these variants")
    args = p.parse_args(argv)
    plan = json.loads((ROOT / "kernels/plans/sm_90a.json").read_text())
    args.out.mkdir(parents=True, exist_ok=True)
    for name, (drop, nopdl, ties) in VARIANTS.items():
        if args.only and name not in args.only:
            continue
        if name == "ties-run":
            variant, cells, what = _ties_run(plan, args.out)
        else:
            variant, cells, what = _edited(plan, name, drop, nopdl, ties)
        path = args.out / f"{name}.json"
        path.write_text(json.dumps(variant, indent=1, sort_keys=True) + "\n")
        print(f"{name}: {len(cells)} entries {what} ({', '.join(cells)})", flush=True)
        cmd = [args.python, str(ROOT / "aot/source_tree.py"), "build", "--arch", "sm_90a", "--plan", str(path)]
        subprocess.run(cmd + ["--out", str(args.out / name), "--quiet"], check=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
