"""The attention sink: a probe in transformers' attention registry, per-head sink mass, Sink Strength S.

Notation (paper section 3.2). For layer l, head h, query position i and sink key position s,

    p[l, h, i] = softmax_j( scaling * q_i . k_j  (+ mask) )[s]          (attention on the sink)
    m[l, h]    = mean over prompts and queries i >= s + q0 of p[l, h, i] (sink mass)
    z[l, h]    = log( m / (1 - m) )                                      (log-odds)
    S          = median over the last K layers and all heads of z[l, h]

The probe is an attention function registered under ``PROBE_NAME``. It returns the same
attention output as SDPA and, for the layers being recorded, keeps only the sink column's
probability per query, ``[B, H, T]``: O(T) per head, never a T x T map for every layer.
It sees queries and keys after RoPE and after q_norm/k_norm, with the model's own masks
(sliding windows, padding) and its own ``scaling`` and ``softcap``.
"""
from __future__ import annotations

import contextlib
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import AttentionError, ParameterError
from .params import check_bool, check_choice, check_int

PROBE_NAME = "sinkbook_probe"
AGGREGATES = ("mass_then_logodds", "logodds_then_mean")
SINK_MODES = ("first", "bos", "argmax")
METHODS = ("auto", "fused", "chunked")
_EPS = 1e-6


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
            add = torch.zeros(add.shape, dtype=query.dtype, device=query.device).masked_fill(
                ~add, torch.finfo(query.dtype).min)
        else:
            sink_ok = None
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            query, k, v, 0.0, False, attn_mask=add.expand(b, h, tq, tk).contiguous(), scale=scaling)
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


# ---------------------------------------------------------------------------------------
# batching, sink detection, recording


def _trunk(model):
    """The transformer without its LM head (sink statistics never need vocabulary logits)."""
    return getattr(model, "base_model", model)


def n_layers(model) -> int:
    return int(model.config.get_text_config().num_hidden_layers)


def encode_prompts(tokenizer, prompts: Sequence[str], max_tokens: int = 128, min_tokens: int = 2,
                   add_special_tokens: bool = True) -> list[list[int]]:
    """Token ids per prompt (truncated to max_tokens). Empty or too-short prompts raise ParameterError."""
    if isinstance(prompts, str):
        prompts = [prompts]
    if len(prompts) == 0:
        raise ParameterError("parameter 'prompts' is empty; pass at least one non-empty prompt")
    out = []
    for i, p in enumerate(prompts):
        if not isinstance(p, str) or not p.strip():
            raise ParameterError(f"prompt {i} is empty ({p!r}); every prompt must contain text")
        ids = tokenizer(p, add_special_tokens=add_special_tokens)["input_ids"][:max_tokens]
        if len(ids) < min_tokens:
            raise ParameterError(f"prompt {i} ({p!r}) has {len(ids)} token(s); at least {min_tokens} are needed "
                                 "(the sink plus query_start + 1 queries): use a longer prompt or a smaller query_start")
        out.append(ids)
    return out


def pad_batch(seqs: Sequence[Sequence[int]], pad_id: int = 0, side: str = "right") -> tuple[torch.Tensor, torch.Tensor]:
    """Pad token id lists into input_ids [B, T] and attention_mask [B, T] (1 = real token)."""
    check_choice("padding_side", side, ("left", "right"))
    t = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), t), pad_id, dtype=torch.long)
    att = torch.zeros((len(seqs), t), dtype=torch.long)
    for r, s in enumerate(seqs):
        sl = slice(0, len(s)) if side == "right" else slice(t - len(s), t)
        ids[r, sl] = torch.tensor(list(s), dtype=torch.long)
        att[r, sl] = 1
    return ids, att


def first_real_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] 0/1 mask -> [B] index of the first real token (left padding aware)."""
    return attention_mask.long().argmax(dim=1)


@dataclass
class SinkRecord:
    """What one forward pass recorded."""

    p: torch.Tensor            # [B, Lrec, H, T] sink probability per query
    valid: torch.Tensor        # [B, T] bool: real query at position >= sink + query_start
    layers: list[int]          # recorded layer indices (order of dim 1 of p)
    sink_index: torch.Tensor   # [B]


def _query_valid(attention_mask: torch.Tensor, sink_index: torch.Tensor, query_start: int) -> torch.Tensor:
    t = attention_mask.shape[1]
    pos = torch.arange(t)[None, :]
    return attention_mask.bool() & (pos >= (sink_index[:, None] + query_start))


def find_sink(model, input_ids: torch.Tensor, attention_mask: torch.Tensor, sink: str = "first",
              layers: Sequence[int] | None = None, query_start: int = 1, bos_token_id: int | None = None) -> torch.Tensor:
    """Sink key position per row [B]: first real token, first BOS token, or the argmax column.

    'argmax' runs one probe pass recording column mass (mean attention each key receives from the
    valid queries, summed over the given layers and heads) and returns the heaviest column.
    """
    check_choice("sink", sink, SINK_MODES)
    first = first_real_index(attention_mask)
    if sink == "first":
        return first
    if sink == "bos":
        bos = bos_token_id if bos_token_id is not None else model.config.get_text_config().bos_token_id
        hit = (input_ids == bos) & attention_mask.bool()
        if bos is None or not bool(hit.any(dim=1).all()):
            raise ParameterError("parameter 'sink' is 'bos' but some prompts contain no BOS token "
                                 f"(bos_token_id={bos}); this tokenizer may not prepend one: use sink='first' "
                                 "or sink='argmax'")
        return hit.long().argmax(dim=1)
    qw = _query_valid(attention_mask, first, query_start).float()
    with torch.no_grad(), sink_probe(model, first, layers=layers, query_weight=qw, record_columns=True,
                                     method="chunked") as rec:
        _trunk(model)(input_ids=input_ids, attention_mask=attention_mask)
    if not rec.col_mass:
        raise AttentionError("sink='argmax' needs the probe, but this model's attention does not go through "
                             "transformers' attention registry; use sink='first'")
    total = sum(c.sum(dim=1) for c in rec.col_mass.values())  # [B, Tk]
    total = total.masked_fill(~attention_mask.bool(), -1.0)
    return total.argmax(dim=1)


def record_sink(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                layers: Sequence[int] | None = None, sink: str | torch.Tensor = "first", query_start: int = 1,
                method: str = "auto") -> SinkRecord:
    """One forward pass with the probe. p: [B, Lrec, H, T]; layers None = all layers.

    If the model's attention does not go through the registry, falls back to eager
    output_attentions with a warning (same numbers, T x T memory).
    """
    if attention_mask is None:
        attention_mask = torch.ones_like(input_ids)
    L = n_layers(model)
    layers = list(range(L)) if layers is None else [int(x) for x in layers]
    dev = next(model.parameters()).device
    input_ids, attention_mask = input_ids.to(dev), attention_mask.to(dev)
    sink_index = sink if isinstance(sink, torch.Tensor) else find_sink(model, input_ids, attention_mask, sink,
                                                                        layers, query_start)
    with torch.no_grad(), sink_probe(model, sink_index, layers=layers, method=method) as rec:
        _trunk(model)(input_ids=input_ids, attention_mask=attention_mask)
    if set(rec.p_sink) >= set(layers):
        p = torch.stack([rec.p_sink[l] for l in layers], dim=1)
    else:
        warnings.warn(f"{type(model).__name__} does not route attention through transformers' attention "
                      "registry; the sink is measured with eager output_attentions instead (slower, T x T memory)",
                      stacklevel=2)
        p = eager_sink_probs(model, input_ids, attention_mask, sink_index)[:, layers]
    valid = _query_valid(attention_mask.cpu(), sink_index.cpu(), query_start)
    p = p.cpu()
    bad = ~torch.isfinite(p) & valid[:, None, None, :]
    if bool(bad.any()):
        raise AttentionError(f"{int(bad.sum())} sink probabilities are NaN/inf: the model's attention overflowed "
                             "(try dtype='float32', or check the weights)")
    return SinkRecord(p=p, valid=valid, layers=layers, sink_index=sink_index.cpu())


# ---------------------------------------------------------------------------------------
# sink mass, log-odds, S


def logit(p: np.ndarray | torch.Tensor, eps: float = _EPS):
    """log(p / (1 - p)) with p clipped to [eps, 1 - eps]."""
    if isinstance(p, torch.Tensor):
        p = p.clamp(eps, 1 - eps)
        return torch.log(p) - torch.log1p(-p)
    p = np.clip(p, eps, 1 - eps)
    return np.log(p) - np.log1p(-p)


@dataclass
class SinkResult:
    """Sink Strength and the per-head quantities it is made of."""

    S: float
    mass: np.ndarray          # [L, H] mean sink probability over prompts and queries
    logodds: np.ndarray       # [L, H] per-head log-odds (per `aggregate`)
    layers: list[int]         # layer index of each row of mass/logodds
    last_k_layers: int
    n_prompts: int
    n_queries: int
    seconds: float
    params: dict

    @property
    def S_layers(self) -> list[int]:
        return self.layers[-self.last_k_layers:]

    def summary(self) -> dict:
        return {"S": round(float(self.S), 4), "n_prompts": self.n_prompts, "n_queries": self.n_queries,
                "seconds": round(self.seconds, 3), **self.params}


def _unpack(lm_or_model, tokenizer):
    if hasattr(lm_or_model, "model") and hasattr(lm_or_model, "tokenizer"):
        return lm_or_model.model, (tokenizer or lm_or_model.tokenizer)
    return lm_or_model, tokenizer


def check_sink_params(model, last_k_layers: int, query_start: int, aggregate: str, sink: str,
                      max_tokens: int, batch_size: int) -> dict:
    """Validate the open choices of S; returns them as a dict (the `params` of the result)."""
    L = n_layers(model)
    return {
        "last_k_layers": check_int("last_k_layers", last_k_layers, 1, L),
        "query_start": check_int("query_start", query_start, 0, 4096),
        "aggregate": check_choice("aggregate", aggregate, AGGREGATES),
        "sink": check_choice("sink", sink, SINK_MODES),
        "max_tokens": check_int("max_tokens", max_tokens, 2, 1 << 16),
        "batch_size": check_int("batch_size", batch_size, 1, 4096),
    }


def sink_strength(lm, prompts: Sequence[str] | None = None, *, tokenizer=None, input_ids: Sequence[Sequence[int]] | None = None,
                  last_k_layers: int = 10, query_start: int = 1, aggregate: str = "mass_then_logodds",
                  sink: str = "first", max_tokens: int = 128, batch_size: int = 8, all_layers: bool = False,
                  padding_side: str = "right", method: str = "auto", short: str = "error") -> SinkResult:
    """Sink Strength S of a model over calibration prompts (or pre-tokenised input_ids).

    last_k_layers (K): S is the median over the heads of the last K layers.
    query_start (q0): queries at positions >= sink + q0 are averaged (q0 = 1 drops the sink's own row,
        where the sink attends to itself with probability 1).
    aggregate: 'mass_then_logodds' (paper: log-odds of the mean mass) or 'logodds_then_mean'
        (mean over queries of the per-query log-odds).
    sink: 'first' (first real token), 'bos' (first BOS token) or 'argmax' (heaviest key column).
    max_tokens: prompts are truncated to this many tokens.
    all_layers: record every layer (for maps); otherwise only the last K (faster).
    short: 'error' (a prompt with fewer than query_start + 2 tokens raises) or 'skip' (such prompts
        are dropped; `n_prompts` of the result says how many were used).
    """
    t0 = time.perf_counter()
    model, tok = _unpack(lm, tokenizer)
    params = check_sink_params(model, last_k_layers, query_start, aggregate, sink, max_tokens, batch_size)
    check_bool("all_layers", all_layers)
    L = n_layers(model)
    if input_ids is None:
        if tok is None:
            raise ParameterError("sink_strength needs prompts and a tokenizer, or input_ids")
        if prompts is None:
            raise ParameterError("parameter 'prompts' is missing; pass a list of strings (sinklib.data.load_prompts)")
        check_choice("short", short, ("error", "skip"))
        seqs = encode_prompts(tok, prompts, max_tokens=max_tokens, min_tokens=2 if short == "skip" else query_start + 2)
    else:
        seqs = [list(map(int, s))[:max_tokens] for s in input_ids]
        if not seqs or (short == "error" and min(len(s) for s in seqs) < query_start + 2):
            raise ParameterError(f"every input needs at least query_start + 2 = {query_start + 2} tokens "
                                 "(or pass short='skip')")
    if short == "skip":
        seqs = [s for s in seqs if len(s) >= query_start + 2]
        if not seqs:
            raise ParameterError(f"no prompt has query_start + 2 = {query_start + 2} tokens; lower query_start")
    pad_id = (getattr(tok, "pad_token_id", None) if tok is not None else None)
    pad_id = 0 if pad_id is None else pad_id
    layers = list(range(L)) if all_layers else list(range(L - last_k_layers, L))
    H = None
    sum_p = sum_z = None
    count = 0
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))  # length-sorted batches: less padding
    for b0 in range(0, len(order), batch_size):
        batch = [seqs[i] for i in order[b0:b0 + batch_size]]
        ids, att = pad_batch(batch, pad_id, padding_side)
        rec = record_sink(model, ids, att, layers=layers, sink=sink, query_start=query_start, method=method)
        p = rec.p.double()                                   # [B, Lrec, H, T]
        w = rec.valid[:, None, None, :].double()             # [B, 1, 1, T]
        if H is None:
            H = p.shape[2]
            sum_p = torch.zeros(len(layers), H, dtype=torch.float64)
            sum_z = torch.zeros(len(layers), H, dtype=torch.float64)
        sum_p += (p * w).sum(dim=(0, 3))
        sum_z += (logit(p) * w).sum(dim=(0, 3))
        count += int(rec.valid.sum())
    mass = (sum_p / count).numpy()
    z = logit(mass) if aggregate == "mass_then_logodds" else (sum_z / count).numpy()
    S = float(np.median(z[-last_k_layers:].ravel()))
    return SinkResult(S=S, mass=mass, logodds=z, layers=layers, last_k_layers=last_k_layers,
                      n_prompts=len(seqs), n_queries=count, seconds=time.perf_counter() - t0, params=params)


def plain_forward(lm, prompts: Sequence[str], *, tokenizer=None, max_tokens: int = 128, batch_size: int = 8,
                  padding_side: str = "right") -> float:
    """Seconds for plain SDPA forward passes over the same batches sink_strength uses (the baseline).

    Both this and the probe run the transformer trunk without the LM head.
    """
    model, tok = _unpack(lm, tokenizer)
    seqs = encode_prompts(tok, prompts, max_tokens=max_tokens)
    pad_id = tok.pad_token_id if tok.pad_token_id is not None else 0
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i]))
    dev = next(model.parameters()).device
    t0 = time.perf_counter()
    with torch.no_grad():
        for b0 in range(0, len(order), batch_size):
            ids, att = pad_batch([seqs[i] for i in order[b0:b0 + batch_size]], pad_id, padding_side)
            _trunk(model)(input_ids=ids.to(dev), attention_mask=att.to(dev))
    return time.perf_counter() - t0



# ---------------------------------------------------------------------------------------
# per-prompt statistics (resampling N and seeds without rerunning the model)


@dataclass
class PromptStats:
    """Sufficient statistics of S per prompt: sums over that prompt's valid queries."""

    sum_p: np.ndarray      # [P, L, H] sum of sink probabilities
    sum_z: np.ndarray      # [P, L, H] sum of per-query log-odds
    count: np.ndarray      # [P] number of valid queries
    layers: list[int]


def prompt_stats(lm, prompts: Sequence[str] | None = None, *, tokenizer=None,
                 input_ids: Sequence[Sequence[int]] | None = None, query_start: int = 1, sink: str = "first",
                 max_tokens: int = 128, batch_size: int = 8, layers: Sequence[int] | None = None,
                 method: str = "auto") -> PromptStats:
    """Per-prompt sums from one pass over all prompts; `strength_from_stats` then gives S of any subset."""
    model, tok = _unpack(lm, tokenizer)
    check_int("query_start", query_start, 0, 4096)
    check_int("max_tokens", max_tokens, 2, 1 << 16)
    if input_ids is None:
        if tok is None or prompts is None:
            raise ParameterError("prompt_stats needs prompts and a tokenizer, or input_ids")
        seqs = encode_prompts(tok, prompts, max_tokens=max_tokens, min_tokens=query_start + 2)
    else:
        seqs = [list(map(int, s))[:max_tokens] for s in input_ids]
    pad_id = getattr(tok, "pad_token_id", None) if tok is not None else None
    pad_id = 0 if pad_id is None else pad_id
    L = n_layers(model)
    layers = list(range(L)) if layers is None else list(layers)
    P = len(seqs)
    sum_p = sum_z = None
    count = np.zeros(P)
    order = sorted(range(P), key=lambda i: len(seqs[i]))
    for b0 in range(0, P, batch_size):
        idx = order[b0:b0 + batch_size]
        ids, att = pad_batch([seqs[i] for i in idx], pad_id)
        rec = record_sink(model, ids, att, layers=layers, sink=sink, query_start=query_start, method=method)
        p = rec.p.double()
        w = rec.valid[:, None, None, :].double()
        if sum_p is None:
            sum_p = np.zeros((P, len(layers), p.shape[2]))
            sum_z = np.zeros_like(sum_p)
        sum_p[idx] = (p * w).sum(dim=3).numpy()
        sum_z[idx] = (logit(p) * w).sum(dim=3).numpy()
        count[idx] = rec.valid.sum(dim=1).numpy()
    return PromptStats(sum_p=sum_p, sum_z=sum_z, count=count, layers=layers)


def strength_from_stats(stats: PromptStats, idx: Sequence[int] | None = None, last_k_layers: int = 10,
                        aggregate: str = "mass_then_logodds") -> float:
    """S over a subset of prompts (idx) from per-prompt statistics; equals sink_strength on that subset."""
    check_int("last_k_layers", last_k_layers, 1, len(stats.layers))
    check_choice("aggregate", aggregate, AGGREGATES)
    idx = np.arange(len(stats.count)) if idx is None else np.asarray(idx)
    n = stats.count[idx].sum()
    if aggregate == "mass_then_logodds":
        z = logit(stats.sum_p[idx].sum(0) / n)
    else:
        z = stats.sum_z[idx].sum(0) / n
    return float(np.median(z[-last_k_layers:].ravel()))


# ---------------------------------------------------------------------------------------
# what chapter 1 shows: full attention maps of one prompt, hidden-state norms, first-token variants


def attention_maps(model, input_ids: torch.Tensor, layers: Sequence[int]) -> torch.Tensor:
    """Full attention probabilities of one prompt for a few layers: [len(layers), H, T, T] (eager)."""
    prev = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            out = model(input_ids=input_ids[:1].to(next(model.parameters()).device), output_attentions=True)
    finally:
        model.set_attn_implementation(prev)
    return torch.stack([out.attentions[l][0].float().cpu() for l in layers])


def hidden_norms(model, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """L2 norm of every residual-stream state: [L + 1, B, T] (index 0 = embeddings)."""
    dev = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=input_ids.to(dev), attention_mask=None if attention_mask is None else attention_mask.to(dev),
                    output_hidden_states=True)
    return torch.stack([h.float().norm(dim=-1).cpu() for h in out.hidden_states])


FIRST_TOKEN_VARIANTS = ("default", "bos", "none", "word")


def encode_with_first(tokenizer, prompts: Sequence[str], first: str = "default", word: str = "Hello",
                      max_tokens: int = 128) -> list[list[int]]:
    """Token ids with a chosen first token: the tokenizer's default, BOS forced, no special tokens, or a word.

    'bos' prepends the BOS token (if the tokenizer does not already); 'none' strips special tokens;
    'word' puts `word` where BOS would be (so the sink candidate is an ordinary token).
    """
    check_choice("first", first, FIRST_TOKEN_VARIANTS)
    bos = tokenizer.bos_token_id
    out = []
    for p in prompts:
        plain = tokenizer(p, add_special_tokens=False)["input_ids"]
        if first == "default":
            ids = tokenizer(p)["input_ids"]
        elif first == "bos":
            if bos is None:
                raise ParameterError("this tokenizer has no BOS token; use first='none' or 'word'")
            ids = [bos] + plain
        elif first == "none":
            ids = plain
        else:
            ids = tokenizer(word, add_special_tokens=False)["input_ids"] + plain
        out.append(ids[:max_tokens])
    return out
