"""A real vLLM engine on the GPU with the installed wheel: two Llama-3.1-8B layers (its real per-rank shapes),
torch.compile and CUDA graphs on (and enforce_eager), decode at batch 1, 2, 4, 8, 16.

With the plugin on, every planned (N, K, M) the decode steps run launches our kernel (the dispatch's own
counters, which count a launch only once every check passed and the driver took it) and none falls back;
the greedy logprobs stay within LOGPROB_BOUND of the plugin-off engine's (until a near-tie flips a token). The
negative control: the same engine with every one of our launches made wrong on the GPU (the helper's sabotage)
must break that bound. Skipped without a GPU or vLLM.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

HELPERS = Path(__file__).resolve().parents[1] / "helpers"
BATCHES = (1, 2, 4, 8, 16)
# Llama-3.1-8B's shapes, two layers: qkv (6144, 4096), o (4096, 4096), gate_up (28672, 4096),
# down (4096, 14336), lm_head (128256, 4096).
LLAMA_2_LAYERS = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 2,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "hidden_act": "silu",
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 1,
    "eos_token_id": 2,
}
# Our kernels round like cuBLAS (one bf16 rounding of an fp32 sum) but sum in another order: each projection
# differs by about one bf16 ulp. Through two layers and the head that moves a logprob by far less than this.
LOGPROB_BOUND = 0.05

pytestmark = [
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (a real vLLM engine)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM installed beside the wheel"),
]


def _engine(tmp: Path, name: str, env_changes: dict) -> dict:
    model = tmp / "llama-2-layers"
    model.mkdir(exist_ok=True)
    (model / "config.json").write_text(json.dumps(LLAMA_2_LAYERS))
    site = tmp / "site"
    if not site.exists():  # the test plugin only (meaningful dummy weights); skinny_gemm is the installed wheel
        spec = importlib.util.spec_from_file_location("vllm_engine_run", HELPERS / "vllm_engine_run.py")
        helper = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(helper)
        helper.make_site(site, with_skinny_gemm=False)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SKINNY_")}
    env.update(
        PYTHONPATH=os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
        VLLM_ENABLE_V1_MULTIPROCESSING="0",
        VLLM_ALLOW_INSECURE_SERIALIZATION="1",
        VLLM_CACHE_ROOT=str(tmp / f"cache-{name}"),
        **env_changes,
    )
    env.setdefault("VLLM_USE_FLASHINFER_SAMPLER", "0")
    out = tmp / f"{name}.json"
    proc = subprocess.run(
        [sys.executable, str(HELPERS / "vllm_gpu_engine.py"), str(model), str(out)],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert proc.returncode == 0, f"engine {name} failed:\n{(proc.stdout + proc.stderr)[-6000:]}"
    return json.loads(out.read_text())


@pytest.fixture(scope="module", params=["compiled", "eager"])
def arms(request, tmp_path_factory):
    tmp = tmp_path_factory.mktemp(f"vllm-gpu-{request.param}")
    mode = {"SKINNY_TEST_EAGER": "1"} if request.param == "eager" else {}
    arms = (("off", {"SKINNY_GEMM_VLLM": "0"}), ("on", {"SKINNY_GEMM_VLLM": "1"}))
    arms += (("sabotaged", {"SKINNY_GEMM_VLLM": "1", "SKINNY_TEST_SABOTAGE": "1"}),)
    return {arm: _engine(tmp, arm, {**mode, **switch}) for arm, switch in arms}


def test_every_planned_shape_and_m_launches_our_kernel(arms):
    on = arms["on"]
    assert on["routes"], "nothing routed: this wheel has no plan for Llama-3.1-8B's shapes"
    planned = {(n, k, m) for n, k, ms in on["routes"] for m in ms if m in BATCHES}
    assert planned, "no plan at the batch sizes the test runs"
    launched = {(n, k, m) for n, k, m, c in on["counters"]["launches"] if c > 0}
    assert planned <= launched, f"planned but never launched: {sorted(planned - launched)}"
    fell = [f for f in on["counters"]["fallbacks"] if tuple(f[:3]) in planned]
    assert not fell, f"fell back at a planned M: {fell}"


def _worst_logprob_difference(off_runs: dict, on_runs: dict) -> tuple[float, int]:
    """The largest chosen-token logprob difference, step by step until the greedy tokens part; decode steps seen."""
    worst, decode_steps = 0.0, 0
    for batch in map(str, BATCHES):
        for off, on in zip(off_runs[batch], on_runs[batch]):
            for step, (t_off, t_on, l_off, l_on) in enumerate(
                zip(off["tokens"], on["tokens"], off["logprobs"], on["logprobs"])
            ):
                worst = max(worst, abs(l_off - l_on))
                decode_steps += step > 0
                if t_off != t_on:
                    break
    return worst, decode_steps


def test_logprobs_with_the_plugin_stay_within_the_bound(arms):
    """Step by step until the greedy tokens part: the chosen token's logprob within LOGPROB_BOUND. Random weights
    over a 128256-token vocabulary make near-ties common, so a greedy token may flip (then the sequences differ
    and are compared no further); at that step both arms' chosen (top) logprobs must still be within the bound,
    which a wrong kernel does not meet. Token 1 comes from the prefill (no plan at that M): from token 2 on, each
    is a decode step at M = batch."""
    worst, decode_steps = _worst_logprob_difference(arms["off"]["runs"], arms["on"]["runs"])
    print(f"\nlogprobs, plugin on vs off: max difference {worst:.4f} over {decode_steps} decode steps")
    assert decode_steps >= sum(BATCHES), "fewer decode steps compared than requests"
    assert worst <= LOGPROB_BOUND, f"logprob moved by {worst} (bound {LOGPROB_BOUND})"


def test_negative_control_a_wrong_kernel_result_breaks_the_bound(arms):
    """The check above can fail: with every launch of ours doubled on the GPU the logprobs leave the bound, and the
    tokens part, at every batch size (so each M class, 1-4 and 8-16, is judged by a wrong kernel)."""
    bad = arms["sabotaged"]
    launched = {m for _, _, m, c in bad["counters"]["launches"] if c > 0}
    assert set(BATCHES) <= launched, f"the sabotaged engine launched ours only at M = {sorted(launched)}"
    worst, _ = _worst_logprob_difference(arms["off"]["runs"], bad["runs"])
    print(f"\nlogprobs, sabotaged vs off: max difference {worst:.4f}")
    assert worst > LOGPROB_BOUND, f"a doubled projection moved a logprob by only {worst} (bound {LOGPROB_BOUND})"
    for batch in map(str, BATCHES):
        same = [off["tokens"] == on["tokens"] for off, on in zip(arms["off"]["runs"][batch], bad["runs"][batch])]
        assert not all(same), f"batch {batch}: every sequence identical with a wrong kernel"
