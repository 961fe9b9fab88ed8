"""vLLM's sharding rules (runtime/sharding.py) by hand; test_coverage.py holds them to vLLM's own layers."""

import pytest

from skinny_gemm.runtime.sharding import Arch, SplitError, shape

LLAMA_70B = Arch(hidden=8192, heads=64, kv_heads=8, head_dim=128, intermediate=28672, vocab=128256)


def test_column_parallel_splits_n_and_row_parallel_splits_k():
    assert shape("qkv_proj", LLAMA_70B, 8) == ((8 + 2 * 1) * 128, 8192)
    assert shape("o_proj", LLAMA_70B, 8) == (8192, 8 * 128)
    assert shape("gate_up_proj", LLAMA_70B, 4) == (2 * 7168, 8192)
    assert shape("down_proj", LLAMA_70B, 4) == (8192, 7168)
    assert shape("lm_head", LLAMA_70B, 2) == (64128, 8192)


def test_kv_heads_are_replicated_past_their_count():
    four_kv = Arch(hidden=2048, heads=32, kv_heads=4, head_dim=128)
    assert shape("qkv_proj", four_kv, 4) == ((8 + 2) * 128, 2048)
    assert shape("qkv_proj", four_kv, 8) == ((4 + 2) * 128, 2048), "one KV head per rank, replicated"


def test_the_vocabulary_is_padded_to_64_before_the_split():
    assert shape("lm_head", Arch(hidden=64, vocab=32001), 1) == (32064, 64)
    assert shape("lm_head", Arch(hidden=64, vocab=32001), 4) == (8016, 64)


def test_mla_and_moe_rules():
    dsv3 = Arch(
        hidden=7168,
        heads=128,
        experts=256,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_nope=128,
        qk_rope=64,
        v_head=128,
        dense_intermediate=18432,
        shared_experts=1,
        moe_intermediate=2048,
    )
    assert shape("fused_qkv_a_proj", dsv3, 8) == (2112, 7168), "replicated"
    assert shape("q_b_proj", dsv3, 8) == (16 * 192, 1536)
    assert shape("kv_b_proj", dsv3, 8) == (16 * 256, 512)
    assert shape("o_proj", dsv3, 8) == (7168, 16 * 128)
    assert shape("dense_down_proj", dsv3, 8) == (7168, 2304)
    assert shape("shared_expert_gate_up_proj", dsv3, 8) == (512, 7168)
    assert shape("router", dsv3, 8) == (256, 7168)
    assert shape("qkv_proj", dsv3, 8) is None, "MLA has no merged qkv"
    no_q_lora = Arch(hidden=2048, heads=16, kv_lora_rank=512, qk_nope=128, qk_rope=64, v_head=128)
    assert shape("q_proj", no_q_lora, 2) == (8 * 192, 2048)
    assert shape("kv_a_proj_with_mqa", no_q_lora, 2) == (576, 2048)


def test_unknown_names_and_missing_facts_have_no_rule():
    assert shape("kda_in_proj", LLAMA_70B, 1) is None
    assert shape("router", LLAMA_70B, 1) is None, "no experts"
    assert shape("qkv_proj", Arch(hidden=4096, heads=32, kv_heads=8), 1) is None, "no head_dim"


@pytest.mark.parametrize(
    "name, arch, tp, line",
    [
        (
            "qkv_proj",
            Arch(hidden=5120, heads=40, kv_heads=10, head_dim=128),
            4,
            "num_key_value_heads 10 does not split",
        ),
        (
            "qkv_proj",
            Arch(hidden=3072, heads=24, kv_heads=4, head_dim=128),
            6,
            "4 does not replicate evenly over --tp 6",
        ),
        ("o_proj", Arch(hidden=4096, heads=32, head_dim=128), 3, "num_attention_heads 32 does not split over --tp 3"),
        ("down_proj", Arch(hidden=4096, intermediate=11000), 16, "intermediate size 11000 does not split"),
        ("lm_head", Arch(hidden=64, vocab=100), 3, "padded vocab 128 does not split over --tp 3"),
    ],
)
def test_a_split_vllm_refuses_is_refused(name, arch, tp, line):
    with pytest.raises(SplitError) as exc:
        shape(name, arch, tp)
    assert line in exc.value.line("--tp") and str(exc.value) == exc.value.line("TP")
