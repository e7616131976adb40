"""The attention sink: a probe in transformers' attention registry, per-head sink mass, Sink Strength S.

Notation (paper section 3.2). For layer l, head h, query position i and sink key position s,

    p[l, h, i] = softmax_j( scaling * q_i . k_j  (+ mask) )[s]          (attention on the sink)
    m[l, h]    = mean over prompts and queries i >= s + q0 of p[l, h, i] (sink mass)
    z[l, h]    = log( m / (1 - m) )                                      (log-odds)
    S          = median over the last K layers and all heads of z[l, h]

The probe (`sinklib.core.probe`, re-exported here) is an attention function registered under ``PROBE_NAME``. It returns the same
attention output as SDPA and, for the layers being recorded, keeps only the sink column's
probability per query, ``[B, H, T]``: O(T) per head, never a T x T map for every layer.
It sees queries and keys after RoPE and after q_norm/k_norm, with the model's own masks
(sliding windows, padding) and its own ``scaling`` and ``softcap``. The tables of chapters 1 and 2 are read in
words by `sinklib.core.readings` (re-exported here).
"""
from __future__ import annotations

import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from sinklib.core.anatomy import n_layers, pad_batch, trunk
from sinklib.errors import AttentionError, ParameterError
from sinklib.core.models import MODEL_PARAMS
from sinklib.core.probe import (METHODS, PROBE_NAME, eager_sink_probs, probe_attention, register_probe, sink_probe)  # noqa: F401
from sinklib.core.params import COMMON, Dependent, check_bool, check_choice, check_int, choice, integer, list_of, text
from sinklib.core.readings import (aggregate_direction, first_token_reading, flips_text, layer_means_text,  # noqa: F401
    margin_note, ordering_flips, pair_margins, sign_note, swapped_pairs)

AGGREGATES = ("mass_then_logodds", "logodds_then_mean")
SINK_MODES = ("first", "bos", "argmax")
_EPS = 1e-6


# ---------------------------------------------------------------------------------------
# batching, sink detection, recording


_trunk = trunk  # kept for callers of the old private name


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
        trunk(model)(input_ids=input_ids, attention_mask=attention_mask)
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
        trunk(model)(input_ids=input_ids, attention_mask=attention_mask)
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
    uniform: float = float("nan")  # mean over the same queries of 1 / (keys each can see): uniform attention's mass

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


def _strength_inputs(tok, prompts: Sequence[str] | None, input_ids: Sequence[Sequence[int]] | None, *,
                     max_tokens: int, query_start: int, short: str) -> list[list[int]]:
    """The token ids `sink_strength` measures: the prompts encoded (or `input_ids` truncated), checked for length
    (`short='error'`) or with the too-short ones dropped (`short='skip'`)."""
    if input_ids is None:
        if tok is None:
            raise ParameterError("sink_strength needs prompts and a tokenizer, or input_ids")
        if prompts is None:
            raise ParameterError("parameter 'prompts' is missing; pass a list of strings (sinklib.core.data.load_prompts)")
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
    return seqs


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
    seqs = _strength_inputs(tok, prompts, input_ids, max_tokens=max_tokens, query_start=query_start, short=short)
    pad_id = (getattr(tok, "pad_token_id", None) if tok is not None else None)
    pad_id = 0 if pad_id is None else pad_id
    layers = list(range(L)) if all_layers else list(range(L - last_k_layers, L))
    H = None
    sum_p = sum_z = None
    count, sum_u = 0, 0.0
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
        sum_u += uniform_mass(att, rec.valid)
    mass = (sum_p / count).numpy()
    z = logit(mass) if aggregate == "mass_then_logodds" else (sum_z / count).numpy()
    S = strength_from_logodds(z, last_k_layers)
    return SinkResult(S=S, mass=mass, logodds=z, layers=layers, last_k_layers=last_k_layers,
                      n_prompts=len(seqs), n_queries=count, seconds=time.perf_counter() - t0, params=params,
                      uniform=sum_u / count)


def uniform_mass(attention_mask: torch.Tensor, valid: torch.Tensor) -> float:
    """The sink mass uniform attention would give, summed over the `valid` queries: 1 / (the real keys a query at
    position t sees, from the first real token to t), so a sink ratio compares with prompts of the lengths used."""
    pos = torch.arange(attention_mask.shape[1])[None, :]
    keys = (pos - first_real_index(attention_mask)[:, None] + 1).clamp(min=1).double()
    return float((valid.double() / keys).sum())


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
            trunk(model)(input_ids=ids.to(dev), attention_mask=att.to(dev))
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
    return strength_from_logodds(z, last_k_layers)


def strength_from_logodds(z, last_k_layers: int) -> float:
    """S from per-head log-odds z [L, H] (layers in order): the median over the heads of the last K layers.
    The one place this rule is written (`sink_strength`, `strength_from_stats`, chapter 7's pilot)."""
    return float(np.median(np.asarray(z)[-last_k_layers:].ravel()))


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


# ---------------------------------------------------------------------------------------
# the parameters of chapters 1 and 2


def prompt_count(name: str, value) -> int:
    """A number of calibration prompts: 1 .. all of `sinklib.core.data.load_prompts()`."""
    from sinklib.core.data import load_prompts

    return check_int(name, value, 1, len(load_prompts()))


def _pool_size(name: str, value, p: dict) -> int:
    from sinklib.core.data import load_prompts

    n_all = len(load_prompts())
    size = check_int(name, value, 0, n_all) or n_all
    if size < max(p["robust_n"]):
        raise ParameterError(f"parameter 'pool_size' got {size}; allowed: at least the largest robust_n "
                             f"({max(p['robust_n'])}), or 0 for all {n_all} prompts")
    return size


CHAPTER1_PARAMS = {**MODEL_PARAMS, "n_prompts": prompt_count, "seed": integer(), "max_tokens": integer(8, 4096),
                   "map_layers": list_of(check_int), "map_heads": integer(1, 64), "first_word": text(), **COMMON}
CHAPTER2_PARAMS = {
    **MODEL_PARAMS, "n_prompts": prompt_count, "seed": integer(), "last_k_layers": integer(1, 1000),
    "query_start": integer(0, 64), "aggregate": choice(AGGREGATES), "sink_mode": choice(SINK_MODES),
    "max_tokens": integer(8, 8192), "batch_size": integer(1, 512), "sens_last_k": list_of(integer(1, 1000)),
    "sens_query_start": list_of(integer(0, 64)), "sens_max_tokens": list_of(integer(8, 8192)),
    "robust_n": list_of(prompt_count), "robust_seeds": integer(1, 1000), "pool_size": Dependent(_pool_size),
    "pool_max_tokens": integer(8, 8192), "timing_repeats": integer(1, 100),
    "long_tokens": list_of(integer(16, 1 << 15)), **COMMON}
