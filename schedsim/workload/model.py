"""Transformer model configurations (Hugging Face ``config.json``) and shipped presets.

:class:`ModelConfig` holds the keys of a Hugging Face decoder config that decide the work
and memory of a training step (``hidden_size``, ``num_hidden_layers``,
``num_attention_heads``, ``num_key_value_heads``, ``head_dim``, ``intermediate_size``,
``vocab_size``, ``tie_word_embeddings``, ``hidden_act``; MoE: ``num_local_experts`` /
``n_routed_experts`` / ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
``n_shared_experts``, ``shared_expert_intermediate_size``, ``first_k_dense_replace``,
``moe_layer_freq``, ``decoder_sparse_step``, ``mlp_only_layers``; multi-latent attention
(DeepSeek): ``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``,
``v_head_dim``). :data:`IGNORED_KEYS` lists the bookkeeping keys a config may carry that
change nothing here (they are accepted and dropped); any other key is refused with its
name and the closest key we use, so a typo (``num_hidden_layer``) never passes silently.

A gated MLP (SwiGLU: ``gate``, ``up`` and ``down`` projections) is what every Hugging Face
family with ``hidden_act = "silu"`` (Llama, Mistral/Mixtral, Qwen, DeepSeek) builds; other
activations (``gelu``, ``relu``) are the two-GEMM MLP of GPT.

Plain Python + pydantic (no torch).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from schedsim.errors import ScenarioError

#: config.json keys accepted and ignored: bookkeeping, tokenizer ids, positional
#: encoding and numerics details that change neither FLOPs nor bytes of a step
IGNORED_KEYS = frozenset({
    "_name_or_path", "architectures", "model_type", "torch_dtype", "dtype",
    "transformers_version", "auto_map", "quantization_config", "use_cache",
    "bos_token_id", "eos_token_id", "pad_token_id", "initializer_range", "pretraining_tp",
    "rope_theta", "rope_scaling", "rope_parameters", "rope_interleave",
    "max_position_embeddings", "rms_norm_eps", "layer_norm_eps", "attention_bias",
    "attention_dropout", "mlp_bias", "sliding_window", "use_sliding_window",
    "max_window_layers", "norm_topk_prob", "routed_scaling_factor", "scoring_func",
    "topk_method", "n_group", "topk_group", "aux_loss_alpha", "seq_aux", "ep_size",
    "output_router_logits", "router_aux_loss_coef", "router_jitter_noise",
    "num_nextn_predict_layers", "qkv_bias", "use_qk_norm", "qk_layernorm",
    "hidden_dropout", "resid_pdrop", "embd_pdrop", "attn_pdrop", "bias",
})

#: the MoE expert-count spellings of the families (Mixtral, DeepSeek, Qwen)
_EXPERT_KEYS = ("num_local_experts", "n_routed_experts", "num_experts")
#: every key the model reads (for the typo hint)
USED_KEYS = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads",
    "head_dim", "intermediate_size", "vocab_size", "tie_word_embeddings", "hidden_act",
    *_EXPERT_KEYS, "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
    "shared_expert_intermediate_size", "first_k_dense_replace", "moe_layer_freq",
    "decoder_sparse_step", "mlp_only_layers", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "name", "source",
)
_GATED = ("silu", "swish", "swiglu")
#: the bounds of a model config's figures (a validation, not a work limit: above these a
#: config is a typo; the largest real ones are far below: hidden 18,432 and 126 layers,
#: 256 experts, a 256 K vocabulary): widths (hidden, ranks; FFN widths 4x), layers,
#: heads and head dims, experts, vocabulary
_WIDTH, _LAYERS, _HEADS, _EXPERTS, _VOCAB = 2 ** 20, 2 ** 14, 2 ** 14, 2 ** 16, 2 ** 24


class ModelConfig(BaseModel):
    """A decoder-only transformer, in Hugging Face ``config.json`` terms (module
    docstring). Raises ``ValueError`` (a :class:`ScenarioError` through
    :func:`model_from_dict`) for an unknown key or inconsistent sizes: as in Hugging
    Face's attention modules, the head dimension is ``head_dim`` when given, else
    ``hidden_size / num_attention_heads``, which must then be whole (multi-latent
    attention with ``qk_nope_head_dim`` and ``v_head_dim`` has its own); the query heads
    are grouped over the key/value heads (``repeat_kv``), so ``num_key_value_heads``
    must divide ``num_attention_heads``."""

    model_config = ConfigDict(extra="forbid", frozen=True, defer_build=True)

    name: str = "custom"
    source: str = ""
    hidden_size: int = Field(ge=1, le=_WIDTH)
    num_hidden_layers: int = Field(ge=1, le=_LAYERS)
    num_attention_heads: int = Field(ge=1, le=_HEADS)
    num_key_value_heads: int | None = Field(default=None, ge=1, le=_HEADS)
    head_dim: int | None = Field(default=None, ge=1, le=_HEADS)
    intermediate_size: int = Field(ge=1, le=_WIDTH * 4)
    vocab_size: int = Field(ge=1, le=_VOCAB)
    tie_word_embeddings: bool = False
    hidden_act: str = "silu"
    num_local_experts: int | None = Field(default=None, ge=1, le=_EXPERTS)
    n_routed_experts: int | None = Field(default=None, ge=1, le=_EXPERTS)
    num_experts: int | None = Field(default=None, ge=1, le=_EXPERTS)
    num_experts_per_tok: int | None = Field(default=None, ge=1, le=_EXPERTS)
    moe_intermediate_size: int | None = Field(default=None, ge=1, le=_WIDTH * 4)
    n_shared_experts: int | None = Field(default=None, ge=0, le=_EXPERTS)
    shared_expert_intermediate_size: int | None = Field(default=None, ge=0, le=_WIDTH * 4)
    first_k_dense_replace: int = Field(default=0, ge=0, le=_LAYERS)
    moe_layer_freq: int = Field(default=1, ge=1, le=_LAYERS)
    decoder_sparse_step: int = Field(default=1, ge=1, le=_LAYERS)
    mlp_only_layers: tuple[int, ...] = ()
    q_lora_rank: int | None = Field(default=None, ge=1, le=_WIDTH)
    kv_lora_rank: int | None = Field(default=None, ge=1, le=_WIDTH)
    qk_nope_head_dim: int | None = Field(default=None, ge=1, le=_HEADS)
    qk_rope_head_dim: int | None = Field(default=None, ge=0, le=_HEADS)
    v_head_dim: int | None = Field(default=None, ge=1, le=_HEADS)

    @model_validator(mode="after")
    def _check(self) -> "ModelConfig":
        given = [k for k in _EXPERT_KEYS if getattr(self, k) is not None]
        if len(given) > 1:
            raise ValueError(f"{' and '.join(given)} both give the expert count: keep one")
        if self.experts and self.num_experts_per_tok is None:
            raise ValueError("an MoE config needs num_experts_per_tok")
        if self.experts and self.topk > self.experts:
            raise ValueError(f"num_experts_per_tok = {self.topk} exceeds the "
                             f"{self.experts} experts")
        own_dims = self.head_dim is not None or (
            self.mla and self.qk_nope_head_dim is not None and self.v_head_dim is not None)
        if self.hidden_size % self.num_attention_heads and not own_dims:
            raise ValueError(f"hidden_size = {self.hidden_size} is not a multiple of "
                             f"num_attention_heads = {self.num_attention_heads} (a head "
                             f"dimension of {self.hidden_size / self.num_attention_heads:.4g}): "
                             f"give head_dim, or heads that divide hidden_size")
        if self.num_attention_heads % self.kv_heads:
            raise ValueError(f"num_attention_heads = {self.num_attention_heads} is not a "
                             f"multiple of num_key_value_heads = {self.kv_heads}: give "
                             f"key/value heads that divide the attention heads")
        if self.first_k_dense_replace > self.num_hidden_layers:
            raise ValueError(f"first_k_dense_replace = {self.first_k_dense_replace} exceeds "
                             f"num_hidden_layers = {self.num_hidden_layers}")
        if self.mla and self.kv_lora_rank is None:
            raise ValueError("multi-latent attention (q_lora_rank, qk_rope_head_dim) needs "
                             "kv_lora_rank")
        return self

    # -- derived sizes -----------------------------------------------------------------
    @property
    def kv_heads(self) -> int:
        """Key/value heads (GQA groups): ``num_key_value_heads``, else the heads (MHA)."""
        return self.num_key_value_heads or self.num_attention_heads

    @property
    def kv_channels(self) -> int:
        """Head dimension: ``head_dim``, else ``hidden_size / num_attention_heads``."""
        return self.head_dim or self.hidden_size // self.num_attention_heads

    @property
    def gated(self) -> bool:
        """SwiGLU MLP (three projections) rather than GPT's two."""
        return self.hidden_act.lower() in _GATED

    @property
    def experts(self) -> int:
        """Routed experts (0: a dense model)."""
        return self.num_local_experts or self.n_routed_experts or self.num_experts or 0

    @property
    def topk(self) -> int:
        """Experts per token (0 for a dense model)."""
        return (self.num_experts_per_tok or 0) if self.experts else 0

    @property
    def moe_ffn(self) -> int:
        """One routed expert's FFN width."""
        return self.moe_intermediate_size or self.intermediate_size

    @property
    def shared_ffn(self) -> int:
        """The shared experts' total FFN width (Megatron's
        ``moe_shared_expert_intermediate_size``): ``shared_expert_intermediate_size``, else
        ``n_shared_experts x moe_intermediate_size``, else 0."""
        if self.shared_expert_intermediate_size is not None:
            return self.shared_expert_intermediate_size
        return (self.n_shared_experts or 0) * self.moe_ffn

    @property
    def mla(self) -> bool:
        """Multi-latent attention (DeepSeek-V2/V3)."""
        return self.kv_lora_rank is not None

    def is_moe_layer(self, i: int) -> bool:
        """Whether decoder layer ``i`` (0-based) has an expert MLP: DeepSeek's
        ``first_k_dense_replace`` and ``moe_layer_freq``, Qwen's ``decoder_sparse_step``
        and ``mlp_only_layers``."""
        if not self.experts or i < self.first_k_dense_replace or i in self.mlp_only_layers:
            return False
        step = self.moe_layer_freq * self.decoder_sparse_step
        return (i - self.first_k_dense_replace) % step == 0 if step > 1 else True

    def moe_layers(self) -> int:
        """Number of decoder layers with an expert MLP."""
        return sum(self.is_moe_layer(i) for i in range(self.num_hidden_layers))

    def attention_params(self) -> int:
        """Weights of one attention block (projections; norms excluded)."""
        h, a = self.hidden_size, self.num_attention_heads
        if self.mla:
            qk = (self.qk_nope_head_dim or self.kv_channels) + (self.qk_rope_head_dim or 0)
            v = self.v_head_dim or self.kv_channels
            q = (self.q_lora_rank * (h + a * qk) if self.q_lora_rank else h * a * qk)
            kv = h * (self.kv_lora_rank + (self.qk_rope_head_dim or 0))
            kv += self.kv_lora_rank * a * ((self.qk_nope_head_dim or self.kv_channels) + v)
            return q + kv + a * v * h
        d, g = self.kv_channels, self.kv_heads
        return h * (a * d + 2 * g * d) + a * d * h

    def mlp_params(self, ffn: int) -> int:
        """Weights of one MLP of width ``ffn``."""
        return (3 if self.gated else 2) * self.hidden_size * ffn

    def layer_params(self, i: int) -> int:
        """Weights of decoder layer ``i`` (all experts included, router included)."""
        if self.is_moe_layer(i):
            mlp = (self.experts * self.mlp_params(self.moe_ffn) + self.mlp_params(self.shared_ffn)
                   if self.shared_ffn else self.experts * self.mlp_params(self.moe_ffn))
            mlp += self.hidden_size * self.experts
        else:
            mlp = self.mlp_params(self.intermediate_size)
        return self.attention_params() + mlp + 2 * self.hidden_size

    def embedding_params(self) -> int:
        return self.vocab_size * self.hidden_size

    def total_params(self) -> int:
        """All weights: layers, embedding, LM head unless tied, final norm."""
        head = 0 if self.tie_word_embeddings else self.embedding_params()
        return (sum(self.layer_params(i) for i in range(self.num_hidden_layers))
                + self.embedding_params() + head + self.hidden_size)


def model_from_dict(data: dict[str, Any], source: str = "") -> ModelConfig:
    """A :class:`ModelConfig` from a config.json dict: :data:`IGNORED_KEYS` dropped,
    any other unknown key refused. ``source``: what the message starts with (a path, a
    preset; ``""``: a table given inline). Raises :class:`ScenarioError` (one line
    naming the key and the closest known one, or the bad value; a figure out of its
    bounds with the value and the allowed range, :func:`~schedsim.util.validation.range_error`)."""
    from schedsim.util.suggest import did_you_mean

    if not isinstance(data, dict):
        raise ScenarioError(f"{source or 'model'}: a model config is a JSON object of "
                            f"config.json keys")
    unknown = sorted(k for k in data if k not in USED_KEYS and k not in IGNORED_KEYS)
    if unknown:
        k = unknown[0]
        more = f" (and {len(unknown) - 1} more: {', '.join(unknown[1:4])})" if len(unknown) > 1 else ""
        raise ScenarioError(f"{source + ': ' if source else ''}unknown model config key {k!r}{did_you_mean(k, USED_KEYS)}"
                            f"{more}; the keys used are in schedsim.workload.model.USED_KEYS, "
                            f"the ignored ones in IGNORED_KEYS")
    kept = {k: v for k, v in data.items() if k in USED_KEYS}
    if isinstance(kept.get("mlp_only_layers"), list):
        kept["mlp_only_layers"] = tuple(kept["mlp_only_layers"])
    try:
        return ModelConfig.model_validate(kept)
    except ValidationError as e:
        from schedsim.util.validation import range_error

        err = e.errors()[0]
        where = f"{source}: " if source else ""
        bound = range_error(err, ModelConfig)
        if bound is not None:
            raise ScenarioError(f"{where}model config {bound}") from None
        from schedsim.util.validation import describe_error

        raise ScenarioError(f"{where}model config {describe_error(err)}") from None


def load_model(name_or_path: str | Path | ModelConfig | dict) -> ModelConfig:
    """A shipped preset by name (:data:`schedsim.workload.presets.MODELS`), a path to a
    Hugging Face style ``config.json``, a dict of its keys, or a config as is.
    Raises :class:`ScenarioError` for an unknown name or a bad file."""
    from schedsim.workload.presets import MODELS

    if isinstance(name_or_path, ModelConfig):
        return name_or_path
    if isinstance(name_or_path, dict):
        return model_from_dict(name_or_path)
    key = str(name_or_path)
    if key.lower() in MODELS:
        return model_from_dict(MODELS[key.lower()], f"preset {key}")
    path = Path(key)
    if not (path.suffix.lower() == ".json" or path.exists()):
        from schedsim.util.suggest import did_you_mean

        raise ScenarioError(f"unknown model {key!r}{did_you_mean(key, MODELS)}: give a preset "
                            f"({', '.join(MODELS)}) or a path to a config.json")
    from schedsim.util.inputs import loading, read_input_text

    with loading(path, "model config.json"):
        text = read_input_text(path, "model config")
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ScenarioError(f"{path}: not JSON: {e}") from None
        cfg = model_from_dict(data, str(path))
        return cfg.model_copy(update={"name": cfg.name if "name" in data else path.stem,
                                      "source": cfg.source or str(path)})
