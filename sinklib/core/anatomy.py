"""The anatomy of a causal LM: where sinklib finds the trunk, the decoder layers, the LM head
(with Gemma's final soft-capping), the number of layers, and how it pads token lists.

Every other module reaches into a model through these functions, so a new architecture (or a
wrapper such as a VLM's `model.language_model`) is taught to sinklib in one place.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sinklib.errors import AttentionError, ParameterError
from sinklib.core.params import check_choice

#: the QK-norm types, one vocabulary everywhere (models, bound, panel): none; per_head (Qwen3,
#: Gemma-3: RMSNorm over each head's query/key); layerwise (OLMo-2: one RMSNorm over all heads)
QK_NORM_TYPES: tuple[str, ...] = ("none", "per_head", "layerwise")

#: attribute paths to the list of decoder layers, tried in order
LAYER_PATHS = ("model.layers", "model.language_model.layers", "layers", "language_model.model.layers")


def trunk(model: Any) -> Any:
    """The transformer without its LM head (sink statistics never need vocabulary logits)."""
    return getattr(model, "base_model", model)


def decoder(model: Any, *, required: bool = True) -> Any:
    """The decoder that returns the final (normed) hidden states `[B, T, H]` (no LM head).

    `get_decoder()` when the model has it, else `.model`; None (or ParameterError when
    `required`) for a model that exposes neither.
    """
    dec = model.get_decoder() if hasattr(model, "get_decoder") else getattr(model, "model", None)
    if dec is None or not callable(dec):
        if required:
            raise ParameterError(f"model {type(model).__name__} exposes no decoder (get_decoder() / .model); "
                                 "use a Hugging Face causal LM")
        return None
    return dec


def decoder_layers(model: Any) -> list:
    """The decoder layers, first to last (Llama-, Qwen-, Gemma-3-, OLMo-2-style and VLM wrappers)."""
    for path in LAYER_PATHS:
        obj = model
        try:
            for p in path.split("."):
                obj = getattr(obj, p)
            return list(obj)
        except AttributeError:
            continue
    raise AttentionError(f"cannot find the decoder layers of {type(model).__name__}: "
                         "sinklib supports Llama-, Qwen-, Gemma-3- and OLMo-2-style models")


def n_layers(model: Any) -> int:
    """Number of decoder layers L, from the (text) config."""
    return int(model.config.get_text_config().num_hidden_layers)


def clamp_last_k(last_k_layers: int, model: Any) -> int:
    """K clamped to the model's depth: min(K, L). A notebook's K may exceed a small model's L."""
    return min(int(last_k_layers), n_layers(model))


def softcap(model: Any) -> float | None:
    """Gemma's final logit soft-capping (None when the model has none)."""
    cfg = getattr(model, "config", None)
    return getattr(cfg, "final_logit_softcapping", None) if cfg is not None else None


def apply_softcap(logits: torch.Tensor, cap: float | None) -> torch.Tensor:
    """cap * tanh(logits / cap), or the logits unchanged when cap is falsy."""
    if cap:
        logits = torch.tanh(logits / cap) * cap
    return logits


def lm_head(model: Any) -> Any:
    """The output embedding (LM head) module, or None."""
    return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None


def head_logits(model: Any, h: torch.Tensor) -> torch.Tensor:
    """LM head on selected hidden states `[N, H]` -> float logits `[N, V]` (final soft-capping applied)."""
    return apply_softcap(lm_head(model)(h).float(), softcap(model))


def device_dtype(model: Any) -> tuple[torch.device, torch.dtype]:
    """Device and dtype of the model's first parameter."""
    p = next(model.parameters())
    return p.device, p.dtype


def positions(mask: torch.Tensor) -> torch.Tensor:
    """Position ids `[B, T]` from an attention mask `[B, T]` (0 at and before the first real token)."""
    return (mask.long().cumsum(-1) - 1).clamp(min=0)


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int = 0, side: str = "right",
              device: Any = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token id lists into input_ids `[B, T]` and attention_mask `[B, T]` (1 = real token)."""
    check_choice("padding_side", side, ("left", "right"))
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), t), dtype=torch.long)
    for r, s in enumerate(seqs):
        if not len(s):
            continue
        sl = slice(0, len(s)) if side == "right" else slice(t - len(s), t)
        ids[r, sl] = torch.tensor(list(s), dtype=torch.long)
        att[r, sl] = 1
    if device is not None:
        ids, att = ids.to(device), att.to(device)
    return ids, att


def pad_token_id(tokenizer: Any, model: Any = None) -> int:
    """The id used for padding: the tokenizer's pad, else its eos, else the model config's pad, else 0."""
    for v in (getattr(tokenizer, "pad_token_id", None), getattr(tokenizer, "eos_token_id", None),
              getattr(getattr(model, "config", None), "pad_token_id", None)):
        if isinstance(v, int):
            return v
    return 0
