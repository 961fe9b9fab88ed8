"""Public Hugging Face config.json files, reduced to the fields that decide vLLM's linear shapes.

Keyed by the model's Hugging Face repository; values as published there, typed in without network access (a value
mistyped here would still hold coverage to vLLM's layers for that config, not to the model). The fields a config
leaves out are left out here too: vLLM then takes the config class's default, as the coverage report must. Quantized checkpoints
appear without their ``quantization_config`` where vLLM's CPU build cannot construct that method; the linears are
the same shapes.
"""

_LLAMA = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu", "rms_norm_eps": 1e-5}
_QWEN2 = {"architectures": ["Qwen2ForCausalLM"], "model_type": "qwen2", "hidden_act": "silu", "rms_norm_eps": 1e-6}
_QWEN3 = {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "hidden_act": "silu", "rms_norm_eps": 1e-6,
          "head_dim": 128, "attention_bias": False}
_GEMMA2 = {"architectures": ["Gemma2ForCausalLM"], "model_type": "gemma2", "hidden_activation": "gelu_pytorch_tanh",
           "vocab_size": 256000, "query_pre_attn_scalar": 256, "sliding_window": 4096}
_PHI3 = {"architectures": ["Phi3ForCausalLM"], "model_type": "phi3", "hidden_act": "silu", "rms_norm_eps": 1e-5}
_MISTRAL = {"architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_act": "silu",
            "rms_norm_eps": 1e-5}


def _dense(base, hidden, inter, layers, heads, kv, vocab, tie=False, **extra):
    return {**base, "hidden_size": hidden, "intermediate_size": inter, "num_hidden_layers": layers,
            "num_attention_heads": heads, "num_key_value_heads": kv, "vocab_size": vocab,
            "tie_word_embeddings": tie, **extra}


CONFIGS = {
    "meta-llama/Llama-2-7b-hf": _dense(_LLAMA, 4096, 11008, 32, 32, 32, 32000),
    "meta-llama/Llama-3.1-8B-Instruct": _dense(_LLAMA, 4096, 14336, 32, 32, 8, 128256, rope_theta=500000.0),
    "meta-llama/Llama-3.1-70B-Instruct": _dense(_LLAMA, 8192, 28672, 80, 64, 8, 128256, rope_theta=500000.0),
    "meta-llama/Llama-3.2-1B-Instruct": _dense(_LLAMA, 2048, 8192, 16, 32, 8, 128256, True, head_dim=64),
    "meta-llama/Llama-3.2-3B-Instruct": _dense(_LLAMA, 3072, 8192, 28, 24, 8, 128256, True, head_dim=128),
    "mistralai/Mistral-7B-v0.1": _dense(_MISTRAL, 4096, 14336, 32, 32, 8, 32000),
    "mistralai/Mistral-Nemo-Instruct-2407": _dense(_MISTRAL, 5120, 14336, 40, 32, 8, 131072, head_dim=128),
    "mistralai/Mistral-Small-24B-Instruct-2501": _dense(_MISTRAL, 5120, 32768, 40, 32, 8, 131072, head_dim=128),
    "Qwen/Qwen2.5-0.5B-Instruct": _dense(_QWEN2, 896, 4864, 24, 14, 2, 151936, True),
    "Qwen/Qwen2.5-1.5B-Instruct": _dense(_QWEN2, 1536, 8960, 28, 12, 2, 151936, True),
    "Qwen/Qwen2.5-3B-Instruct": _dense(_QWEN2, 2048, 11008, 36, 16, 2, 151936, True),
    "Qwen/Qwen2.5-7B-Instruct": _dense(_QWEN2, 3584, 18944, 28, 28, 4, 152064),
    "Qwen/Qwen2.5-14B-Instruct": _dense(_QWEN2, 5120, 13824, 48, 40, 8, 152064),
    "Qwen/Qwen2.5-32B-Instruct": _dense(_QWEN2, 5120, 27648, 64, 40, 8, 152064),
    "Qwen/Qwen2.5-72B-Instruct": _dense(_QWEN2, 8192, 29568, 80, 64, 8, 152064),
    "Qwen/Qwen3-0.6B": _dense(_QWEN3, 1024, 3072, 28, 16, 8, 151936, True),
    "Qwen/Qwen3-4B": _dense(_QWEN3, 2560, 9728, 36, 32, 8, 151936, True),
    "Qwen/Qwen3-8B": _dense(_QWEN3, 4096, 12288, 36, 32, 8, 151936),
    "Qwen/Qwen3-14B": _dense(_QWEN3, 5120, 17408, 40, 40, 8, 151936),
    "Qwen/Qwen3-32B": _dense(_QWEN3, 5120, 25600, 64, 64, 8, 151936),
    "Qwen/Qwen3-30B-A3B": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 2048,
        "intermediate_size": 6144, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 151936,
    },
    "Qwen/Qwen3-235B-A22B": {
        "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "attention_bias": False,
        "decoder_sparse_step": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 12288, "mlp_only_layers": [], "moe_intermediate_size": 1536, "norm_topk_prob": True,
        "num_attention_heads": 64, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 94,
        "num_key_value_heads": 4, "tie_word_embeddings": False, "vocab_size": 151936,
    },
    "google/gemma-7b": {"architectures": ["GemmaForCausalLM"], "model_type": "gemma", "hidden_size": 3072,
                        "intermediate_size": 24576, "num_hidden_layers": 28, "num_attention_heads": 16,
                        "num_key_value_heads": 16, "head_dim": 256, "vocab_size": 256000,
                        "hidden_activation": "gelu_pytorch_tanh"},
    "google/gemma-2-2b-it": _dense(_GEMMA2, 2304, 9216, 26, 8, 4, 256000, True, head_dim=256),
    "google/gemma-2-9b-it": _dense(_GEMMA2, 3584, 14336, 42, 16, 8, 256000, True, head_dim=256),
    "google/gemma-2-27b-it": _dense(_GEMMA2, 4608, 36864, 46, 32, 16, 256000, True, head_dim=128,
                                    query_pre_attn_scalar=144),
    "google/gemma-3-1b-it": {"architectures": ["Gemma3ForCausalLM"], "model_type": "gemma3_text",
                             "hidden_size": 1152, "intermediate_size": 6912, "num_hidden_layers": 26,
                             "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256,
                             "vocab_size": 262144, "sliding_window": 512, "query_pre_attn_scalar": 256},
    # The multimodal checkpoints: text_config as published, without the fields vLLM then takes from
    # Gemma3TextConfig's defaults (the 27B's vocab_size; the 4B's head counts and head_dim too).
    "google/gemma-3-4b-it": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"hidden_size": 2560, "intermediate_size": 10240, "model_type": "gemma3_text",
                        "num_hidden_layers": 34, "sliding_window": 1024, "rope_scaling": {"factor": 8.0,
                                                                                          "rope_type": "linear"}},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False},
        "mm_tokens_per_image": 256, "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
    },
    "google/gemma-3-27b-it": {
        "architectures": ["Gemma3ForConditionalGeneration"], "model_type": "gemma3",
        "text_config": {"head_dim": 128, "hidden_size": 5376, "intermediate_size": 21504, "model_type": "gemma3_text",
                        "num_attention_heads": 32, "num_hidden_layers": 62, "num_key_value_heads": 16,
                        "query_pre_attn_scalar": 168, "sliding_window": 1024,
                        "rope_scaling": {"factor": 8.0, "rope_type": "linear"}},
        "vision_config": {"hidden_size": 1152, "image_size": 896, "intermediate_size": 4304,
                          "model_type": "siglip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 27,
                          "patch_size": 14, "vision_use_head": False},
        "mm_tokens_per_image": 256, "boi_token_index": 255999, "eoi_token_index": 256000, "image_token_index": 262144,
    },
    "llava-hf/llava-1.5-7b-hf": {
        "architectures": ["LlavaForConditionalGeneration"], "model_type": "llava", "image_token_index": 32000,
        "projector_hidden_act": "gelu", "vision_feature_layer": -2, "vision_feature_select_strategy": "default",
        "text_config": {"architectures": ["LlamaForCausalLM"], "max_position_embeddings": 4096,
                        "model_type": "llama", "rms_norm_eps": 1e-05, "vocab_size": 32064},
        "vision_config": {"hidden_size": 1024, "image_size": 336, "intermediate_size": 4096,
                          "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                          "patch_size": 14, "projection_dim": 768, "vocab_size": 32000},
    },
    "microsoft/Phi-3-mini-4k-instruct": _dense(_PHI3, 3072, 8192, 32, 32, 32, 32064),
    "microsoft/Phi-3-medium-4k-instruct": _dense(_PHI3, 5120, 17920, 40, 40, 10, 32064),
    "microsoft/phi-4": _dense(_PHI3, 5120, 17920, 40, 40, 10, 100352),
    "microsoft/Phi-4-mini-instruct": _dense(_PHI3, 3072, 8192, 32, 24, 8, 200064, True,
                                            partial_rotary_factor=0.75),
    # The published gpt-oss configs carry quantization_config {"quant_method": "mxfp4"} (experts only).
    "openai/gpt-oss-20b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "head_dim": 64, "hidden_size": 2880,
        "intermediate_size": 2880, "num_attention_heads": 64, "num_hidden_layers": 24, "num_key_value_heads": 8,
        "num_local_experts": 32, "experts_per_token": 4, "num_experts_per_tok": 4, "vocab_size": 201088,
        "sliding_window": 128, "rope_theta": 150000,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "tie_word_embeddings": False, "hidden_act": "silu", "swiglu_limit": 7.0,
    },
    "openai/gpt-oss-120b": {
        "architectures": ["GptOssForCausalLM"], "model_type": "gpt_oss", "head_dim": 64, "hidden_size": 2880,
        "intermediate_size": 2880, "num_attention_heads": 64, "num_hidden_layers": 36, "num_key_value_heads": 8,
        "num_local_experts": 128, "experts_per_token": 4, "num_experts_per_tok": 4, "vocab_size": 201088,
        "sliding_window": 128, "rope_theta": 150000,
        "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                         "original_max_position_embeddings": 4096, "rope_type": "yarn", "truncate": False},
        "tie_word_embeddings": False, "hidden_act": "silu", "swiglu_limit": 7.0,
    },
    "zai-org/GLM-4.5-Air": {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
        "first_k_dense_replace": 1, "head_dim": 128, "hidden_act": "silu", "hidden_size": 4096,
        "intermediate_size": 10944, "moe_intermediate_size": 1408, "n_group": 1, "n_routed_experts": 128,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
        "num_hidden_layers": 46, "num_key_value_heads": 8, "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5, "routed_scaling_factor": 1.0, "tie_word_embeddings": False, "topk_group": 1,
        "use_qk_norm": False, "vocab_size": 151552,
    },
    "zai-org/GLM-4.5": {
        "architectures": ["Glm4MoeForCausalLM"], "model_type": "glm4_moe", "attention_bias": True,
        "first_k_dense_replace": 3, "head_dim": 128, "hidden_act": "silu", "hidden_size": 5120,
        "intermediate_size": 12288, "moe_intermediate_size": 1536, "n_group": 1, "n_routed_experts": 160,
        "n_shared_experts": 1, "norm_topk_prob": True, "num_attention_heads": 96, "num_experts_per_tok": 8,
        "num_hidden_layers": 92, "num_key_value_heads": 8, "num_nextn_predict_layers": 1,
        "partial_rotary_factor": 0.5, "routed_scaling_factor": 2.5, "tie_word_embeddings": False, "topk_group": 1,
        "use_qk_norm": True, "vocab_size": 151552,
    },
    "deepseek-ai/DeepSeek-V2-Lite": {
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2", "first_k_dense_replace": 1,
        "hidden_act": "silu", "hidden_size": 2048, "intermediate_size": 10944, "kv_lora_rank": 512,
        "moe_intermediate_size": 1408, "moe_layer_freq": 1, "n_group": 1, "n_routed_experts": 64,
        "n_shared_experts": 2, "num_attention_heads": 16, "num_experts_per_tok": 6, "num_hidden_layers": 27,
        "num_key_value_heads": 16, "q_lora_rank": None, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64,
        "topk_group": 1, "topk_method": "greedy", "v_head_dim": 128, "vocab_size": 102400,
        "tie_word_embeddings": False,
    },
}
