"""Benchmark the installed plans against cuBLAS on this GPU, side by side in one process.

Sections (all GPU ones run from the installed wheel; no compiler needed):
  entries  every plan entry: plan us, cuBLAS us, speedup, % of 4.8 TB/s (cold L2, graph replay)
  decode   one GLM-5.3-Flash decode step per rank (TP=4 and TP=8, 192 GEMMs in layer order) as one
           CUDA graph, at M = 1, 2, 4: back to back, and with a small elementwise kernel between GEMMs
  startup  import + load of all artifacts on this GPU (fresh subprocess)
  jit      (CPU machine) what the CuTe DSL JIT would spend compiling the same variants at startup

Writes bench.json, bench.md and bench.png (matplotlib, if installed) under --out.
"""

from __future__ import annotations

import datetime
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

SECTIONS = ("entries", "decode", "startup")
DECODE_MS = (1, 2, 4)
def bench_entries(trials: int, progress: bool) -> list[dict]:
    """Every planned (n, k, m) on this GPU: skinny_gemm.linear vs torch.mm, cold L2, graph replay."""
    import torch
    from tqdm import tqdm

    import skinny_gemm

    from ..runtime import ops
    from . import measure as ms

    man = skinny_gemm.manifest()
    if man is None:
        raise SystemExit("bench: no loaded manifest for this GPU (see `skinny-gemm env`)")
    device = torch.device("cuda", torch.cuda.current_device())
    cells = sorted((p["n"], p["k"], p["m"]) for p in man["plans"])
    rows = []
    shapes = sorted({(n, k) for n, k, _ in cells})
    bar = tqdm(total=len(cells), desc="entries", unit="cell", disable=not progress)
    for n, k in shapes:
        ms_ = [m for nn, kk, m in cells if (nn, kk) == (n, k)]
        inputs = ms.make_inputs(n, k, ms_, device)
        for m in ms_:
            x = inputs.tokens[m]
            if ops.plan(x, inputs.weights[0]) is None:
                # A silent fallback would be published as kernel time.
                raise SystemExit(f"bench: ({n}, {k}, {m}) is planned but would not dispatch; see `skinny-gemm env`")
            cublas = ms.capture([(lambda w=w: torch.mm(x, w.T)) for w in inputs.weights])
            plan = ms.capture([(lambda w=w: skinny_gemm.linear(x, w)) for w in inputs.weights])
            copies = len(inputs.weights)
            t = ms.time_graphs({"cublas": cublas, "plan": plan}, {"cublas": copies, "plan": copies}, trials=trials)
            cfg = skinny_gemm.plan_for(n, k, m)
            rows.append(
                {
                    "n": n,
                    "k": k,
                    "m": m,
                    "variant": cfg.name if cfg else None,
                    "cublas_us": t["cublas"],
                    "plan_us": t["plan"],
                    "speedup": t["cublas"] / t["plan"],
                    "plan_bw_pct": ms.bandwidth_pct(n, k, t["plan"]),
                    "cublas_bw_pct": ms.bandwidth_pct(n, k, t["cublas"]),
                }
            )
            del cublas, plan
            bar.update(1)
        del inputs
        torch.cuda.empty_cache()
    bar.close()
    return rows


def bench_decode(shapes_file: Path, trials: int, progress: bool) -> list[dict]:
    """One decode step per rank as a single CUDA graph, plans vs cuBLAS, with and without elementwise kernels between."""
    import torch
    import torch.nn.functional as F
    from tqdm import tqdm

    import skinny_gemm

    from . import measure as ms
    from . import plans

    shapes = json.loads(Path(shapes_file).read_text())
    device = torch.device("cuda", torch.cuda.current_device())
    rows = []
    combos = [(tp, m) for tp in (4, 8) for m in DECODE_MS]
    bar = tqdm(total=len(combos), desc="decode", unit="step", disable=not progress)
    for tp, m in combos:
        order = plans.decode_order(shapes, tp)
        weights = [(torch.randn(n, k, device=device) * 0.05).to(torch.bfloat16) for _, n, k in order]
        xs = [torch.randn(m, k, device=device).to(torch.bfloat16) for _, _, k in order]
        scratch = torch.randn(m, 4096, device=device).to(torch.bfloat16)

        def step(fn, between):
            def run():
                for x, w in zip(xs, weights):
                    fn(x, w)
                    if between:
                        # A stand-in for the norms/activations between projections of a real step.
                        scratch.mul_(1.0001)

            return run

        graphs = {}
        for between in (False, True):
            graphs[f"cublas{'+ew' if between else ''}"] = ms.capture([step(F.linear, between)])
            graphs[f"plan{'+ew' if between else ''}"] = ms.capture([step(skinny_gemm.linear, between)])
        t = ms.time_graphs(graphs, {name: 1 for name in graphs}, trials=trials)
        planned = sum(1 for _, n, k in order if m in skinny_gemm.planned_ms(n, k))
        rows.append(
            {
                "tp": tp,
                "m": m,
                "gemms": len(order),
                "planned_gemms": planned,
                "weight_gb": sum(n * k * 2 for _, n, k in order) / 1e9,
                **{f"{name}_us": value for name, value in t.items()},
            }
        )
        del graphs, weights, xs
        torch.cuda.empty_cache()
        bar.update(1)
    bar.close()
    return rows


STARTUP_PROBE = """
import time, json
t0 = time.perf_counter()
import torch
torch.cuda.init(); torch.zeros(1, device="cuda")
t1 = time.perf_counter()
import skinny_gemm
from skinny_gemm.runtime import loader
state = loader.ensure_loaded()
man = skinny_gemm.manifest()
t2 = time.perf_counter()
print(json.dumps({"torch_cuda_init_s": t1 - t0, "import_and_load_s": t2 - t1,
                  "variants": len(man["variants"]) if man else 0, "plans": len(man["plans"]) if man else 0}))
"""


def bench_startup() -> dict:
    """Import + load time of skinny_gemm in a fresh process, after torch has initialized CUDA (median of 5)."""
    runs = []
    for _ in range(5):
        out = subprocess.run([sys.executable, "-c", STARTUP_PROBE], capture_output=True, text=True, check=True)
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    return {
        "import_and_load_ms": statistics.median(r["import_and_load_s"] for r in runs) * 1000,
        "runs_ms": [r["import_and_load_s"] * 1000 for r in runs],
        "variants": runs[0]["variants"],
        "plans": runs[0]["plans"],
    }


def bench_jit(arch: str) -> dict:
    """On the CPU machine: what JIT-compiling every variant of the plan table would cost at server start."""
    from . import plans
    from .build import _compile_worker

    _, entries = plans.load(plans.plan_path(arch))
    configs = sorted({e.config for e in entries}, key=lambda c: c.name)
    t0 = time.perf_counter()
    import cutlass.cute  # noqa: F401  (the import itself is part of a JIT server's startup)

    t_import = time.perf_counter() - t0
    per = []
    for cfg in configs:
        t = time.perf_counter()
        _compile_worker(cfg.to_json(), arch)
        per.append(time.perf_counter() - t)
    return {
        "arch": arch,
        "variants": len(configs),
        "cutlass_import_s": t_import,
        "compile_total_s": sum(per),
        "compile_median_s": statistics.median(per),
        "note": "one process, serial, no cache, on this CPU machine",
    }


def geomean(values) -> float:
    """Geometric mean."""
    values = list(values)
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def markdown(data: dict) -> str:
    """The human-readable report."""
    lines = [f"# skinny-gemm bench: {data.get('gpu', '?')}, {data['date']}", "", f"Command: `{data['command']}`", ""]
    if "entries" in data:
        rows = data["entries"]
        lines += [
            f"## Plan entries ({len(rows)} cells; geomean speedup {geomean(r['speedup'] for r in rows):.3f}x, "
            + ", ".join(f"M={m}: {geomean(r['speedup'] for r in rows if r['m'] == m):.3f}x" for m in sorted({r['m'] for r in rows}))
            + ")",
            "",
            "| N | K | M | cuBLAS us | plan us | speedup | plan % of 4.8 TB/s | variant |",
            "|---:|---:|---:|---:|---:|---:|---:|---|",
        ]
        for r in rows:
            lines.append(
                f"| {r['n']} | {r['k']} | {r['m']} | {r['cublas_us']:.2f} | {r['plan_us']:.2f} | "
                f"{r['speedup']:.2f}x | {r['plan_bw_pct']:.1f}% | {r['variant']} |"
            )
        lines.append("")
    if "decode" in data:
        lines += [
            "## Decode step (one CUDA graph per rank, 192 GEMMs)",
            "",
            "| TP | M | planned GEMMs | weights GB | cuBLAS us | plans us | speedup | cuBLAS+ew us | plans+ew us | speedup |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for r in data["decode"]:
            lines.append(
                f"| {r['tp']} | {r['m']} | {r['planned_gemms']}/{r['gemms']} | {r['weight_gb']:.3f} | "
                f"{r['cublas_us']:.0f} | {r['plan_us']:.0f} | {r['cublas_us'] / r['plan_us']:.2f}x | "
                f"{r['cublas+ew_us']:.0f} | {r['plan+ew_us']:.0f} | {r['cublas+ew_us'] / r['plan+ew_us']:.2f}x |"
            )
        lines.append("")
    if "startup" in data:
        s = data["startup"]
        lines += [
            "## Startup",
            "",
            f"import + load of {s['variants']} variants ({s['plans']} plans): median {s['import_and_load_ms']:.1f} ms "
            f"(runs: {', '.join(f'{v:.1f}' for v in s['runs_ms'])} ms)",
            "",
        ]
    if "jit" in data:
        j = data["jit"]
        lines += [
            "## JIT compile of the same variants (CPU machine)",
            "",
            f"{j['variants']} {j['arch']} variants: `import cutlass.cute` {j['cutlass_import_s']:.2f} s + compile "
            f"{j['compile_total_s']:.1f} s (median {j['compile_median_s']:.2f} s per variant; {j['note']})",
            "",
        ]
    return "\n".join(lines)


def plot(data: dict, path: Path) -> bool:
    """Speedup per plan entry as a bar chart; False if matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = data.get("entries", [])
    if not rows:
        return False
    fig, ax = plt.subplots(figsize=(max(8, len(rows) * 0.22), 4.5))
    colors = {1: "#1f77b4", 2: "#ff7f0e", 3: "#2ca02c", 4: "#d62728"}
    ax.bar(range(len(rows)), [r["speedup"] for r in rows], color=[colors.get(r["m"], "gray") for r in rows])
    ax.axhline(1.0, color="black", lw=0.8)
    ax.axhline(1.05, color="gray", lw=0.8, ls="--")
    from matplotlib.patches import Patch

    ax.legend(handles=[Patch(color=c, label=f"M={m}") for m, c in colors.items()], loc="upper right")
    ax.set_xticks(range(len(rows)), [f"{r['n']}x{r['k']} M{r['m']}" for r in rows], rotation=90, fontsize=6)
    ax.set_ylabel("speedup over cuBLAS (cold L2, graph replay)")
    ax.set_title(f"skinny-gemm plans vs cuBLAS, {data.get('gpu', '')}, {data['date']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def add_arguments(p) -> None:
    """Register `bench`'s options."""
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, from {SECTIONS + ('jit',)}")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="output folder (bench.json, bench.md, bench.png)")
    p.add_argument("--shapes", type=Path, help="the model's shapes file, for the decode section")
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--arch", default="sm_90a", help="plan table to JIT-compile for the jit section")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=main)


def main(args) -> int:
    """Run the chosen sections and write the reports."""
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    data: dict = {"date": datetime.date.today().isoformat(), "command": "skinny-gemm bench " + " ".join(sys.argv[2:])}
    if any(s in sections for s in SECTIONS):
        import torch

        if not torch.cuda.is_available():
            print("bench: the entries/decode/startup sections need a GPU", file=sys.stderr)
            return 2
        data["gpu"] = torch.cuda.get_device_name()
    if "entries" in sections:
        data["entries"] = bench_entries(args.trials, not args.quiet)
    if "decode" in sections:
        if not args.shapes:
            print("bench: the decode section needs --shapes", file=sys.stderr)
            return 2
        data["decode"] = bench_decode(args.shapes, args.trials, not args.quiet)
    if "startup" in sections:
        data["startup"] = bench_startup()
    if "jit" in sections:
        data["jit"] = bench_jit(args.arch)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    report = markdown(data)
    (args.out / "bench.md").write_text(report + "\n")
    plotted = plot(data, args.out / "bench.png")
    print(report)
    print(f"wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}" + (f", {args.out / 'bench.png'}" if plotted else ""))
    return 0
