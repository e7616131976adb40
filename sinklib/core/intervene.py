"""Causal interventions on the attention sink (chapter 8): an attention function registered in transformers'
attention registry (``INTERVENE_NAME``, with its mask function, like the probe of `sinklib.core.probe`) that, in a
chosen set of (layer, head) pairs, changes what each query does with the sink key:

- ``remove``: the sink key's logit is set to -inf, so its attention mass goes to the other keys in proportion
  (softmax over the rest);
- ``shift``: the sink key's logit is shifted by ``shift`` (negative: a weaker sink, positive: a stronger one);
- ``remove_matched`` (the control of ``remove``): the same attention mass that ``remove`` would take from the
  sink is taken instead from the other visible keys, the most-attended first, then the row is renormalised,
  so a head loses as much attention as under ``remove`` but keeps its sink. Where the sink holds more than
  half of a query's attention, the other keys hold less than that: all of it is taken (the head then attends
  to the sink alone), and ``removed`` shows how much less than ``remove`` the control took. With ``take``
  ({layer: {head: share}}), each head instead loses that share of its non-sink attention (most-attended
  first; heads not named in ``take`` lose all of it): the form `sinklib.causal.matched` uses to match the
  sink's mass over more heads.

Queries at or before the sink (its own row, left padding) are left alone; layers and heads outside the
set run SDPA as usual. The intervened layers compute their attention map explicitly (fp32, in chunks of
queries), with the model's own scaling, softcapping, sliding windows and padding masks. ``removed`` records,
per intervened layer, the attention mass taken from each (row, head, query): the controls are compared by it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from sinklib.errors import ParameterError
from sinklib.core.params import check_choice, check_float
from sinklib.core.probe import _allowed, _eager_output, _expand_kv

INTERVENE_NAME = "sinkbook_intervene"
MODES = ("remove", "shift", "remove_matched")


@dataclass
class _Plan:
    heads: dict[int, torch.Tensor]           # layer -> bool [H]: the intervened heads
    sink_index: torch.Tensor | None          # [B] key position of the sink in each row (None: from the mask)
    mode: str
    shift: float
    chunk: int
    take: dict[int, torch.Tensor] | None = None  # layer -> float [H]: share of non-sink attention taken
    removed: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, H, Tq] mass taken (last pass)
    taken_sum: float = 0.0                   # mass taken, summed over every pass, intervened head and query
    taken_n: int = 0                         # the (head, query) entries it is summed over

    @property
    def mean_taken(self) -> float:
        """Mean attention mass taken per intervened (head, query) over every forward pass so far."""
        return self.taken_sum / self.taken_n if self.taken_n else 0.0


_ACTIVE: _Plan | None = None


def adjust_logits_and_probs(logits: torch.Tensor, allowed: torch.Tensor, heads: torch.Tensor, sink: torch.Tensor,
                            q_pos: torch.Tensor, mode: str, shift: float = 0.0,
                            take: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The intervention on one chunk of masked logits (pure; tested on its own).

    logits [B, H, C, Tk] (masked entries already at the dtype's minimum), allowed bool [B|1, 1|H, C, Tk],
    heads bool [H], sink [B] key index, q_pos [C] query positions -> (probabilities [B, H, C, Tk], mass taken
    [B, H, C]). Only rows with q_pos > sink and heads[h] are changed. take float [H] (remove_matched only): the
    share of each head's non-sink attention taken instead of the sink's mass.
    """
    b, h, c, tk = logits.shape
    act = heads.view(1, h, 1) & (q_pos.view(1, 1, c) > sink.view(b, 1, 1))            # [B, H, C]
    sink_col = torch.nn.functional.one_hot(sink, tk).bool().view(b, 1, 1, tk)          # [B, 1, 1, Tk]
    base = torch.softmax(logits, dim=-1)
    p_sink = base.gather(-1, sink.view(b, 1, 1, 1).expand(b, h, c, 1)).squeeze(-1)      # [B, H, C]
    if mode == "remove":
        lg = logits.masked_fill(act[..., None] & sink_col, float("-inf"))
        probs = torch.softmax(lg, dim=-1)
        return torch.where(act[..., None], probs, base), torch.where(act, p_sink, torch.zeros_like(p_sink))
    if mode == "shift":
        lg = torch.where(act[..., None] & sink_col, logits + shift, logits)
        probs = torch.softmax(lg, dim=-1)
        taken = p_sink - probs.gather(-1, sink.view(b, 1, 1, 1).expand(b, h, c, 1)).squeeze(-1)
        return probs, torch.where(act, taken, torch.zeros_like(taken))
    # remove_matched: take p_sink from the visible non-sink keys instead, the most-attended first
    other = base.masked_fill(sink_col | ~allowed.expand(b, h, c, tk), 0.0)
    budget = (other.sum(-1) * take.to(other.dtype).view(1, h, 1) if take is not None
              else torch.minimum(p_sink, other.sum(-1)))
    m = torch.where(act, budget, torch.zeros_like(p_sink))                              # [B, H, C]
    srt, order = other.sort(dim=-1, descending=True)
    before = srt.cumsum(-1) - srt                                                       # mass of larger keys
    cut_sorted = (m[..., None] - before).clamp(min=0).minimum(srt)
    left = base - torch.zeros_like(base).scatter(-1, order, cut_sorted)
    total = left.sum(-1, keepdim=True)
    # a row left with (almost) nothing, every non-sink key taken from a head without sink mass: the sink alone
    alone = sink_col.expand(b, h, c, tk).to(left.dtype)
    probs = torch.where(total > 1e-12, left / total.clamp_min(1e-12), alone)
    return torch.where(act[..., None], probs, base), m


def intervene_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                        scaling: float | None = None, **kwargs):
    """Attention function for transformers' registry: SDPA everywhere except the planned layers' heads.

    query [B, H, Tq, D], key/value [B, Hkv, Tk, D] -> (attn_output [B, Tq, H, D], None).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    plan = _ACTIVE
    layer = getattr(module, "layer_idx", None)
    softcap = kwargs.get("softcap")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    if plan is None or layer not in plan.heads:
        if softcap is not None:
            return _eager_output(query, key, value, attention_mask, scaling, softcap, dropout), None
        kw = {k: v for k, v in kwargs.items() if k not in ("sliding_window", "softcap")}
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kw)
    b, h, tq, _ = query.shape
    k, v = _expand_kv(key, h).float(), _expand_kv(value, h).float()
    tk = k.shape[2]
    heads = plan.heads[layer].to(query.device)
    if heads.numel() != h:
        raise ParameterError(f"layer {layer} has {h} heads; the intervention plan gives {heads.numel()}")
    sink = plan.sink_index.to(query.device)
    out = torch.empty(b, h, tq, v.shape[-1], dtype=torch.float32, device=query.device)
    taken = torch.zeros(b, h, tq, dtype=torch.float32, device=query.device)
    for start in range(0, tq, plan.chunk):
        rows = slice(start, min(tq, start + plan.chunk))
        logits = torch.matmul(query[:, :, rows].float(), k.transpose(-1, -2)) * scaling
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        allowed = _allowed(attention_mask, rows, tq, tk, query.device)
        if allowed is None:  # additive mask
            add = attention_mask[:, :, rows, :tk].float()
            allowed = add > torch.finfo(torch.float32).min / 2
            logits = logits + add
        logits = logits.masked_fill(~allowed, torch.finfo(torch.float32).min)
        q_pos = torch.arange(tq, device=query.device)[rows] + (tk - tq)
        share = plan.take[layer].to(query.device) if plan.take is not None else None
        probs, m = adjust_logits_and_probs(logits, allowed, heads, sink, q_pos, plan.mode, plan.shift, share)
        out[:, :, rows] = torch.matmul(probs, v)
        taken[:, :, rows] = m
    plan.removed[layer] = taken
    q_all = torch.arange(tq, device=query.device) + (tk - tq)
    active = (q_all[None, :] > sink[:, None]).sum().item() * int(heads.sum())
    plan.taken_sum += float(taken.sum())
    plan.taken_n += int(active)
    return out.to(query.dtype).transpose(1, 2).contiguous(), None


def register_intervention() -> None:
    """Register the intervention under INTERVENE_NAME in both registries (attention and mask), as the probe."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(INTERVENE_NAME, intervene_attention)
    AttentionMaskInterface.register(INTERVENE_NAME, sdpa_mask)


def head_plan(heads: Mapping[int, Sequence[int]] | torch.Tensor | np.ndarray, n_layers: int, n_heads: int) -> dict[int, torch.Tensor]:
    """{layer: bool [H]} from {layer: [head, ...]} or a bool [L, H] array; layers without a head are dropped."""
    if isinstance(heads, (torch.Tensor, np.ndarray)):
        a = torch.as_tensor(heads).bool()
        if tuple(a.shape) != (n_layers, n_heads):
            raise ParameterError(f"parameter 'heads' has shape {tuple(a.shape)}; allowed: [{n_layers}, {n_heads}] "
                                 "(layers x heads) or a dict {layer: [head, ...]}")
        return {int(l): a[l].clone() for l in range(n_layers) if a[l].any()}
    plan = {}
    for layer, hs in dict(heads).items():
        if not 0 <= int(layer) < n_layers:
            raise ParameterError(f"parameter 'heads' names layer {layer}; allowed: 0..{n_layers - 1}")
        mask = torch.zeros(n_heads, dtype=torch.bool)
        for hh in hs:
            if not 0 <= int(hh) < n_heads:
                raise ParameterError(f"parameter 'heads' names head {hh} of layer {layer}; allowed: 0..{n_heads - 1}")
            mask[int(hh)] = True
        if mask.any():
            plan[int(layer)] = mask
    return plan


def take_plan(take: Mapping[int, Mapping[int, float]] | None, plan: Mapping[int, torch.Tensor]) -> dict[int, torch.Tensor] | None:
    """{layer: float [H]} of the shares taken from each planned head's non-sink attention: ``take``'s value
    ({layer: {head: share}}), 1 for a planned head it does not name, 0 elsewhere; None without ``take``."""
    if take is None:
        return None
    out = {l: m.float() for l, m in plan.items()}
    for layer, hs in dict(take).items():
        for hh, share in dict(hs).items():
            if int(layer) not in plan or not plan[int(layer)][int(hh)]:
                raise ParameterError(f"parameter 'take' names head {hh} of layer {layer}, which is not intervened on")
            out[int(layer)][int(hh)] = check_float("take[][]", float(share), 0.0, 1.0)
    return out


def _first_real_token(module, args, kwargs) -> None:
    """Forward pre-hook on the trunk: the sink of each row is its first real token (the 2-D attention mask
    covers the cached keys too, so this holds at every decoding step)."""
    mask = kwargs.get("attention_mask")
    ids = kwargs.get("input_ids", args[0] if args else None)
    ref = ids if ids is not None else kwargs.get("inputs_embeds")
    if mask is not None and mask.ndim == 2:
        _ACTIVE.sink_index = mask.long().argmax(dim=1)
    elif ref is not None:
        _ACTIVE.sink_index = torch.zeros(ref.shape[0], dtype=torch.long, device=ref.device)


@contextlib.contextmanager
def sink_intervention(model, heads, sink_index: torch.Tensor | None = None, mode: str = "remove",
                      shift: float = 0.0, chunk: int = 256, take: Mapping[int, Mapping[int, float]] | None = None):
    """Context in which forward passes of ``model`` apply the intervention to ``heads`` ({layer: [head, ...]}
    or bool [L, H]). sink_index [B]: key position of the sink per row; None (the default): each row's first
    real token, read from the attention mask of every forward pass (so `sinklib.evals` and ``generate`` run
    unchanged inside the context). take ({layer: {head: share}}, mode remove_matched only; see the module's
    docstring): the share of each head's non-sink attention taken. Yields the plan; ``plan.removed[l]`` is the mass taken [B, H, T] by the
    last forward pass."""
    global _ACTIVE
    from sinklib.core.anatomy import n_layers, trunk

    mode = check_choice("mode", mode, MODES)
    shift = check_float("shift", shift, -1e4, 1e4)
    register_intervention()
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    hp = head_plan(heads, n_layers(model), cfg.num_attention_heads)
    if take is not None and mode != "remove_matched":
        raise ParameterError(f"parameter 'take' is for mode 'remove_matched'; got mode {mode!r}")
    plan = _Plan(heads=hp, sink_index=None if sink_index is None else sink_index.long(), mode=mode, shift=shift,
                 chunk=chunk, take=take_plan(take, hp))
    hook = trunk(model).register_forward_pre_hook(_first_real_token, with_kwargs=True) if sink_index is None else None
    prev = model.config._attn_implementation
    model.set_attn_implementation(INTERVENE_NAME)
    _ACTIVE = plan
    try:
        yield plan
    finally:
        _ACTIVE = None
        model.set_attn_implementation(prev)
        if hook is not None:
            hook.remove()


def top_heads(scores, layers: Sequence[int], k: int) -> dict[int, list[int]]:
    """The `k` (layer, head) pairs of `layers` with the largest score [L, H] (ties: lower layer, then lower head
    first), as {layer: [head, ...]}."""
    m = np.asarray(scores, dtype=float)
    pairs = sorted(((l, h) for l in layers for h in range(m.shape[1])), key=lambda p: (-m[p], p))
    if not 0 <= k <= len(pairs):
        raise ParameterError(f"parameter 'k' got {k}; allowed: 0..{len(pairs)} (heads in the chosen layers)")
    return _as_dict(sorted(pairs[:k]))


def heads_by_sink_mass(mass, layers: Sequence[int], fraction: float) -> dict[int, list[int]]:
    """The top ``fraction`` of the (layer, head) pairs of ``layers`` ranked by sink mass [L, H] (ties: lower
    layer, then lower head first): round(fraction * len(layers) * H) heads."""
    fraction = check_float("fraction", fraction, 0.0, 1.0)
    n = len(layers) * np.asarray(mass).shape[1]
    return top_heads(mass, layers, int(round(fraction * n)))


def random_heads(layers: Sequence[int], n_heads: int, k: int, seed: int = 0) -> dict[int, list[int]]:
    """``k`` (layer, head) pairs of ``layers`` drawn uniformly without replacement (seeded): the random control."""
    pairs = [(l, h) for l in layers for h in range(n_heads)]
    if not 0 <= k <= len(pairs):
        raise ParameterError(f"parameter 'k' got {k}; allowed: 0..{len(pairs)} (heads in the chosen layers)")
    idx = np.random.default_rng(seed).choice(len(pairs), size=k, replace=False)
    return _as_dict(sorted(pairs[i] for i in idx))


def _as_dict(pairs) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for l, h in pairs:
        out.setdefault(int(l), []).append(int(h))
    return out
