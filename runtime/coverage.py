"""``skinny-gemm coverage``: which per-rank linears of a model vLLM would route to this wheel's plans, before deploying.

A model is a Hugging Face ``config.json`` (or the folder holding one) of a
family this module can derive, or a slug of the model catalogue
(``kernels/models/<slug>.json``, whose ``linears`` hold the shapes). For a
tensor-parallel size it lists every linear layer vLLM builds on one rank
(local weight ``[N, K]``, GEMM calls per decode step, dtype, bias), whether the
vLLM plugin would route it, at which of M = 1, 2, 4, 8, 16 it is planned for
the wheel's arch, and the share of one step's projection bytes (weight bytes
x calls, every linear of any dtype; MoE experts are grouped GEMMs, not
linears, and are left out) that planned, routed layers cover.

Families: dense (Llama, Mistral, Qwen2/3, Gemma 1-3, Phi-3/4), MoE (Qwen3-MoE,
gpt-oss, GLM-4.5) and MLA (DeepSeek-V2/V3, Kimi-K2), and multimodal wrappers
(Gemma 3, Mistral 3, Llava) through their ``text_config``: the language model's
linears, which decode runs. Fields a config leaves out take the defaults of its
Hugging Face config class, as vLLM reads them; a split vLLM refuses is refused.
Anything else is one line saying so; the plugin's summary line in a running
vLLM tells the truth for any model. Needs neither a GPU nor cutlass: it reads
JSON only.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
from dataclasses import asdict
from pathlib import Path

from ..kernels.config import DECODE_MS
from . import modelfile, sharding
from .artifacts import artifacts_root, open_dir
from .jsonfile import I32_MAX, Fields, InputError, read_json, show, where
from .manifest import CAPABILITY_FOR_ARCH, MANIFEST_NAME
from .modelfile import CANDIDATE, FAST_PATH, ROUTER, Linear

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
PLANS_DIR = PACKAGE_ROOT / "kernels" / "plans"
DEFAULTS_FILE = Path(__file__).resolve().parent / "hf_defaults.json"
# vLLM's decode batch sizes up to 16 (its CUDA-graph sizes 1, 2, 4, 8, 16: M=3 arrives as 4).
MS = DECODE_MS
BYTES_PER_ELEMENT = {"bf16": 2, "fp16": 2, "fp32": 4, "fp8": 1, "int8": 1, "int4": 0.5, "mxfp4": 0.5}
# Gemma-2's logits: vLLM multiplies by embed_tokens itself (no LM head layer, nothing the plugin sees).
EMBEDDING_LOGITS = "logits by the embedding (not a candidate)"
SUMMARY_HINT = "run vLLM with the wheel installed and read its 'skinny-gemm vLLM plugin:' summary line instead"

# Architecture -> the model_type of its Hugging Face config class.
DENSE = {
    "LlamaForCausalLM": "llama",
    "MistralForCausalLM": "mistral",
    "Qwen2ForCausalLM": "qwen2",
    "Qwen3ForCausalLM": "qwen3",
    "GemmaForCausalLM": "gemma",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3_text",
    "Phi3ForCausalLM": "phi3",
}
MOE = {"Qwen3MoeForCausalLM": "qwen3_moe"}
MLA = {"DeepseekV2ForCausalLM": "deepseek_v2", "DeepseekV3ForCausalLM": "deepseek_v3"}
GPT_OSS = {"GptOssForCausalLM": "gpt_oss"}
GLM4_MOE = {"Glm4MoeForCausalLM": "glm4_moe"}
# Multimodal wrappers -> the model_type their text_config defaults to; vLLM builds that language model.
WRAPPERS = {
    "Gemma3ForConditionalGeneration": "gemma3_text",
    "Mistral3ForConditionalGeneration": "mistral",
    "LlavaForConditionalGeneration": "llama",
}
TEXT_ARCH = {
    model_type: arch for families in (DENSE, MOE, MLA, GPT_OSS, GLM4_MOE) for arch, model_type in families.items()
}


class CoverageError(ValueError):
    """Bad input: one line naming the file and the field."""


def bytes_per_step(lin: Linear) -> float:
    """The weight bytes one decode step reads through this linear (every call)."""
    return lin.n * lin.k * BYTES_PER_ELEMENT.get(lin.dtype, 2) * lin.calls


# ---- models --------------------------------------------------------------------------------------------------------


@functools.cache
def hf_defaults() -> dict[str, dict]:
    """model_type -> {field: default} of its Hugging Face config class (hf_defaults.json, beside this module).

    A config.json that leaves a field out gets the class's default, as vLLM reads it (Gemma-3's text_config
    without vocab_size or head counts); one set to null stays None, as in the class (DeepSeek-V2-Lite's
    q_lora_rank), and a field the class derives (head_dim: hidden_size / num_attention_heads) has no default.
    """
    data = _read_json(DEFAULTS_FILE)
    f = Fields(DEFAULTS_FILE, CoverageError)
    table = f.obj(f.get(data, "model_types"), "field 'model_types'")
    for model_type, fields in table.items():
        for key, value in f.obj(fields, f"model_types.{model_type}").items():
            if type(value) not in (int, bool) or value < 0:
                f.fail(f"model_types.{model_type}.{key}", value, "an int >= 0 or true/false")
    return table


class _Fields:
    """A config dict whose missing or ill-typed fields raise one CoverageError naming file and field."""

    def __init__(self, data: dict, source: str):
        self.data, self.source = data, source

    def int(self, key: str, default=None) -> int:
        value = self.data.get(key)
        if value is None:  # null, as left out of a class without a default: derived (head_dim: hidden_size / heads)
            value = default
        if value is None:
            raise CoverageError(f"{self.source}: field {key!r} is missing (needed to derive the linears)")
        if type(value) is not int or not 1 <= value <= I32_MAX:
            raise CoverageError(
                f"{self.source}: field {key!r} must be a positive integer up to {I32_MAX}, not {show(value)}"
            )
        return value

    def count(self, key: str) -> int:
        """An optional count (0 when absent or null)."""
        value = self.data.get(key)
        if value is None:
            return 0
        if type(value) is not int or not 0 <= value <= I32_MAX:
            raise CoverageError(f"{self.source}: field {key!r} must be an integer 0..{I32_MAX}, not {show(value)}")
        return value

    def ints(self, key: str) -> list[int]:
        """An optional list of layer indexes ([] when absent or null)."""
        value = self.data.get(key)
        if value is None:
            return []
        if type(value) is not list or not all(type(v) is int and 0 <= v <= I32_MAX for v in value):
            raise CoverageError(f"{self.source}: field {key!r} must be a list of layer indexes, not {show(value)}")
        return value

    def flag(self, key: str) -> bool:
        value = self.data.get(key, False)
        if value is None:
            return False
        if type(value) is not bool:
            raise CoverageError(f"{self.source}: field {key!r} must be true or false, not {show(value)}")
        return value

    def get(self, key: str, default=None):
        return self.data.get(key, default)


def _shape(c: _Fields, name: str, tp: int, **facts) -> tuple[int, int]:
    """The per-rank [N, K] of linear ``name`` from the facts read so far (runtime/sharding.py's rule); a split
    vLLM refuses is one CoverageError."""
    try:
        return sharding.shape(name, sharding.Arch(**facts), tp)
    except sharding.SplitError as exc:
        raise CoverageError(f"{c.source}: {exc.line('--tp')}") from None


def _head(c: _Fields, tp: int, dtype: str = "bf16", plugin: str = CANDIDATE) -> Linear:
    # Tied or not, vLLM 0.32 builds a ParallelLMHead for these families (tie_weights shares the weight), except
    # Gemma-2, whose logits use embed_tokens (``plugin``: EMBEDDING_LOGITS).
    n, k = _shape(c, "lm_head", tp, vocab=c.int("vocab_size"), hidden=c.int("hidden_size"))
    return Linear("lm_head", "lm_head", n, k, 1, dtype, plugin=plugin)


def _attention(c: _Fields, tp: int, dtype: str, bias: bool, o_bias: bool = False) -> list[Linear]:
    hidden, heads = c.int("hidden_size"), c.int("num_attention_heads")
    kv_heads = c.int("num_key_value_heads", heads)
    head_dim = c.int("head_dim", hidden // heads)
    layers = c.int("num_hidden_layers")
    facts = {"hidden": hidden, "heads": heads, "kv_heads": kv_heads, "head_dim": head_dim}
    return [
        Linear("qkv_proj", "linear", *_shape(c, "qkv_proj", tp, **facts), layers, dtype, bias),
        Linear("o_proj", "linear", *_shape(c, "o_proj", tp, **facts), layers, dtype, o_bias),
    ]


def _mlp(c: _Fields, tp: int, calls: int, dtype: str, prefix: str = "", **width) -> list[Linear]:
    """The gate_up and down projections of an MLP whose width is ``width`` (the facts sharding.py's rule for
    ``prefix`` reads); a width vLLM cannot split is refused even where no layer calls the MLP."""
    hidden = c.int("hidden_size")
    gate_up = _shape(c, f"{prefix}gate_up_proj", tp, hidden=hidden, **width)
    if not calls:
        return []
    return [
        Linear(f"{prefix}gate_up_proj", "linear", *gate_up, calls, dtype),
        Linear(
            f"{prefix}down_proj", "linear", *_shape(c, f"{prefix}down_proj", tp, hidden=hidden, **width), calls, dtype
        ),
    ]


def _router(c: _Fields, tp: int, experts_field: str, calls: int, dtype: str = "bf16", bias: bool = False) -> Linear:
    n, k = _shape(c, "router", tp, experts=c.int(experts_field), hidden=c.int("hidden_size"))
    return Linear("router", "router", n, k, calls, dtype, bias, plugin=ROUTER)


def _checkpoint_dtype(c: _Fields, arch: str) -> str:
    """bf16 for an unquantized checkpoint, fp8 for vLLM's fp8 method; other quant methods are not derived."""
    quant = c.get("quantization_config")
    if not quant:
        return "bf16"
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    if method == "fp8":
        return "fp8"
    if method == "mxfp4" and arch in GPT_OSS:
        return "bf16"  # vLLM's mxfp4 method quantizes the experts only: every linear stays unquantized
    raise CoverageError(
        f"{c.source}: field 'quantization_config' has quant_method {method!r}: which of {arch}'s linears stay BF16 "
        f"is up to that method; {SUMMARY_HINT}"
    )


def _dense(c: _Fields, tp: int, arch: str) -> list[Linear]:
    dtype = _checkpoint_dtype(c, arch)
    # Qwen2 always has a qkv bias (and none on o_proj); Llama and Mistral put attention_bias on both.
    attention_bias = c.flag("attention_bias")
    bias = arch == "Qwen2ForCausalLM" or attention_bias
    o_bias = attention_bias and arch in ("LlamaForCausalLM", "MistralForCausalLM", "Phi3ForCausalLM")
    layers = c.int("num_hidden_layers")
    attention = _attention(c, tp, dtype, bias, o_bias)
    mlp = _mlp(c, tp, layers, dtype, intermediate=c.int("intermediate_size"))
    return [*attention, *mlp, _head(c, tp, plugin=EMBEDDING_LOGITS if arch == "Gemma2ForCausalLM" else CANDIDATE)]


def _gpt_oss(c: _Fields, tp: int, arch: str) -> list[Linear]:
    dtype = _checkpoint_dtype(c, arch)
    layers = c.int("num_hidden_layers")
    # Biased qkv_proj and o_proj (vLLM's OAIAttention); every layer is MoE, its router a biased GateLinear.
    attention = _attention(c, tp, dtype, True, True)
    return [*attention, _router(c, tp, "num_local_experts", layers, bias=True), _head(c, tp)]


def _glm4_moe(c: _Fields, tp: int, arch: str) -> list[Linear]:
    dtype = _checkpoint_dtype(c, arch)
    layers = c.int("num_hidden_layers")
    first_dense = min(c.count("first_k_dense_replace"), layers)
    moe_layers = layers - first_dense
    out = _attention(c, tp, dtype, c.flag("attention_bias"))
    out += _mlp(c, tp, first_dense, dtype, "dense_", dense_intermediate=c.int("intermediate_size"))
    shared = c.count("n_shared_experts")
    if shared and moe_layers:
        moe_inter = c.int("moe_intermediate_size")
        out += _mlp(c, tp, moe_layers, dtype, "shared_expert_", shared_experts=shared, moe_intermediate=moe_inter)
    if moe_layers:
        out.append(_router(c, tp, "n_routed_experts", moe_layers, "fp32"))  # vLLM's Glm4MoE gate keeps fp32 weights
    out.append(_head(c, tp))
    return out


def _moe(c: _Fields, tp: int, arch: str) -> list[Linear]:
    dtype = _checkpoint_dtype(c, arch)
    layers, step = c.int("num_hidden_layers"), c.int("decoder_sparse_step", 1)
    dense_only = set(c.ints("mlp_only_layers"))
    sparse = sum(1 for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    dense = [] if sparse == layers else _mlp(c, tp, layers - sparse, dtype, intermediate=c.int("intermediate_size"))
    c.int("moe_intermediate_size")  # the experts' (not linears), but a Qwen3-MoE config without it is broken
    router = _router(c, tp, "num_experts", sparse)
    return [*_attention(c, tp, dtype, c.flag("attention_bias")), *dense, router, _head(c, tp)]


def _mla(c: _Fields, tp: int, arch: str, target: str | None) -> list[Linear]:
    dtype = _checkpoint_dtype(c, arch)
    hidden, heads, layers = c.int("hidden_size"), c.int("num_attention_heads"), c.int("num_hidden_layers")
    nope, rope, v_dim = c.int("qk_nope_head_dim"), c.int("qk_rope_head_dim"), c.int("v_head_dim")
    kv_lora, q_lora = c.int("kv_lora_rank"), c.count("q_lora_rank")
    facts = {
        "hidden": hidden,
        "heads": heads,
        "kv_lora_rank": kv_lora,
        "qk_nope": nope,
        "qk_rope": rope,
        "v_head": v_dim,
    }
    out = []
    if q_lora:
        facts["q_lora_rank"] = c.int("q_lora_rank")
        fused = Linear("fused_qkv_a_proj", "linear", *_shape(c, "fused_qkv_a_proj", tp, **facts), layers, dtype)
        # On sm_90 and sm_100 vLLM runs its own dsv3_fused_a_gemm on this BF16 shape, inside the layer's forward.
        if (fused.n, fused.k, dtype) == (2112, 7168, "bf16") and target in ("sm_90a", "sm_100a"):
            fused = Linear(fused.name, fused.kind, fused.n, fused.k, fused.calls, dtype, plugin=FAST_PATH)
        out += [fused, Linear("q_b_proj", "linear", *_shape(c, "q_b_proj", tp, **facts), layers, dtype)]
    else:
        out += [
            Linear("q_proj", "linear", *_shape(c, "q_proj", tp, **facts), layers, dtype),
            Linear("kv_a_proj_with_mqa", "linear", *_shape(c, "kv_a_proj_with_mqa", tp, **facts), layers, dtype),
        ]
    # Decode absorbs kv_b_proj into MLA's bmm weights: it is built, but called only by prefill.
    out.append(Linear("kv_b_proj", "linear", *_shape(c, "kv_b_proj", tp, **facts), 0, dtype))
    out.append(Linear("o_proj", "linear", *_shape(c, "o_proj", tp, **facts), layers, dtype))
    first_dense = min(c.count("first_k_dense_replace"), layers)
    moe_layers = layers - first_dense
    out += _mlp(c, tp, first_dense, dtype, "dense_", dense_intermediate=c.int("intermediate_size"))
    shared = c.count("n_shared_experts")
    if shared and moe_layers:
        moe_inter = c.int("moe_intermediate_size")
        out += _mlp(c, tp, moe_layers, dtype, "shared_expert_", shared_experts=shared, moe_intermediate=moe_inter)
    if moe_layers:
        out.append(_router(c, tp, "n_routed_experts", moe_layers))
    out.append(_head(c, tp))
    return out


def derive(config: dict, tp: int, source: str, target: str | None = None) -> tuple[str, list[Linear]]:
    """(architecture, per-rank linears) of a Hugging Face config at tensor-parallel size ``tp``."""
    arches = config.get("architectures")
    if not isinstance(arches, list) or not arches or not all(isinstance(a, str) for a in arches):
        raise CoverageError(f"{source}: field 'architectures' is missing or not a list of names")
    arch = outer = arches[0]
    if arch in WRAPPERS:
        text = config.get("text_config")
        if text is None:
            text = {}
        if not isinstance(text, dict):
            raise CoverageError(f"{source}: field 'text_config' is not an object")
        model_type = text.get("model_type", WRAPPERS[arch])
        if model_type not in TEXT_ARCH:
            raise CoverageError(
                f"{source}: field 'text_config.model_type' is {model_type!r}, whose language model "
                f"coverage cannot derive; {SUMMARY_HINT}"
            )
        arch = TEXT_ARCH[model_type]
        # The wrapper's own quantization_config applies to its language model too.
        fields = {**hf_defaults().get(model_type, {}), **text}
        if "quantization_config" in config:
            fields.setdefault("quantization_config", config["quantization_config"])
    else:
        families = {**DENSE, **MOE, **MLA, **GPT_OSS, **GLM4_MOE}
        fields = {**hf_defaults().get(families.get(arch), {}), **config}
    c = _Fields(fields, source)
    if arch in DENSE:
        return outer, _dense(c, tp, arch)
    if arch in MOE:
        return outer, _moe(c, tp, arch)
    if arch in MLA:
        return outer, _mla(c, tp, arch, target)
    if arch in GPT_OSS:
        return outer, _gpt_oss(c, tp, arch)
    if arch in GLM4_MOE:
        return outer, _glm4_moe(c, tp, arch)
    raise CoverageError(
        f"{source}: field 'architectures' names {where(arch)}, which coverage cannot derive (dense Llama/Mistral/Qwen/Gemma/"
        f"Phi-3, MoE Qwen3-MoE/gpt-oss/GLM-4.5, MLA DeepSeek-V2/V3, wrappers {'/'.join(sorted(WRAPPERS))}); "
        f"{SUMMARY_HINT}"
    )


def catalogue_linears(slug: str, tp: int) -> tuple[str, list[Linear]]:
    """(display name, per-rank linears) of a catalogue model, from its ``linears`` (read by runtime/modelfile.py)."""
    path = modelfile.catalogue_path(slug)
    try:
        data = modelfile.load(path)
    except InputError as exc:
        raise CoverageError(str(exc)) from None
    out = modelfile.linears(data, tp)
    if not out:
        listed = ", ".join(str(t) for t in modelfile.tps(data))
        raise CoverageError(f"{where(path)}: no linears at --tp {tp} (the catalogue lists TP {listed})")
    return data["name"], out


def _read_json(path: Path) -> dict:
    """A JSON object through the one bounded reader (runtime/jsonfile.py); CoverageError (one line) otherwise."""
    try:
        data = read_json(path, "JSON file")
    except InputError as exc:
        raise CoverageError(str(exc)) from None
    if type(data) is not dict:
        raise CoverageError(f"{where(path)}: not a JSON object")
    return data


# ---- plans ---------------------------------------------------------------------------------------------------------


def wheel_archs() -> list[str]:
    """The archs this installation has a manifest for (a wheel has one)."""
    root = artifacts_root()
    return [arch for arch in sorted(CAPABILITY_FOR_ARCH) if os.path.lexists(root / arch / MANIFEST_NAME)]


def planned(arch: str, plan_file: Path | None = None) -> tuple[dict[tuple[int, int], dict[int, bool]], str]:
    """(n, k) -> {planned M: whether its config adds a bias} for ``arch``, and where the plans come from: the
    wheel's manifest, else the plan table."""
    directory = artifacts_root() / arch
    if plan_file is None and os.path.lexists(directory / MANIFEST_NAME):
        # Read as the loader reads it (the same checks, the same refusals): a manifest or a variant the loader
        # would refuse covers nothing.
        lib = open_dir(directory, arch)
        if lib.manifest is None:
            raise CoverageError(lib.error)
        source = f"{arch} manifest"
        usable = {vid: lib.check(vid) for vid in set(lib.manifest.plans.values())}
        refused = lib.problems()
        if refused:
            source += f" ({len(refused)} refused variant(s) left out: skinny-gemm verify says why)"
        entries = [
            {"n": n, "k": k, "m": m, "config": {"bias": usable[v].config.bias}}
            for (n, k, m), v in lib.manifest.plans.items()
            if usable[v] is not None
        ]
    else:
        path = plan_file or PLANS_DIR / f"{arch}.json"
        data = _read_json(path)
        f = Fields(path, CoverageError)
        entries = f.lst(f.get(data, "entries"), "field 'entries'")
        for i, e in enumerate(entries):
            f.obj(e, f"entries[{i}]")
            for key in ("n", "k", "m"):
                f.pos_int(f.get(e, key, f"entries[{i}] "), f"entries[{i}] field {key!r}")
            config = f.obj(e.get("config", {}), f"entries[{i}] field 'config'")
            f.boolean(config.get("bias", False), f"entries[{i}] config field 'bias'")
        source = f"plan table {where(path.name)}" + (" (not built into this installation)" if plan_file is None else "")
    table: dict[tuple[int, int], dict[int, bool]] = {}
    for e in entries:
        table.setdefault((e["n"], e["k"]), {})[e["m"]] = e.get("config", {}).get("bias", False)
    return table, source


# ---- the report ----------------------------------------------------------------------------------------------------


def report(model: str, tp: int, arch: str, plan_file: Path | None = None) -> dict:
    """The coverage of ``model`` (config.json, its folder, or a catalogue slug) at ``tp`` on ``arch``, as data."""
    path = Path(model)
    if path.is_dir():
        path = path / "config.json"
    if os.path.lexists(path):  # whatever it is: the reader refuses a FIFO, a device or a link in one line
        hf_arch, linears = derive(_read_json(path), tp, where(path), arch)
        name, source = hf_arch, where(path)
    elif model in modelfile.slugs():
        name, linears = catalogue_linears(model, tp)
        source = f"catalogue {model}"
    else:
        raise CoverageError(
            f"{where(model)}: neither a config.json (or its folder) nor a catalogue model ({', '.join(modelfile.slugs())})"
        )
    plans, plans_source = planned(arch, plan_file)
    total = sum(bytes_per_step(lin) for lin in linears)
    rows, covered = [], dict.fromkeys(MS, 0.0)
    for lin in linears:
        shape_plans = plans.get((lin.n, lin.k), {})
        ms = sorted(shape_plans)
        # A biased layer is routed, but runs a plan only where the plan adds a bias; elsewhere F.linear.
        routed = [m for m in MS if m in shape_plans and _routable(lin) and (shape_plans[m] or not lin.bias)]
        for m in routed:
            covered[m] += bytes_per_step(lin)
        rows.append(
            {
                **asdict(lin),
                "bytes_per_step": bytes_per_step(lin),
                "planned_ms": ms,
                "routed_ms": routed,
                "status": _status(lin, ms, routed),
            }
        )
    return {
        "model": name,
        "source": source,
        "tp": tp,
        "arch": arch,
        "plans": plans_source,
        "ms": list(MS),
        "projection_bytes_per_step": total,
        "covered_share": {str(m): (covered[m] / total if total else 0.0) for m in MS},
        "linears": rows,
        "note": "per rank; bytes = weight bytes x calls per decode step, every linear of any dtype; "
        "MoE experts (grouped GEMMs) are not linears and are left out",
    }


def _routable(lin: Linear) -> bool:
    return lin.dtype == "bf16" and lin.plugin == CANDIDATE and lin.kind != "router"


def _status(lin: Linear, ms: list[int], routed: list[int]) -> str:
    if lin.dtype != "bf16":
        return f"{lin.dtype}: not a candidate"
    if lin.plugin != CANDIDATE:
        return lin.plugin
    if not ms:
        return "no plan"
    if lin.bias and not routed:
        return "routed, bias: F.linear until a bias plan"
    return "routed"


def markdown(data: dict) -> str:
    """The report as a markdown table, one row per linear and a last row with the covered share per M."""
    head = (
        f"# {data['model']} at TP {data['tp']} on {data['arch']} ({data['plans']}): per-rank linears vLLM builds\n\n"
        f"| layer | N | K | calls/step | dtype | MB/step | plugin | "
        + " | ".join(f"M={m}" for m in data["ms"])
        + " |\n"
        "|---|---:|---:|---:|---|---:|---|" + "---|" * len(data["ms"]) + "\n"
    )
    lines = []
    for r in data["linears"]:
        marks = " | ".join("yes" if m in r["routed_ms"] else "-" for m in data["ms"])
        lines.append(
            f"| {r['name']} | {r['n']} | {r['k']} | {r['calls']} | {r['dtype']}{' +bias' if r['bias'] else ''} | "
            f"{r['bytes_per_step'] / 1e6:.1f} | {r['status']} | {marks} |"
        )
    shares = " | ".join(f"{100 * data['covered_share'][str(m)]:.1f}%" for m in data["ms"])
    lines.append(f"| **covered** | | | | | {data['projection_bytes_per_step'] / 1e6:.1f} | | {shares} |")
    return head + "\n".join(lines) + f"\n\n{data['note']}.\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "model",
        help="a Hugging Face config.json (or its folder), or a catalogue model: " + ", ".join(modelfile.slugs()),
    )
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    p.add_argument(
        "--arch",
        choices=sorted(CAPABILITY_FOR_ARCH),
        help="target (default: the arch this wheel was built for; in a source tree without a build, sm_90a)",
    )
    p.add_argument("--plan", type=Path, help="a plan table file to read instead of the wheel's plans")
    p.add_argument("--json", action="store_true", help="print JSON instead of a markdown table")


def main(args) -> int:
    """The ``coverage`` verb: 0 on success, 2 with one line on bad input."""
    archs = wheel_archs()
    arch = args.arch or (archs[0] if len(archs) == 1 else "sm_90a")
    try:
        if args.tp <= 0:
            raise CoverageError(f"--tp {args.tp}: must be a positive integer")
        data = report(args.model, args.tp, arch, args.plan)
    except CoverageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(
        json.dumps(data, indent=1, sort_keys=True) if args.json else markdown(data), end="" if not args.json else "\n"
    )
    return 0
