"""What PDL gives alone and in the served step, from committed `tune measure` results (CPU, no GPU).

    python docs/experiments/pdl_alone_bias.py [--out docs/results/pdl-alone-bias.json]

`tune measure` times each candidate alone (a bare chain of the same GEMM under graph replay, where our kernel's
`launch_dependents` lets the next launch of the same kernel start its prologue early) and, in the decode phase, the
whole served step with that candidate in its cell (where each GEMM follows one of vLLM's ops: a norm, attention or
silu-and-mul, none of which triggers a dependent launch). The decode phase times every PDL variant beside its no-PDL
twin, so each (run, cell, twin pair) gives two differences with nothing else changed:

  alone:  the PDL variant's alone time less its twin's (us per call);
  step:   the PDL variant's step time less its twin's, divided by the calls the shape makes per step (us per call).

And per candidate, the "in-step penalty" that docs/perf.md chased on the dense models: its step time against
cuBLAS's per call, less its alone time against cuBLAS's. Cells are grouped by the number of calls the shape makes per
step (a shape a model calls once, such as an LM head, gives a per-call figure 32-60 times noisier than a per-layer
one: the step's own spread, about 0.08%, is 5-20 us).
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TUNING = ROOT / "kernels" / "plans" / "tuning" / "sm_90a"
MODELS = ROOT / "kernels" / "models"
RUN_NAME = re.compile(r"tune-sm_90a-h200-(?P<slug>.+?)-tp(?P<tp>\d+)(-|\.json$)")
PER_LAYER = 11  # calls per step at and above which a shape is a per-layer one (GLM's fewest: 11)


def calls_per_step(model: dict, tp: int, n: int, k: int) -> int:
    """How many times one step of ``model`` at ``tp`` calls an (n, k) projection (0: never)."""
    return sum(lin["calls_per_step"] for lin in model["linears"].values() if lin["tp"].get(str(tp)) == [n, k])


def samples(tuning: Path = TUNING, models: Path = MODELS) -> list[dict]:
    """One record per (run, cell, TP, candidate) with a step time beside cuBLAS's, a model file and a call count."""
    found = []
    for path in sorted(tuning.glob("tune-*.json")):
        named = RUN_NAME.match(path.name)
        model_file = models / f"{named['slug']}.json" if named else None
        if model_file is None or not model_file.is_file():
            continue
        model = json.loads(model_file.read_text())
        for cell in json.loads(path.read_text())["cells"]:
            steps = (cell.get("decode") or {}).get("step_us") or {}
            if "cublas" not in steps:
                continue
            n, k, m = cell["n"], cell["k"], cell["m"]
            for name, by_tp in steps.items():
                if name == "cublas" or name not in cell["candidates"]:
                    continue
                for tp, us in (by_tp if isinstance(by_tp, dict) else {named["tp"]: by_tp}).items():
                    calls = calls_per_step(model, int(tp), n, k)
                    cublas = steps["cublas"]
                    cublas_us = cublas[tp] if isinstance(cublas, dict) else cublas
                    if not calls:
                        continue
                    found.append(
                        {
                            "run": path.name,
                            "n": n,
                            "k": k,
                            "m": m,
                            "tp": int(tp),
                            "calls": calls,
                            "variant": name,
                            "pdl": cell["candidates"][name]["config"]["pdl"],
                            "alone_us": cell["candidates"][name]["us"],
                            "cublas_alone_us": cell["cublas_us"],
                            "step_us": us,
                            "cublas_step_us": cublas_us,
                        }
                    )
    return found


def twins(found: list[dict]) -> list[dict]:
    """Each PDL variant beside its no-PDL twin of the same run, cell and TP: alone and per-call step differences."""
    by_key = {(s["run"], s["n"], s["k"], s["m"], s["tp"], s["variant"]): s for s in found}
    pairs = []
    for (run, n, k, m, tp, name), s in sorted(by_key.items()):
        if not s["pdl"]:
            continue
        twin = by_key.get((run, n, k, m, tp, name.replace("_pdl", "_nopdl", 1)))
        if twin is None:
            continue
        pairs.append(
            {
                "run": run,
                "n": n,
                "k": k,
                "m": m,
                "tp": tp,
                "calls": s["calls"],
                "variant": name,
                "alone_pdl_less_nopdl_us": round(s["alone_us"] - twin["alone_us"], 3),
                "step_pdl_less_nopdl_us_per_call": round((s["step_us"] - twin["step_us"]) / s["calls"], 3),
            }
        )
    return pairs


def penalty(s: dict) -> float:
    """In the step against cuBLAS, per call, less alone against cuBLAS (us): what the alone ratio misses."""
    return (s["step_us"] - s["cublas_step_us"]) / s["calls"] - (s["alone_us"] - s["cublas_alone_us"])


def quartiles(values: list[float]) -> list[float]:
    """Lower quartile, median, upper quartile (the median alone for fewer than 4 values)."""
    if len(values) < 4:
        return [round(statistics.median(values), 2)] * 3
    q = statistics.quantiles(values, n=4)
    return [round(q[0], 2), round(statistics.median(values), 2), round(q[2], 2)]


def summary(found: list[dict], pairs: list[dict]) -> dict:
    """The figures docs/perf.md quotes: twin differences and penalties, per-layer shapes apart from once-a-step ones."""
    out = {}
    for label, keep in (("per_layer", lambda c: c >= PER_LAYER), ("once_a_step", lambda c: c < PER_LAYER)):
        ps = [p for p in pairs if keep(p["calls"])]
        if not ps:
            continue
        out[label] = {
            "twin_pairs": len(ps),
            "alone_pdl_less_nopdl_us_q1_median_q3": quartiles([p["alone_pdl_less_nopdl_us"] for p in ps]),
            "step_pdl_less_nopdl_us_per_call_q1_median_q3": quartiles(
                [p["step_pdl_less_nopdl_us_per_call"] for p in ps]
            ),
            "penalty_us_q1_median_q3": {
                flag: quartiles([penalty(s) for s in found if keep(s["calls"]) and s["pdl"] == (flag == "pdl")])
                for flag in ("pdl", "nopdl")
            },
        }
    big = [p for p in pairs if p["calls"] >= PER_LAYER and p["n"] * p["k"] >= 4096 * 4096]
    if big:
        out["per_layer_weights_of_32_MB_and_more"] = {
            "twin_pairs": len(big),
            "alone_pdl_less_nopdl_us_q1_median_q3": quartiles([p["alone_pdl_less_nopdl_us"] for p in big]),
            "step_pdl_less_nopdl_us_per_call_q1_median_q3": quartiles(
                [p["step_pdl_less_nopdl_us_per_call"] for p in big]
            ),
        }
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the twin pairs and the summary here (JSON)")
    args = p.parse_args(argv)
    found = samples()
    pairs = twins(found)
    if not pairs:
        print(f"error: no PDL / no-PDL twin pairs with step times under {TUNING}", file=sys.stderr)
        return 2
    result = summary(found, pairs)
    for label, fig in result.items():
        print(f"{label}: {json.dumps(fig, sort_keys=True)}")
    if args.out:
        args.out.write_text(json.dumps({"summary": result, "twin_pairs": pairs}, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
