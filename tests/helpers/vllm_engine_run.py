"""Run a real vLLM engine on a tiny Llama (dummy weights, re-initialised by vllm_test_plans) and report what the skinny-gemm plugin did, as JSON.

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

# The test plugin's entry-point name (for VLLM_PLUGINS).
TEST_PLUGIN = "skinny_gemm_test_plans"

# Different lengths so decode runs at M = 3, then 2, then 1.
PROMPTS = [[1, 17, 42, 99, 7], [1, 5, 6], [1, 300, 200, 100, 50, 25, 12]]
MAX_TOKENS = [12, 8, 4]


def write_tiny_llama(folder: Path) -> Path:
    """Write the tiny Llama's config.json into ``folder``; vLLM loads it with dummy weights, nothing is downloaded."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(TINY_LLAMA))
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


def main() -> None:
    """argv: model folder, output JSON path. Environment: SKINNY_TEST_COMPILE=1 (torch.compile, else eager),
    SKINNY_TEST_TP (tensor-parallel size), SKINNY_TEST_CONTROLS (JSON list of [n, k] whose routed output the
    test double scales, one generate each, after the correct one)."""
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
        max_num_seqs=4,
        seed=0,
    )
    params = [
        SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False, logprobs=0)
        for n in MAX_TOKENS
    ]

    def generate():
        outputs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params, use_tqdm=False)
        tokens = [list(o.outputs[0].token_ids) for o in outputs]
        logprobs = [
            [step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)] for o in outputs
        ]
        return {"tokens": tokens, "logprobs": logprobs}

    result = {"helper_pid": os.getpid(), **generate()}
    # The report is taken before the controls, so its call counts are those of the correct generate.
    result["workers"] = llm.apply_model(vllm_test_plans.report)
    result["controls"] = []
    for shape in json.loads(os.environ.get("SKINNY_TEST_CONTROLS", "[]")):
        llm.apply_model(functools.partial(vllm_test_plans.set_wrong, shape))
        result["controls"].append({"shape": shape, **generate()})
    llm.apply_model(functools.partial(vllm_test_plans.set_wrong, None))
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
