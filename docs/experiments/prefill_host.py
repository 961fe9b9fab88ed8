"""Where the plugin's prefill spends its host time (GPU, H200; 2026-12-04).

  PYTHONPATH=$HOME/site python3 docs/experiments/prefill_host.py --out $OUT/prefill-host [--model llama-3.1-8b]

Part 1, no vLLM: host microseconds per call at M = 1024 (4096 x 4096, bf16, inference mode, the queue never
full) of F.linear, skinny_gemm.linear and the vLLM route's custom op, each also under cProfile (top functions).
Part 2, one engine per arm (plugin off, on, and with --fix-site DIR on with the skinny-gemm wheel installed in DIR;
VLLM_ENABLE_V1_MULTIPROCESSING=0): after warm-up, five 1-token
generates of --prompts (16) x 64 prompt tokens timed, then one under cProfile; the top functions by own and cumulative time
go to OUT/engine-ARM-0.txt. The engines run in subprocesses of this script (one vLLM per process).
"""

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def _stats(prof, limit=40) -> str:
    buf = io.StringIO()
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(limit)
    st.sort_stats("cumulative").print_stats(limit)
    return buf.getvalue()


def _exp_ops():
    """The same body (F.linear) registered both ways: torch.library.custom_op and Library.define/impl."""
    import torch
    import torch.nn.functional as F

    def body(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return F.linear(x, weight, bias)

    op = torch.library.custom_op("exp_custom::lin", mutates_args=())(body)
    op.register_fake(lambda x, w, b: x.new_empty(x.shape[:-1] + (w.shape[0],)))
    lib = torch.library.Library("exp_lib", "FRAGMENT")
    lib.define("lin(Tensor x, Tensor weight, Tensor? bias) -> Tensor")
    lib.impl("lin", body, "CUDA")
    return torch.ops.exp_custom.lin, torch.ops.exp_lib.lin, lib


def micro(out: Path) -> None:
    import torch
    import torch.nn.functional as F

    import skinny_gemm
    from skinny_gemm.runtime import vllm_routes

    vllm_routes.define_op()
    x = torch.randn(1024, 4096, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    try:
        from vllm.model_executor.parameter import ModelWeightParameter

        vw = ModelWeightParameter(data=w, input_dim=1, output_dim=0, weight_loader=lambda *a, **k: None)
    except Exception as exc:  # noqa: BLE001
        print(f"no vLLM parameter class: {exc}")
        vw = torch.nn.Parameter(w, requires_grad=False)
    if hasattr(vllm_routes, "_ROUTED_MS"):
        vllm_routes._ROUTED_MS[(4096, 4096, w.device)] = frozenset({1, 2, 4, 8, 16})
    op = torch.ops.skinny_gemm_vllm.routed_linear
    # Since 8db1602 the op takes the weight's transpose (its parameter is named weight_t).
    transposed = "weight_t" in vllm_routes._routed_linear.__code__.co_varnames

    def route(x, w, b):
        return op(x, w.t() if transposed else w, b)

    custom, library, _keep = _exp_ops()
    fns = {
        "F.linear": lambda: F.linear(x, w),
        "F.linear (vLLM parameter)": lambda: F.linear(x, vw),
        "skinny_gemm.linear": lambda: skinny_gemm.linear(x, w),
        "routed_linear op": lambda: route(x, w, None),
        "routed_linear op (vLLM parameter)": lambda: route(x, vw, None),
        "custom_op F.linear": lambda: custom(x, w, None),
        "custom_op F.linear (vLLM parameter)": lambda: custom(x, vw, None),
        "Library op F.linear": lambda: library(x, w, None),
        "Library op F.linear (vLLM parameter)": lambda: library(x, vw, None),
    }
    lines = [f"skinny_gemm from {skinny_gemm.__file__}"]
    with torch.inference_mode():
        for i, (name, fn) in enumerate(fns.items()):
            for _ in range(20):
                fn()
            torch.cuda.synchronize()
            per = []
            for _ in range(7):
                t0 = time.perf_counter()
                for _ in range(50):  # ~50 x 40 us of GPU work: the launch queue never fills
                    fn()
                per.append((time.perf_counter() - t0) / 50 * 1e6)
                torch.cuda.synchronize()
            lines.append(f"{name}: host {statistics.median(per):.1f} us per call (runs {[round(p, 1) for p in per]})")
            print(lines[-1], flush=True)
            prof = cProfile.Profile()
            prof.enable()
            for _ in range(50):
                fn()
            prof.disable()
            torch.cuda.synchronize()
            (out / f"micro-{i}.txt").write_text(name + "\n" + _stats(prof, 25))
    (out / "micro.txt").write_text("\n".join(lines) + "\n")


def engine(arm: str, model_dir: str, out: Path, n_prompts: int) -> None:
    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        max_model_len=136,
        max_num_seqs=16,
        enable_prefix_caching=False,
        gpu_memory_utilization=0.85,
    )
    prompts = [{"prompt_token_ids": [(7 + 31 * i + 13 * j) % 990 + 10 for j in range(64)]} for i in range(n_prompts)]
    params = SamplingParams(temperature=0.0, max_tokens=1, min_tokens=1, ignore_eos=True, detokenize=False)

    def gen() -> float:
        t0 = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return (time.perf_counter() - t0) * 1e3

    import skinny_gemm
    from skinny_gemm.runtime import vllm_routes

    kind = "Library op, unplanned M first" if hasattr(vllm_routes, "_ROUTED_MS") else "custom_op"
    if "weight_t" in vllm_routes._routed_linear.__code__.co_varnames:
        kind += ", the weight as a view"
    where = f"skinny_gemm from {skinny_gemm.__file__}, {kind}"
    for _ in range(3):
        gen()
    walls = [gen() for _ in range(5)]
    prof = cProfile.Profile()
    prof.enable()
    profiled = gen()
    prof.disable()
    torch.cuda.synchronize()
    head = f"{arm} ({where}): 1-token generate at {n_prompts} x 64: {[round(w, 1) for w in walls]} ms; under cProfile {profiled:.1f} ms"
    print(head, flush=True)
    n = len(list(out.glob(f"engine-{arm}*.txt")))
    (out / f"engine-{arm}-{n}.txt").write_text(head + "\n" + _stats(prof, 60))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--model", default="llama-3.1-8b")
    ap.add_argument("--fix-site", help="a folder with a second skinny-gemm wheel installed: a third arm, 'fix'")
    ap.add_argument("--skip-micro", action="store_true")
    ap.add_argument("--prompts", type=int, default=16, help="prompts of 64 tokens per 1-token generate")
    ap.add_argument("--arm", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", help=argparse.SUPPRESS)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.arm:
        engine(args.arm, args.model_dir, out, args.prompts)
        return
    if not args.skip_micro:
        micro(out)
    from skinny_gemm.aot.vllm_bench import model_config

    with tempfile.TemporaryDirectory() as tmp:
        _, folder = model_config(args.model, Path(tmp) / "model")
        arms = [("off", None), ("on", None)] + ([("fix", args.fix_site)] if args.fix_site else [])
        for arm, site in arms:
            env = {
                **os.environ,
                "SKINNY_GEMM_VLLM": "0" if arm == "off" else "1",
                "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
            }
            if site:
                env["PYTHONPATH"] = f"{site}:{env.get('PYTHONPATH', '')}"
            cmd = [
                sys.executable,
                __file__,
                "--out",
                str(out),
                "--arm",
                arm,
                "--model-dir",
                str(folder),
                "--prompts",
                str(args.prompts),
            ]
            subprocess.run(cmd, env=env, check=True)
    print(json.dumps(sorted(p.name for p in out.iterdir())))


if __name__ == "__main__":
    main()
