"""What PDL gives alone and in the served step, from committed `tune measure` results (CPU, no GPU).

    python docs/experiments/pdl_alone_bias.py [--out docs/results/pdl-alone-bias.json]

`tune measure` times each candidate alone (a bare chain of the same GEMM under graph replay, where our kernel's
`launch_dependents` lets the next launch of the same kernel start its prologue early) and, in the decode phase, the
whole served step with that candidate in its cell. The decode phase times PDL variants beside their no-PDL twins, so
each (run, cell, TP, twin pair) gives two differences with nothing else changed:

  alone:  the PDL variant's alone time less its twin's (us per call);
  step:   the PDL variant's step time less its twin's, divided by the calls the shape makes per step (us per call).

Each shape is classed by what comes before it in its model's step (`aot/steps.py`'s build of the model file): one of
our GEMMs (whose trigger lets a PDL launch start early, as in the chain) or one of vLLM's ops (a norm, attention,
silu-and-mul: no trigger). Where the run also timed cuBLAS in the step, each candidate's "in-step penalty": its step
time against cuBLAS's per call, less its alone time against cuBLAS's. A shape the step calls once (an LM head) gives
a per-call figure 11-80 times noisier than a per-layer one (the step's own spread, about 0.08%, is 5-20 us).
"""

import argparse
import json
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "aot"))
import source_tree  # noqa: E402

source_tree.register(run_init=False)
from skinny_gemm.aot import steps  # noqa: E402

TUNING = ROOT / "kernels" / "plans" / "tuning" / "sm_90a"
RUN_NAME = re.compile(r"tune-sm_90a-h200-(?P<slug>.+?)-tp(?P<tp>\d+)(-|\.json$)")
SEED_SET = "glm-5.3-flash"  # the runs named by token counts only (m1, m816-pdl, served-m16, ...) tuned its seed set
PER_LAYER = 11  # calls per step at and above which a shape is a per-layer one (GLM's fewest: 11)


def gemm_context(model: dict, tp: int, m: int) -> dict[tuple[int, int], tuple[int, str]]:
    """Per (n, k) GEMM of the model's served step at (tp, m): (calls per step, what comes before it: "gemm" where
    every call follows one of our GEMMs, "op" where none does, "mixed")."""
    ops = steps.build(model, tp, m, arch="sm_90a")
    seen: dict = {}
    for i, op in enumerate(ops):
        if op.is_gemm:
            seen.setdefault((op.n, op.k), []).append(i > 0 and ops[i - 1].is_gemm)
    return {key: (len(v), "gemm" if all(v) else "op" if not any(v) else "mixed") for key, v in seen.items()}


def samples(tuning: Path = TUNING) -> list[dict]:
    """One record per (run, cell, TP, candidate) with a step time: its alone time, step time, calls per step and
    predecessor kind, and cuBLAS's alone and step times (``cublas_step_us`` None where the run did not time it)."""
    found = []
    for path in sorted(tuning.glob("tune-*.json")):
        named = RUN_NAME.match(path.name)
        model = steps.load(named["slug"] if named else SEED_SET)
        context: dict = {}
        for cell in json.loads(path.read_text())["cells"]:
            step_us = (cell.get("decode") or {}).get("step_us") or {}
            n, k, m = cell["n"], cell["k"], cell["m"]
            cublas = step_us.get("cublas")
            for name, by_tp in step_us.items():
                if name == "cublas" or name not in cell["candidates"]:
                    continue
                for tp, us in (by_tp if isinstance(by_tp, dict) else {named["tp"]: by_tp}).items():
                    if (int(tp), m) not in context:
                        context[(int(tp), m)] = gemm_context(model, int(tp), m)
                    calls, before = context[(int(tp), m)].get((n, k), (0, ""))
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
                            "after": before,
                            "variant": name,
                            "pdl": cell["candidates"][name]["config"]["pdl"],
                            "alone_us": cell["candidates"][name]["us"],
                            "cublas_alone_us": cell["cublas_us"],
                            "step_us": us,
                            "cublas_step_us": (cublas[tp] if isinstance(cublas, dict) else cublas) if cublas else None,
                        }
                    )
    return found


def twins(found: list[dict]) -> list[dict]:
    """Each PDL variant beside its no-PDL twin of the same run, cell and TP: alone and per-call step differences.
    The twin is the config with PDL alone off (the name's ``_pdl`` as ``_nopdl``); the decode phase's twin of an
    ``early`` or SIMT-walk variant also drops those, so it is no pure PDL comparison and is left out."""
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
                "after": s["after"],
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


def _pairs_figures(ps: list[dict]) -> dict:
    return {
        "twin_pairs": len(ps),
        "alone_pdl_less_nopdl_us_q1_median_q3": quartiles([p["alone_pdl_less_nopdl_us"] for p in ps]),
        "step_pdl_less_nopdl_us_per_call_q1_median_q3": quartiles([p["step_pdl_less_nopdl_us_per_call"] for p in ps]),
        "step_pdl_slower": sum(p["step_pdl_less_nopdl_us_per_call"] > 0 for p in ps),
    }


def summary(found: list[dict], pairs: list[dict]) -> dict:
    """The figures docs/perf.md quotes. Twin pairs of per-layer shapes by what comes before them in the step (one of
    our GEMMs, whose PDL trigger lets a PDL launch start early as in the alone chain, or one of vLLM's ops, which
    triggers nothing); among the latter, weights of 32 MB and more and the two 8B models' M = 16 cells. Then the
    in-step penalty (`penalty`) of per-layer candidates after a vLLM op, PDL or not and by kind, where the run timed
    cuBLAS in the step; and the once-a-step shapes apart (the heads: noisy per call)."""
    per_layer = [p for p in pairs if p["calls"] >= PER_LAYER]
    after_op = [p for p in per_layer if p["after"] == "op"]
    out = {
        "per_layer_all": _pairs_figures(per_layer),
        "per_layer_after_our_gemm": _pairs_figures([p for p in per_layer if p["after"] == "gemm"]),
        "per_layer_after_a_vllm_op": _pairs_figures(after_op),
        "per_layer_after_a_vllm_op_weights_of_32_MB_and_more": _pairs_figures(
            [p for p in after_op if p["n"] * p["k"] >= 4096 * 4096]
        ),
        "the_8b_models_m16_after_a_vllm_op": _pairs_figures(
            [p for p in after_op if p["m"] == 16 and re.search(r"-(llama-3\.1-8b|qwen3-8b)-tp1", p["run"])]
        ),
        "once_a_step": _pairs_figures([p for p in pairs if p["calls"] < PER_LAYER]),
    }
    timed = [s for s in found if s["cublas_step_us"] and s["calls"] >= PER_LAYER and s["after"] == "op"]
    out["penalty_us_q1_median_q3_per_layer_after_a_vllm_op"] = {
        f"{family} {flag}": [len(vs), quartiles(vs)]
        for family in ("all", "ring", "walk", "other")
        for flag in ("pdl", "nopdl")
        if (
            vs := [
                penalty(s)
                for s in timed
                if s["pdl"] == (flag == "pdl") and family in ("all", kind_family(s["variant"]))
            ]
        )
    }
    return out


def kind_family(name: str) -> str:
    """ "ring" (the mma ring, ``_r``), "walk" (a persistent walk, ``_p<n>``) or "other", from a variant's name."""
    if re.search(r"_r(_|$)", name):
        return "ring"
    return "walk" if re.search(r"_p\d+(_|$)", name) else "other"


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
