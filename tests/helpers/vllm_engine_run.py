"""Run a real vLLM engine on a tiny Llama or Qwen2 (dummy weights, re-initialised by vllm_test_plans) and report what the skinny-gemm plugin did, as JSON.

Used by tests/runtime/test_vllm_plugin.py, which runs it as a script in a
subprocess (vLLM spawns processes, hence the ``__main__`` guard). The
functions above ``main`` build what that subprocess needs: a site folder that
makes the checkout importable as the installed ``skinny_gemm`` package and
declares the plugins' entry points the way a wheel does, and a local model.
"""

import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HELPERS = Path(__file__).resolve().parent

# Small enough to run in seconds on 2 CPU cores; every projection has its own
# local shape (N, K), so a test plan table can name each one:
# qkv_proj (256, 128), o_proj (128, 128), gate_up_proj (384, 128),
# down_proj (128, 192), lm_head (1024, 128): vocab 1000 padded to 64.
TINY_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 128,
    "intermediate_size": 192,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 32,
    "vocab_size": 1000,
    "max_position_embeddings": 256,
    "rms_norm_eps": 1e-5,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}

# The tiny Llama's shapes with Qwen2's attention: a bias on qkv_proj (vLLM's Qwen2Attention has bias=True there and
# none on o_proj), which the routed forward must add; head_dim is hidden_size / num_attention_heads.
TINY_QWEN2 = {
    **{key: value for key, value in TINY_LLAMA.items() if key != "head_dim"},
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}

# The test plugin's entry-point name (for VLLM_PLUGINS).
TEST_PLUGIN = "skinny_gemm_test_plans"

# Different lengths so decode runs at M = 3, then 2, then 1.
PROMPTS = [[1, 17, 42, 99, 7], [1, 5, 6], [1, 300, 200, 100, 50, 25, 12]]
MAX_TOKENS = [12, 8, 4]

# Then one generate per batch size: that many prompts of one length, each for BATCH_TOKENS tokens, so that every
# decode step runs at M = batch size (the prefill computes the LM head at M = batch size too).
BATCHES = (1, 2, 4, 8, 16)
BATCH_TOKENS = 4


def batch_prompts(size: int) -> list[list[int]]:
    return [[1, 3 + 37 * i % 900, 11 + 53 * i % 900, 29 + 71 * i % 900] for i in range(size)]


def write_tiny_llama(folder: Path, config: dict = TINY_LLAMA) -> Path:
    """Write the tiny model's config.json into ``folder``; vLLM loads it with dummy weights, nothing is downloaded."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def make_site(folder: Path, with_skinny_gemm: bool = True, with_test_plugin: bool = True) -> Path:
    """A folder for PYTHONPATH laid out like site-packages after installing the wheel (plus the test plugin).

    ``skinny_gemm/`` links the checkout's folders as the wheel maps them, and
    dist-info folders declare the ``vllm.general_plugins`` entry points, so
    vLLM discovers the plugins through importlib.metadata in every process.
    Without skinny_gemm it holds only the test plugin (vllm_test_plans.py).
    """
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "vllm_test_plans.py").symlink_to(HELPERS / "vllm_test_plans.py")
    if with_skinny_gemm:
        package = folder / "skinny_gemm"
        package.mkdir()
        (package / "__init__.py").symlink_to(ROOT / "runtime" / "_package_init.py")
        for sub in ("runtime", "aot", "kernels", "artifacts"):
            if (ROOT / sub).is_dir():
                (package / sub).symlink_to(ROOT / sub)
        _dist_info(folder, "skinny_gemm", "skinny_gemm = skinny_gemm.runtime.vllm_plugin:register")
    if with_test_plugin:
        _dist_info(folder, "skinny_gemm_vllm_test", f"{TEST_PLUGIN} = vllm_test_plans:register")
    return folder


def _dist_info(folder: Path, name: str, entry_point: str) -> None:
    info = folder / f"{name}-0.0.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[vllm.general_plugins]\n{entry_point}\n")


def _launched(shape: list, before: list, after: list) -> list:
    """[[m, launches], ...] of weight shape ``shape`` between two of one worker's launch counts ([[n, k, m, c], ...])."""
    start = {m: c for n, k, m, c in before if [n, k] == shape}
    return sorted([m, c - start.get(m, 0)] for n, k, m, c in after if [n, k] == shape and c > start.get(m, 0))


def main() -> None:
    """argv: model folder, output JSON path. Environment: SKINNY_TEST_COMPILE=1 (torch.compile, else eager),
    SKINNY_TEST_TP (tensor-parallel size), SKINNY_TEST_CONTROLS (JSON list of [n, k] or [n, k, m] whose routed
    output the test double scales, after the correct generates: [n, k] at every M, one mixed-length generate;
    [n, k, m] at M = m only, one generate of the batch of m prompts), SKINNY_TEST_SABOTAGES (JSON
    [[name, controls], ...]: then with each sabotage of vllm_test_plans switched on, every generate again, its
    reports and the controls given)."""
    model_dir, out = sys.argv[1], sys.argv[2]
    import functools

    import vllm_test_plans
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        enforce_eager=os.environ.get("SKINNY_TEST_COMPILE") != "1",
        tensor_parallel_size=int(os.environ.get("SKINNY_TEST_TP", "1")),
        gpu_memory_utilization=0.3,
        dtype="bfloat16",
        max_model_len=64,
        max_num_seqs=max(BATCHES),
        seed=0,
    )
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False, logprobs=0) for n in MAX_TOKENS
    ]

    def generate(prompts=PROMPTS, params=params):
        # Every request is queued before the scheduler sees any, so that each decode step runs at M = the number of
        # prompts still decoding: with vLLM's engine in its own process (the "on" run), the engine core starts
        # stepping on the first request that reaches it, and a batch of 16 could prefill as 9 then 7 and never
        # decode at M = 16. Paused scheduling (vLLM's sleep level 0) queues the adds; waking it schedules them all.
        llm.sleep(level=0)
        llm.enqueue([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        llm.wake_up(tags=["scheduling"])
        outputs = llm.wait_for_completion(use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        logprobs = [
            [step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outputs
        ]
        return {"tokens": tokens, "logprobs": logprobs}

    batch_params = SamplingParams(
        temperature=0.0, max_tokens=BATCH_TOKENS, ignore_eos=True, detokenize=False, logprobs=0
    )

    def generate_batch(size):
        return generate(batch_prompts(size), batch_params)

    def run_all(controls):
        found = generate()
        # Reports before and after the batches: their difference counts the batches' decode steps.
        found["workers"] = llm.apply_model(vllm_test_plans.report)
        found["batches"] = {size: generate_batch(size) for size in BATCHES}
        found["workers_after_batches"] = llm.apply_model(vllm_test_plans.report)
        found["controls"] = []
        for control in controls:
            shape, ms = control[:2], control[2:] or None
            llm.apply_model(functools.partial(vllm_test_plans.set_wrong, shape, ms))
            before = llm.apply_model(vllm_test_plans.launches)
            outputs = generate_batch(ms[0]) if ms else generate()
            # What the control's generate launched of its shape, per rank: a control is judged only where its
            # shape really launched at its M (tests/runtime/test_vllm_plugin.py).
            after = llm.apply_model(vllm_test_plans.launches)
            launched = [_launched(shape, b, a) for b, a in zip(before, after, strict=True)]
            found["controls"].append({"shape": shape, "m": ms[0] if ms else None, "launched": launched, **outputs})
        llm.apply_model(functools.partial(vllm_test_plans.set_wrong, None, None))
        return found

    result = {"helper_pid": os.getpid(), **run_all(json.loads(os.environ.get("SKINNY_TEST_CONTROLS", "[]")))}
    result["sabotaged"] = {}
    for name, controls in json.loads(os.environ.get(vllm_test_plans.ENV_SABOTAGES, "[]")):
        llm.apply_model(functools.partial(vllm_test_plans.set_sabotage, name))
        result["sabotaged"][name] = run_all(controls)
        llm.apply_model(functools.partial(vllm_test_plans.set_sabotage, None))
    Path(out).write_text(json.dumps(result))
    if "SKINNY_GEMM_COUNTERS" not in os.environ:
        _end_now()
    _shut_down(llm)


# An EngineCore can miss its shutdown SIGTERM: seen twice on a busy 2-core machine, its main thread idle in
# input_queue.get with the wakeup lost, until a second SIGTERM ended it. Its exit itself takes seconds there, and a
# SIGTERM during the exit would kill it (the engine restores the default action first), so wait this long first.
RESIGNAL_AFTER_S = 60.0


def _shut_down(llm, resignal_after_s: float = RESIGNAL_AFTER_S) -> None:
    """Stop the engine now, giving its process all the time its exit needs: the counters are written by its exit
    handlers, and vLLM's own teardown at interpreter exit kills an engine process still running after 5 s (on a busy
    2-core machine it was, and the file was never written). An engine process still alive after
    ``resignal_after_s`` gets SIGTERM again, every ``resignal_after_s``, until vLLM's shutdown returns."""
    import inspect
    import signal
    import threading

    core = llm.llm_engine.engine_core
    manager = getattr(getattr(core, "resources", None), "engine_manager", None)
    procs = list(getattr(manager, "processes", None) or ())
    kwargs = {"timeout": 600} if "timeout" in inspect.signature(core.shutdown).parameters else {}
    raised = []

    def stop() -> None:
        try:
            core.shutdown(**kwargs)
        except BaseException as exc:  # re-raised in the caller's thread
            raised.append(exc)

    stopper = threading.Thread(target=stop, name="engine-shutdown", daemon=True)
    stopper.start()
    stopper.join(resignal_after_s)
    while stopper.is_alive():
        for proc in procs:
            if proc.is_alive():
                os.kill(proc.pid, signal.SIGTERM)
        stopper.join(resignal_after_s)
    if raised:
        raise raised[0]


def _end_now() -> None:
    """End this run at once, its vLLM processes with it: everything is in the output file, and vLLM's own teardown
    at exit (its workers given a grace period, then signalled) took 5-6 s of every run on 2 cores. A run that writes
    skinny-gemm's counters at exit ($SKINNY_GEMM_COUNTERS) exits normally: that write is what it tests."""
    import psutil  # a dependency of vLLM

    # multiprocessing's resource tracker stays: once this process is gone it unlinks the shared memory that vLLM's
    # processes registered with it (their message queues), which a kill leaves behind.
    children = [
        child
        for child in psutil.Process().children(recursive=True)
        if "multiprocessing.resource_tracker" not in " ".join(child.cmdline())
    ]
    for child in children:
        child.kill()
    psutil.wait_procs(children, timeout=30)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
