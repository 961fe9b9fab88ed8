"""The decode phase's run-to-run spread, from committed `tune measure` results (CPU): what the confirm margin is fitted to.

    python docs/experiments/confirm_noise.py [--out docs/results/confirm-noise.json]

Inside one `tune measure` run, a token count's family check (when it swapped nothing) and its confirm step both time
the whole served step with the same choice set: the family check's "kept" set and the confirm step's "decode" set.
Each (run, M, TP) gives one pair of medians of the same CUDA graph, minutes apart in the same process; their relative
difference is the spread a comparison of two sets sees when nothing differs. The confirm step keeps a token count's
choices only if they beat the fallback set by the margin (aot/results.py CONFIRM_MARGIN), so the margin is
3 x that spread's root mean square, rounded up to 0.05% (a one-sided false keep about 1 in 700 under a normal spread).
The family check times `trials` replays a graph, the confirm step 3 x that, so the pairs overstate the confirm step's
own spread: the fit errs toward keeping fewer choices.
"""

import argparse
import json
import math
from pathlib import Path

TUNING = Path(__file__).resolve().parents[2] / "kernels" / "plans" / "tuning" / "sm_90a"


def pairs(tuning: Path = TUNING) -> list[dict]:
    """Every (run, M, TP) whose family checks swapped nothing, with the two timings of its final choice set."""
    found = []
    for path in sorted(tuning.glob("tune-*.json")):
        cells = json.loads(path.read_text())["cells"]
        for m in sorted({c["m"] for c in cells}):
            decodes = [c["decode"] for c in cells if c["m"] == m and c.get("decode")]
            confirm = next((d["confirm"] for d in decodes if d.get("confirm", {}).get("step_us")), None)
            checks = [d["family_check"] for d in decodes if "family_check" in d]
            if confirm is None or not checks or any(fc["swapped"] for fc in checks):
                continue
            seen = set()
            for fc in checks:
                for tp, kept in fc["step_us"]["kept"].items():
                    final = confirm["step_us"]["decode"].get(tp)
                    if final is None or (tp, kept) in seen:
                        continue
                    seen.add((tp, kept))
                    found.append(
                        {"run": path.name, "m": m, "tp": int(tp), "family_check_us": kept, "confirm_us": final,
                         "rel": (kept - final) / final}
                    )
    return found


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, help="write the pairs and the fit here (JSON)")
    args = p.parse_args(argv)
    found = pairs()
    rms = math.sqrt(sum(x["rel"] ** 2 for x in found) / len(found))
    margin = math.ceil(3 * rms / 0.0005) * 0.0005
    print(f"{len(found)} pairs from {len({x['run'] for x in found})} runs: rms {rms:.4%}, max |d| "
          f"{max(abs(x['rel']) for x in found):.4%}; margin 3 x rms rounded up to 0.05%: {margin:.2%}")
    if args.out:
        fit = {"pairs": found, "rms": round(rms, 6), "margin": round(margin, 4), "rule": "3 x rms, rounded up to 0.05%"}
        args.out.write_text(json.dumps(fit, indent=1, sort_keys=True) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
