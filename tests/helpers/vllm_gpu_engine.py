"""Run a real vLLM engine on a GPU (dummy weights re-initialised by vllm_test_plans) and report, as JSON, the
greedy tokens and logprobs at batch sizes 1, 2, 4, 8, 16 and what skinny-gemm launched (its counters).

Used by tests/gpu/test_vllm_engine_gpu.py as a script in a subprocess, the engine in that process
(VLLM_ENABLE_V1_MULTIPROCESSING=0), so the counters read here are the model's.
argv: model folder, output JSON path; SKINNY_TEST_EAGER=1 for enforce_eager; SKINNY_TEST_SABOTAGE=1 for the
negative control: every launch of our kernels is followed by a second launch of the same cubin with the output
as its residual (4th pointer), so the real kernel leaves twice its product (a wrong result made where the work
is done, on the GPU, inside vLLM's graphs).
"""

import json
import os
import sys
from pathlib import Path

BATCHES = (1, 2, 4, 8, 16)
PROMPT_LEN = 16
DECODE = 8


def sabotage() -> None:
    """Make every launch of ours write a wrong result with the real kernel: a second launch adding the output."""
    from skinny_gemm.runtime import driver

    real = driver.launch_raw

    def doubled(rec, a, w, out, residual, stream):
        err = real(rec, a, w, out, residual, stream)
        return err if int(err) != 0 else real(rec, a, w, out, out, stream)

    driver.launch_raw = doubled


def main() -> None:
    model_dir, out = sys.argv[1], sys.argv[2]
    from vllm import LLM, SamplingParams

    if os.environ.get("SKINNY_TEST_SABOTAGE") == "1":
        sabotage()

    llm = LLM(
        model=model_dir,
        load_format="dummy",
        skip_tokenizer_init=True,
        dtype="bfloat16",
        seed=0,
        max_model_len=128,
        max_num_seqs=max(BATCHES),
        gpu_memory_utilization=0.3,
        enable_prefix_caching=False,
        enforce_eager=os.environ.get("SKINNY_TEST_EAGER") == "1",
    )
    params = SamplingParams(temperature=0.0, max_tokens=DECODE, ignore_eos=True, detokenize=False, logprobs=0)
    runs = {}
    for batch in BATCHES:
        prompts = [
            {"prompt_token_ids": [(11 + 37 * i + 7 * j) % 5000 + 3 for j in range(PROMPT_LEN)]} for i in range(batch)
        ]
        outputs = llm.generate(prompts, params, use_tqdm=False)
        runs[str(batch)] = [
            {
                "tokens": list(o.outputs[0].token_ids),
                "logprobs": [step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)],
            }
            for o in outputs
        ]
    result = {"runs": runs, "counters": None, "routes": []}
    if os.environ.get("SKINNY_GEMM_VLLM") != "0":
        import skinny_gemm
        from skinny_gemm.runtime import vllm_routes

        result["counters"] = skinny_gemm.counters()
        result["routes"] = llm.apply_model(
            lambda model: sorted(
                {(m.n, m.k, tuple(sorted(m.ms))) for _, m in vllm_routes.layer_matches(model).values() if m.routed}
            )
        )[0]
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main()
