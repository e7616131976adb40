"""The attention probe: an attention function registered in transformers' attention registry
(``PROBE_NAME``) that returns the same attention output as SDPA and, for the layers being
recorded, keeps only the sink column's probability per query, ``[B, H, T]``: O(T) per head,
never a T x T map for every layer. It sees queries and keys after RoPE and after q_norm/k_norm,
with the model's own masks (sliding windows, padding) and its own ``scaling`` and ``softcap``.
``eager_sink_probs`` is the naive reference (eager attention with ``output_attentions``) that the
tests compare it with. `sinklib.core.sink` builds sink mass and S on top of it.
"""
from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from sinklib.core.params import check_choice

PROBE_NAME = "sinkbook_probe"
METHODS = ("auto", "fused", "chunked")

# ---------------------------------------------------------------------------------------
# the probe


@dataclass
class _Recorder:
    layers: set[int] | None                  # None = every layer
    sink_index: torch.Tensor                 # [B] key position of the sink in each row
    query_weight: torch.Tensor | None        # [B, T] weights of the queries for column mass
    record_columns: bool
    method: str
    chunk: int
    p_sink: dict[int, torch.Tensor] = field(default_factory=dict)   # layer -> [B, H, Tq]
    col_mass: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> [B, H, Tk]
    calls: int = 0


_ACTIVE: _Recorder | None = None


def _expand_kv(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[B, Hkv, T, D] -> [B, H, T, D] (GQA: each kv head serves H/Hkv query heads)."""
    b, hkv, t, d = x.shape
    if hkv == n_heads:
        return x
    return x[:, :, None].expand(b, hkv, n_heads // hkv, t, d).reshape(b, n_heads, t, d)


def _allowed(mask: torch.Tensor | None, q_rows: slice, tq: int, tk: int, device) -> torch.Tensor | None:
    """Boolean [B|1, 1|H, C, Tk] of allowed keys for a chunk of queries, or None for an additive mask."""
    if mask is None:  # causal, bottom-right aligned (decode: the last query sees every key)
        qi = torch.arange(tq, device=device)[q_rows] + (tk - tq)
        return (torch.arange(tk, device=device)[None, :] <= qi[:, None])[None, None]
    if mask.dtype == torch.bool:
        return mask[:, :, q_rows, :tk]
    return None


def _chunked_stats(query, key, mask, scaling, softcap, rec: _Recorder):
    """Exact sink probability [B, H, Tq] (and column mass [B, H, Tk]) in query chunks, fp32."""
    b, h, tq, _ = query.shape
    key = _expand_kv(key, h)
    tk = key.shape[2]
    sink = rec.sink_index.to(query.device)
    p_sink = torch.empty(b, h, tq, dtype=torch.float32, device=query.device)
    colm = torch.zeros(b, h, tk, dtype=torch.float32, device=query.device) if rec.record_columns else None
    kf = key.float()
    for start in range(0, tq, rec.chunk):
        rows = slice(start, min(tq, start + rec.chunk))
        logits = torch.matmul(query[:, :, rows].float(), kf.transpose(-1, -2)) * scaling  # [B, H, C, Tk]
        if softcap is not None:
            logits = torch.tanh(logits / softcap) * softcap
        allowed = _allowed(mask, rows, tq, tk, query.device)
        if allowed is not None:
            logits = logits.masked_fill(~allowed, torch.finfo(torch.float32).min)
        else:
            logits = logits + mask[:, :, rows, :tk].float()
        probs = torch.softmax(logits, dim=-1)
        p_sink[:, :, rows] = probs.gather(-1, sink.view(b, 1, 1, 1).expand(b, h, probs.shape[2], 1)).squeeze(-1)
        if colm is not None:
            w = rec.query_weight[:, rows].to(probs)  # [B, C]
            colm += torch.einsum("bhct,bc->bht", probs, w)
    return p_sink, colm


def _fused_cpu(query, key, value, mask, scaling, rec: _Recorder):
    """CPU flash kernel: output and log-sum-exp in one pass; p_sink = exp(sink logit - lse). O(T) extra."""
    b, h, tq, _ = query.shape
    k = _expand_kv(key, h)
    v = _expand_kv(value, h)
    tk = k.shape[2]
    if mask is None:
        if tq != tk:
            return None
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, k, v, 0.0, True, attn_mask=None, scale=scaling)
        sink_ok = None
    else:
        add = mask[:, :, :, :tk]
        if add.dtype == torch.bool:
            sink_ok = add
            # one [B, 1, Tq, Tk] float tensor (zeros().masked_fill(~add) held three: the bool inverse and two floats)
            add = torch.where(add, torch.zeros((), dtype=query.dtype, device=query.device),
                              torch.full((), torch.finfo(query.dtype).min, dtype=query.dtype, device=query.device))
        else:
            sink_ok = None
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, k, v, 0.0, False, attn_mask=add.contiguous(), scale=scaling)  # [B, 1, Tq, Tk] broadcasts over heads: no per-head copy
        if sink_ok is None:
            sink_add = mask[:, :, :, :tk].gather(
                -1, rec.sink_index.view(b, 1, 1, 1).expand(b, mask.shape[1], tq, 1)).squeeze(-1)
    sink = rec.sink_index.to(query.device)
    k_sink = k[torch.arange(b), :, sink]                       # [B, H, D]
    s_logit = torch.einsum("bhtd,bhd->bht", query.float(), k_sink.float()) * scaling
    if mask is not None and sink_ok is None:
        s_logit = s_logit + sink_add.float()
    p_sink = torch.exp(s_logit - lse.float())
    if sink_ok is not None:
        ok = sink_ok.gather(-1, sink.view(b, 1, 1, 1).expand(b, sink_ok.shape[1], tq, 1)).squeeze(-1)
        p_sink = torch.where(ok, p_sink, torch.zeros_like(p_sink))  # a sink outside the window gets 0
    return out.transpose(1, 2).contiguous(), p_sink


def _eager_output(query, key, value, mask, scaling, softcap, dropout):
    """Plain softmax attention, for softcapped models that SDPA refuses. Returns [B, Tq, H, D]."""
    h = query.shape[1]
    k, v = _expand_kv(key, h), _expand_kv(value, h)
    logits = torch.matmul(query, k.transpose(-1, -2)) * scaling
    if softcap is not None:
        logits = torch.tanh(logits / softcap) * softcap
    tq, tk = query.shape[2], k.shape[2]
    allowed = _allowed(mask, slice(0, tq), tq, tk, query.device)
    if allowed is not None:
        logits = logits.masked_fill(~allowed, torch.finfo(logits.dtype).min)
    else:
        logits = logits + mask[:, :, :, :tk]
    probs = torch.softmax(logits.float(), dim=-1).to(query.dtype)
    probs = torch.nn.functional.dropout(probs, p=dropout, training=False)
    return torch.matmul(probs, v).transpose(1, 2).contiguous()


def probe_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                    scaling: float | None = None, **kwargs):
    """Attention function for transformers' registry: SDPA's output, plus the sink column when recording.

    query [B, H, Tq, D], key/value [B, Hkv, Tk, D], attention_mask None (causal) | bool | additive.
    Returns (attn_output [B, Tq, H, D], None).
    """
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    rec = _ACTIVE
    layer = getattr(module, "layer_idx", None)
    softcap = kwargs.get("softcap")
    if scaling is None:
        scaling = query.shape[-1] ** -0.5
    recording = rec is not None and (rec.layers is None or layer in rec.layers)
    if recording and rec.method in ("auto", "fused") and softcap is None and query.device.type == "cpu" \
            and not rec.record_columns and query.dtype == torch.float32:
        fused = _fused_cpu(query, key, value, attention_mask, scaling, rec)
        if fused is not None:
            out, p = fused
            rec.p_sink[layer] = p
            rec.calls += 1
            return out, None
    if softcap is not None:
        out = _eager_output(query, key, value, attention_mask, scaling, softcap, dropout)
    else:
        kw = {k: v for k, v in kwargs.items() if k not in ("sliding_window", "softcap")}
        out, _ = sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                        scaling=scaling, **kw)
    if recording:
        p, colm = _chunked_stats(query, key, attention_mask, scaling, softcap, rec)
        rec.p_sink[layer] = p
        if colm is not None:
            rec.col_mass[layer] = colm
        rec.calls += 1
    return out, None


def register_probe() -> None:
    """Register the probe under PROBE_NAME in both registries (attention and mask).

    Registering only the attention function is not enough: without a mask function of the
    same name every layer receives attention_mask=None, which silently drops sliding
    windows and padding.
    """
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PROBE_NAME, probe_attention)
    AttentionMaskInterface.register(PROBE_NAME, sdpa_mask)


@contextlib.contextmanager
def sink_probe(model, sink_index: torch.Tensor, layers: Sequence[int] | None = None,
               query_weight: torch.Tensor | None = None, record_columns: bool = False,
               method: str = "auto", chunk: int = 256):
    """Context in which forward passes of ``model`` record the sink column of the chosen layers.

    sink_index [B]: key position of the sink per row. Yields the recorder; ``rec.p_sink[l]``
    is [B, H, T] after a forward pass.
    """
    global _ACTIVE
    register_probe()
    check_choice("method", method, METHODS)
    prev = model.config._attn_implementation
    model.set_attn_implementation(PROBE_NAME)
    rec = _Recorder(layers=None if layers is None else set(int(x) for x in layers),
                    sink_index=sink_index.long(), query_weight=query_weight,
                    record_columns=record_columns, method=method, chunk=chunk)
    _ACTIVE = rec
    try:
        yield rec
    finally:
        _ACTIVE = None
        model.set_attn_implementation(prev)


# ---------------------------------------------------------------------------------------
# reference (naive) implementation


def eager_sink_probs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None,
                     sink_index: torch.Tensor) -> torch.Tensor:
    """Naive reference: eager attention with output_attentions=True, sink column taken afterwards.

    Returns [B, L, H, T]. Materialises every layer's [B, H, T, T] map: for tests and benchmarks.
    """
    prev = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids, attention_mask=attention_mask, output_attentions=True)
    finally:
        model.set_attn_implementation(prev)
    b = input_ids.shape[0]
    cols = [a.float().gather(-1, sink_index.view(b, 1, 1, 1).expand(b, a.shape[1], a.shape[2], 1)).squeeze(-1)
            for a in out.attentions]
    return torch.stack(cols, dim=1)
