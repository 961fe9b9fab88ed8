"""vLLM's tensor-parallel sharding of a decoder's linears: the per-rank weight [N, K] of each, from the model's facts.

One rule per linear name, as vLLM 0.32 builds the layer (weight [out_features, in_features] on one rank;
column-parallel layers split N over the ranks, row-parallel ones split K):

  qkv_proj      N = (heads / tp + 2 x kv_heads / tp) x head_dim, K = hidden; KV heads split while tp <= kv_heads,
                past that each rank holds one replica (tp must be a multiple of kv_heads)
  o_proj        N = hidden, K = heads / tp x head_dim (MLA: x v_head)
  gate_up_proj  N = 2 x inter / tp, K = hidden; down_proj N = hidden, K = inter / tp; inter is intermediate,
                dense_intermediate for dense_*, shared_experts x moe_intermediate for shared_expert_*
  lm_head       N = pad64(vocab) / tp, K = hidden (the vocabulary is padded to 64 before the split)
  router        N = experts, K = hidden (replicated)
  MLA           fused_qkv_a_proj N = q_lora + kv_lora + qk_rope, K = hidden (replicated); q_b_proj
                N = heads / tp x (qk_nope + qk_rope), K = q_lora; without q_lora, q_proj (that N, K = hidden) and
                kv_a_proj_with_mqa N = kv_lora + qk_rope, K = hidden; kv_b_proj N = heads / tp x (qk_nope + v_head),
                K = kv_lora

A count that does not split over tp (vLLM refuses such a model) raises SplitError. The catalogue's check
(aot/models.py: a model file's shapes against its `arch`) and coverage's derivation from a config.json
(runtime/coverage.py) both take their shapes from ``shape``.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

# vLLM pads the vocabulary to a multiple of 64 before splitting the LM head over the ranks.
VOCAB_PAD = 64
# A decoder's MLPs by the prefix of their linears' names: every layer's, the dense layers' of a MoE, the shared experts'.
MLP_PREFIXES = ("", "dense_", "shared_expert_")


@dataclass(frozen=True)
class Arch:
    """The facts a model's linear shapes derive from, named as a model file's `arch` names them (None: unknown)."""

    hidden: int | None = None
    heads: int | None = None
    kv_heads: int | None = None
    head_dim: int | None = None
    intermediate: int | None = None
    vocab: int | None = None
    experts: int | None = None
    moe_intermediate: int | None = None
    shared_experts: int | None = None
    dense_intermediate: int | None = None
    q_lora_rank: int | None = None
    kv_lora_rank: int | None = None
    qk_nope: int | None = None
    qk_rope: int | None = None
    v_head: int | None = None


FACTS = tuple(f.name for f in fields(Arch))


class SplitError(ValueError):
    """A count that tp ranks cannot share the way vLLM shards it."""

    def __init__(self, what: str, total: int, tp: int, replicate: bool = False):
        self.what, self.total, self.tp, self.replicate = what, total, tp, replicate
        super().__init__(self.line("TP"))

    def line(self, tp_name: str) -> str:
        """The refusal with the TP size named as the caller's user knows it (``--tp`` on the command line)."""
        how = "replicate evenly" if self.replicate else "split"
        return f"{self.what} {self.total} does not {how} over {tp_name} {self.tp}"


def split(total: int, tp: int, what: str) -> int:
    """One rank's share of ``total`` (heads, a width, the padded vocabulary); SplitError unless tp divides it."""
    if total % tp:
        raise SplitError(what, total, tp)
    return total // tp


def _kv_heads_per_rank(kv_heads: int, tp: int) -> int:
    if kv_heads >= tp:
        return split(kv_heads, tp, "num_key_value_heads")
    if tp % kv_heads:
        raise SplitError("num_key_value_heads", kv_heads, tp, replicate=True)
    return 1


def _known(*facts) -> bool:
    return all(f is not None for f in facts)


def _mlp_width(prefix: str, a: Arch) -> int | None:
    if prefix == "dense_":
        return a.dense_intermediate
    if prefix == "shared_expert_":
        return a.shared_experts * a.moe_intermediate if _known(a.shared_experts, a.moe_intermediate) else None
    return a.intermediate


def shape(name: str, a: Arch, tp: int) -> tuple[int, int] | None:
    """The per-rank [N, K] of linear ``name`` at ``tp``; None where no rule applies or a fact it needs is unknown.

    Raises SplitError where vLLM would refuse the split.
    """
    mla = a.kv_lora_rank is not None
    if name == "lm_head":
        if _known(a.vocab, a.hidden):
            return split(-(-a.vocab // VOCAB_PAD) * VOCAB_PAD, tp, "padded vocab"), a.hidden
        return None
    if name == "router":
        return (a.experts, a.hidden) if _known(a.experts, a.hidden) else None
    if name == "qkv_proj" and not mla:
        if _known(a.heads, a.kv_heads, a.head_dim, a.hidden):
            heads = split(a.heads, tp, "num_attention_heads")
            return (heads + 2 * _kv_heads_per_rank(a.kv_heads, tp)) * a.head_dim, a.hidden
        return None
    if name == "o_proj":
        per_head = a.v_head if mla else a.head_dim
        if _known(a.heads, per_head, a.hidden):
            return a.hidden, split(a.heads, tp, "num_attention_heads") * per_head
        return None
    if mla:
        if name == "fused_qkv_a_proj" and _known(a.q_lora_rank, a.qk_rope, a.hidden):
            return a.q_lora_rank + a.kv_lora_rank + a.qk_rope, a.hidden
        if name in ("q_b_proj", "q_proj") and _known(a.heads, a.qk_nope, a.qk_rope):
            k = a.q_lora_rank if name == "q_b_proj" else a.hidden
            return (split(a.heads, tp, "num_attention_heads") * (a.qk_nope + a.qk_rope), k) if k else None
        if name == "kv_a_proj_with_mqa" and _known(a.qk_rope, a.hidden):
            return a.kv_lora_rank + a.qk_rope, a.hidden
        if name == "kv_b_proj" and _known(a.heads, a.qk_nope, a.v_head):
            return split(a.heads, tp, "num_attention_heads") * (a.qk_nope + a.v_head), a.kv_lora_rank
    for prefix in MLP_PREFIXES:
        if name in (f"{prefix}gate_up_proj", f"{prefix}down_proj"):
            width = _mlp_width(prefix, a)
            if width is None or a.hidden is None:
                return None
            local = split(width, tp, "intermediate size")
            return (2 * local, a.hidden) if name.endswith("gate_up_proj") else (a.hidden, local)
    return None
