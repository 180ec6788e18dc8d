"""Shipped model presets: the architecture keys of each model's public ``config.json``
(Hugging Face Hub), with the repository each comes from in ``source``.

Only keys :class:`~schedsim.workload.model.ModelConfig` reads are copied; the rest of each
file (tokenizer ids, RoPE settings, norms' epsilon, ...) changes neither FLOPs nor bytes.
"""
from __future__ import annotations

_LLAMA = {"hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": 128256,
          "num_key_value_heads": 8}

#: preset name -> config.json keys (lower-case names; ``load_model`` is case-insensitive)
MODELS: dict[str, dict] = {
    "llama3.1-8b": {
        **_LLAMA, "name": "llama3.1-8b",
        "source": "huggingface.co/meta-llama/Llama-3.1-8B/blob/main/config.json",
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "intermediate_size": 14336},
    "llama3.1-70b": {
        **_LLAMA, "name": "llama3.1-70b",
        "source": "huggingface.co/meta-llama/Llama-3.1-70B/blob/main/config.json",
        "hidden_size": 8192, "num_hidden_layers": 80, "num_attention_heads": 64,
        "intermediate_size": 28672},
    "llama3.1-405b": {
        **_LLAMA, "name": "llama3.1-405b",
        "source": "huggingface.co/meta-llama/Llama-3.1-405B/blob/main/config.json",
        "hidden_size": 16384, "num_hidden_layers": 126, "num_attention_heads": 128,
        "intermediate_size": 53248},
    "deepseek-v3": {
        "name": "deepseek-v3",
        "source": "huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json",
        "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": 129280,
        "hidden_size": 7168, "num_hidden_layers": 61, "num_attention_heads": 128,
        "num_key_value_heads": 128, "intermediate_size": 18432,
        "moe_intermediate_size": 2048, "n_routed_experts": 256, "n_shared_experts": 1,
        "num_experts_per_tok": 8, "first_k_dense_replace": 3, "moe_layer_freq": 1,
        "q_lora_rank": 1536, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
        "qk_rope_head_dim": 64, "v_head_dim": 128},
    "qwen3-30b-a3b": {
        "name": "qwen3-30b-a3b",
        "source": "huggingface.co/Qwen/Qwen3-30B-A3B/blob/main/config.json",
        "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": 151936,
        "hidden_size": 2048, "num_hidden_layers": 48, "num_attention_heads": 32,
        "num_key_value_heads": 4, "head_dim": 128, "intermediate_size": 6144,
        "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
        "decoder_sparse_step": 1, "mlp_only_layers": []},
    "mixtral-8x7b": {
        "name": "mixtral-8x7b",
        "source": "huggingface.co/mistralai/Mixtral-8x7B-v0.1/blob/main/config.json",
        "hidden_act": "silu", "tie_word_embeddings": False, "vocab_size": 32000,
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32,
        "num_key_value_heads": 8, "intermediate_size": 14336, "num_local_experts": 8,
        "num_experts_per_tok": 2},
}
