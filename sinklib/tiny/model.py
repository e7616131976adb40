"""Three tiny causal LMs that differ ONLY in how queries and keys are normalised (chapter 7).

| variant | class | QK normalisation |
| --- | --- | --- |
| ``none`` | ``LlamaForCausalLM`` | none |
| ``per_head`` | ``Qwen3ForCausalLM`` | RMSNorm over each head's query/key (``head_dim`` gains, Qwen3) |
| ``layerwise`` | ``LayerwiseQKForCausalLM`` (a Qwen3 subclass, below) | one RMSNorm over all heads' queries (keys) concatenated, before the head split (OLMo-2's ``q_norm``/``k_norm``) |

Everything else is the same: Llama's pre-norm block (input_layernorm -> attention -> residual ->
post_attention_layernorm -> SwiGLU MLP -> residual), RoPE, the same module names and shapes. With the
same seed the three also start from the same weights: every parameter is drawn by *name* with the
project's seed rule (``cache.key_seed(seed, name)``), so a shared parameter is identical across
variants and only the QK-norm gains (ones at init) exist in one variant and not another.

The layerwise subclass keeps the attention in transformers' attention-function registry
(``ALL_ATTENTION_FUNCTIONS``) and subclasses ``Qwen3Attention``, so the sink probe, eager
``output_attentions`` and every chapter's code see it like any other model. Its model_type
``sinkbook_layerwise_qk`` is registered with the Auto classes and mapped to the label
``layerwise`` in ``sinklib.core.models.QK_NORM_BY_MODEL_TYPE`` when this module is imported (it must
be imported for such a model to exist).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM
from transformers.models.qwen3 import modeling_qwen3 as _q3

from sinklib.core.anatomy import QK_NORM_TYPES, decoder_layers
from sinklib.core.cache import RANDOM_SEED_MODULUS, key_seed
from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_float, check_int
from sinklib.tiny.tokenizer import BOS_ID, EOS_ID, PAD_ID

VARIANTS: tuple[str, ...] = QK_NORM_TYPES  # none, per_head, layerwise
LAYERWISE_MODEL_TYPE = "sinkbook_layerwise_qk"


# ---------------------------------------------------------------------------------------
# the layerwise variant: Qwen3 with OLMo-2's QK-norm


class LayerwiseQKConfig(Qwen3Config):
    """A Qwen3 config whose attention normalises q and k over all heads at once (see module doc)."""

    model_type = LAYERWISE_MODEL_TYPE


class LayerwiseQKAttention(_q3.Qwen3Attention):
    """Qwen3Attention with OLMo-2's QK-norm: ``q = RMSNorm_{H*dh}(q_proj(x))``, then the head split.

    hidden_states [B, T, D] -> q [B, H, T, dh], k/v [B, Hkv, T, dh] -> registry attention -> [B, T, D].
    """

    def __init__(self, config, layer_idx: int):
        super().__init__(config, layer_idx)
        self.q_norm = _q3.Qwen3RMSNorm(config.num_attention_heads * self.head_dim, eps=config.rms_norm_eps)
        self.k_norm = _q3.Qwen3RMSNorm(config.num_key_value_heads * self.head_dim, eps=config.rms_norm_eps)

    def forward(self, hidden_states, position_embeddings, attention_mask, past_key_values=None, **kwargs):
        input_shape = hidden_states.shape[:-1]
        hidden_shape = (*input_shape, -1, self.head_dim)
        query_states = self.q_norm(self.q_proj(hidden_states)).view(hidden_shape).transpose(1, 2)  # norm, then split
        key_states = self.k_norm(self.k_proj(hidden_states)).view(hidden_shape).transpose(1, 2)
        value_states = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        cos, sin = position_embeddings
        query_states, key_states = _q3.apply_rotary_pos_emb(query_states, key_states, cos, sin)
        if past_key_values is not None:
            key_states, value_states = past_key_values.update(key_states, value_states, self.layer_idx)
        attention_interface: Callable = _q3.ALL_ATTENTION_FUNCTIONS.get_interface(
            self.config._attn_implementation, _q3.eager_attention_forward)
        attn_output, attn_weights = attention_interface(
            self, query_states, key_states, value_states, attention_mask,
            dropout=0.0 if not self.training else self.attention_dropout, scaling=self.scaling,
            sliding_window=self.sliding_window, **kwargs)
        attn_output = attn_output.reshape(*input_shape, -1).contiguous()
        return self.o_proj(attn_output), attn_weights


class LayerwiseQKForCausalLM(Qwen3ForCausalLM):
    """Qwen3ForCausalLM whose attention layers are `LayerwiseQKAttention`."""

    config_class = LayerwiseQKConfig

    def __init__(self, config):
        super().__init__(config)
        for i, layer in enumerate(self.model.layers):
            layer.self_attn = LayerwiseQKAttention(config, layer_idx=i)
        self.post_init()


def _register() -> None:
    from transformers import AutoConfig, AutoModelForCausalLM

    from sinklib.core import models

    try:
        AutoConfig.register(LAYERWISE_MODEL_TYPE, LayerwiseQKConfig)
        AutoModelForCausalLM.register(LayerwiseQKConfig, LayerwiseQKForCausalLM)
    except ValueError:  # already registered (module reloaded)
        pass
    models.QK_NORM_BY_MODEL_TYPE.setdefault(LAYERWISE_MODEL_TYPE, "layerwise")


_register()


# ---------------------------------------------------------------------------------------
# sizes and building


@dataclass(frozen=True)
class SizeConfig:
    """The shape of a tiny model (the same for every variant)."""

    d_model: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 4
    ffn: int = 512
    context: int = 128
    vocab_size: int = 1024
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-6
    init_std: float = 0.02

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def as_dict(self) -> dict:
        return asdict(self)


def size_config(**overrides) -> SizeConfig:
    """A checked `SizeConfig` (defaults: d_model 128, 4 layers, 4 heads, ffn 512, context 128, vocab 1024).
    n_kv_heads defaults to n_heads (no GQA)."""
    if "n_heads" in overrides and "n_kv_heads" not in overrides:
        overrides = {**overrides, "n_kv_heads": overrides["n_heads"]}
    bad = set(overrides) - set(SizeConfig.__dataclass_fields__)
    if bad:
        raise ParameterError(f"unknown size parameter(s) {sorted(bad)}; allowed: {', '.join(SizeConfig.__dataclass_fields__)}")
    s = SizeConfig(**overrides)
    check_int("d_model", s.d_model, 8, 8192)
    check_int("n_layers", s.n_layers, 1, 128)
    check_int("n_heads", s.n_heads, 1, 128)
    check_int("n_kv_heads", s.n_kv_heads, 1, s.n_heads)
    check_int("ffn", s.ffn, 1, 1 << 16)
    check_int("context", s.context, 4, 1 << 16)
    check_int("vocab_size", s.vocab_size, 8, 1 << 20)
    check_float("init_std", s.init_std, 0.0, 1.0)
    if s.d_model % s.n_heads:
        raise ParameterError(f"parameter 'd_model' got {s.d_model}; allowed: a multiple of n_heads={s.n_heads}")
    if s.n_heads % s.n_kv_heads:
        raise ParameterError(f"parameter 'n_kv_heads' got {s.n_kv_heads}; allowed: a divisor of n_heads={s.n_heads}")
    return s


def hf_config(variant: str, size: SizeConfig):
    """The transformers config of a variant: identical fields, only the class differs."""
    variant = check_choice("variant", variant, VARIANTS)
    common = dict(vocab_size=size.vocab_size, hidden_size=size.d_model, intermediate_size=size.ffn,
                  num_hidden_layers=size.n_layers, num_attention_heads=size.n_heads,
                  num_key_value_heads=size.n_kv_heads, head_dim=size.head_dim, max_position_embeddings=size.context,
                  rms_norm_eps=size.rms_norm_eps, rope_parameters={"rope_type": "default", "rope_theta": size.rope_theta},
                  tie_word_embeddings=size.tie_embeddings, attention_bias=False, attention_dropout=0.0,
                  initializer_range=size.init_std, hidden_act="silu", bos_token_id=BOS_ID, eos_token_id=EOS_ID,
                  pad_token_id=PAD_ID)
    if variant == "none":
        return LlamaConfig(**common, mlp_bias=False)
    cls = Qwen3Config if variant == "per_head" else LayerwiseQKConfig
    return cls(**common, use_sliding_window=False, sliding_window=None)


_CLASSES = {"none": LlamaForCausalLM, "per_head": Qwen3ForCausalLM, "layerwise": LayerwiseQKForCausalLM}


def is_qk_norm_gain(name: str) -> bool:
    """True for the parameters that exist only in the QK-normalised variants."""
    return name.rsplit(".", 2)[-2] in ("q_norm", "k_norm")


@torch.no_grad()
def init_weights(model: nn.Module, seed: int, std: float) -> None:
    """Every parameter drawn by name: matrices and embeddings N(0, std^2) with the generator seeded by
    ``key_seed(seed, name)``, norm gains 1; the padding embedding row 0. Same (seed, name), same tensor."""
    for name, p in model.named_parameters():
        if p.ndim == 1:  # RMSNorm gains (no biases in these models)
            p.fill_(1.0)
            continue
        g = torch.Generator().manual_seed(key_seed(seed, name, RANDOM_SEED_MODULUS))
        p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32).mul_(std).to(p.dtype))
    emb = model.get_input_embeddings()
    if getattr(emb, "padding_idx", None) is not None:
        emb.weight[emb.padding_idx].zero_()


def build(variant: str, size: SizeConfig | dict | None = None, seed: int = 0) -> nn.Module:
    """A freshly initialised tiny causal LM of `variant` ('none', 'per_head', 'layerwise'), in eval mode."""
    variant = check_choice("variant", variant, VARIANTS)
    seed = check_int("seed", seed, 0)
    size = size_config() if size is None else size if isinstance(size, SizeConfig) else size_config(**size)
    model = _CLASSES[variant](hf_config(variant, size))
    model.set_attn_implementation("sdpa")
    init_weights(model, seed, size.init_std)
    return model.eval()


def qk_norm_of(model: nn.Module) -> str:
    """The QK-norm label read from the modules (the rule of ``sinklib.bound.real``): no q_norm ->
    'none'; a q_norm gain of head_dim entries -> 'per_head'; of all heads' width -> 'layerwise'."""
    attn = decoder_layers(model)[0].self_attn
    qn = getattr(attn, "q_norm", None)
    if qn is None:
        return "none"
    return "per_head" if qn.weight.numel() == attn.head_dim else "layerwise"


def n_parameters(model: nn.Module, exclude_qk_norm: bool = False) -> int:
    """Number of parameters (tied embeddings counted once); optionally without the QK-norm gains."""
    return sum(p.numel() for n, p in model.named_parameters() if not (exclude_qk_norm and is_qk_norm_gain(n)))
