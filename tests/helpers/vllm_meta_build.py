"""Build a model the way vLLM builds it, on the meta device, and list the per-rank linears it holds, as JSON.

Used by tests/runtime/test_coverage.py, which runs it as a script (one vLLM
import for many configs). argv: a JSON file ``[[config_dict, tp], ...]``, the
output JSON path. For each pair it writes ``{"linears": {name: [cls, n, k,
bias, candidate, dtype]}, "logits": name, "logits_shape": [n, k]}`` or
``{"error": text}`` where vLLM refuses
the config at that TP size. The model class is vLLM's own for the config's
architecture, constructed under a VllmConfig of that TP size with rank 0's
view of the process groups (no process group is started: each rank builds the
same local shapes), so its layers' weights have the local shapes vLLM loads.
``candidate`` is whether the skinny-gemm plugin would consider the layer
(runtime/vllm_routes._is_candidate: vLLM's plain unquantized method, not a MoE
router, or an LM head's); ``logits`` names the module vLLM computes the
logits with (its LM head, or the embedding where vLLM ties it).
"""

import json
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace


class _Group(SimpleNamespace):
    """Rank 0 of a process group of ``world_size`` ranks, as the layers' constructors read it."""

    def __init__(self, world_size: int):
        # device_group.size(): the MoE layers read their expert-parallel size there.
        group = SimpleNamespace(size=lambda: world_size)
        super().__init__(
            world_size=world_size,
            rank_in_group=0,
            rank=0,
            local_rank=0,
            ranks=list(range(world_size)),
            is_first_rank=True,
            is_last_rank=True,
            device_group=group,
            cpu_group=group,
        )


def _fake_groups(tp: int) -> None:
    from vllm.distributed import parallel_state as ps

    ps._TP = _Group(tp)
    for name in ("_PP", "_DP", "_EP", "_DCP", "_PCP", "_ETP", "_EPLB", "_WORLD"):
        if hasattr(ps, name):
            setattr(ps, name, _Group(tp if name == "_WORLD" else 1))


def build(config: dict, tp: int, folder: Path) -> dict:
    import torch
    from vllm.config import ModelConfig, ParallelConfig, VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.fused_moe.router.gate_linear import GateLinear
    from vllm.model_executor.layers.linear import LinearBase, UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import (
        ParallelLMHead,
        UnquantizedEmbeddingMethod,
        VocabParallelEmbedding,
    )
    from vllm.model_executor.model_loader.utils import get_model_architecture
    from vllm.utils.torch_utils import set_default_torch_dtype

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(config))
    # enforce_eager: vLLM's compile mode only wraps each custom op's forward in torch.compile (the activations'
    # SiluAndMul: 25,000 wrappers over the 156 builds, 90 of the 140 s); the layers and their weights' shapes are
    # the same (the output was compared byte for byte with and without it).
    model_config = ModelConfig(
        model=str(folder), dtype="bfloat16", skip_tokenizer_init=True, max_model_len=256, seed=0, enforce_eager=True
    )
    vllm_config = VllmConfig(model_config=model_config, parallel_config=ParallelConfig(tensor_parallel_size=tp))
    _fake_groups(tp)
    model_class, _ = get_model_architecture(model_config)
    # As vLLM's loader builds it (BaseModelLoader.load_model), on the meta device instead of the GPU.
    with set_current_vllm_config(vllm_config), set_default_torch_dtype(model_config.dtype), torch.device("meta"):
        model = model_class(vllm_config=vllm_config, prefix="")
    linears = {}
    for name, module in model.named_modules():
        weight = getattr(module, "weight", None)
        if isinstance(module, LinearBase | ParallelLMHead) and isinstance(weight, torch.Tensor) and weight.dim() == 2:
            method = getattr(module, "quant_method", None)
            candidate = (type(method) is UnquantizedLinearMethod and not isinstance(module, GateLinear)) or (
                type(method) is UnquantizedEmbeddingMethod and isinstance(module, ParallelLMHead)
            )
            bias = getattr(module, "bias", None)
            linears[name] = [
                type(module).__name__,
                *weight.shape,
                isinstance(bias, torch.Tensor),
                candidate,
                str(weight.dtype),
            ]
    logits, shape = "", None
    processor = getattr(model, "logits_processor", None)
    if processor is not None:
        # The module whose weight the logits processor reads: vLLM passes it at each call; find it by identity.
        head = getattr(model, "lm_head", None)
        embeds = [
            n
            for n, m in model.named_modules()
            if isinstance(m, VocabParallelEmbedding) and not isinstance(m, ParallelLMHead)
        ]
        logits = "lm_head" if isinstance(head, ParallelLMHead) else (embeds[0] if embeds else "")
        shape = list(model.get_submodule(logits).weight.shape) if logits else None
    return {"linears": linears, "logits": logits, "logits_shape": shape}


def main() -> None:
    pairs = json.loads(Path(sys.argv[1]).read_text())
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for i, (config, tp) in enumerate(pairs):
            try:
                out.append(build(config, tp, Path(tmp) / str(i)))
            except Exception as exc:  # vLLM refusing the config (an assertion, a ValueError...) is the answer
                out.append({"error": f"{type(exc).__name__}: {exc}"[:300]})
    Path(sys.argv[2]).write_text(json.dumps(out))


if __name__ == "__main__":
    main()
