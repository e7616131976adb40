"""Batched greedy decoding with the KV cache, written for the suites' workload on a CPU.

Three things make it cheaper than `transformers`' `generate` on the same prompts, without changing what is
computed (each row's answer is the argmax continuation of its own prompt; only floating-point ties may move):

- the few-shot prefix that every prompt shares is run once, and its keys and values are copied into each
  batch's cache at the columns the left-padded layout puts them (`prime`);
- a row that has ended (end-of-sequence token, stop string) leaves the batch at once, so the remaining rows
  are not held at the batch's width until the longest row ends (`decode`);
- wider batches (`GENERATION_BATCH_SIZE`): a decoding step reads every weight once, the LM head included
  (262k rows for Gemma-3), whatever the number of rows, so more rows per step cost little more.

The layout is the one `generate` uses: row r is ``[pad ... pad][prompt]`` left-padded to the batch's longest
prompt, positions counted from the first real token, padded keys masked out.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from sinklib.core import progress
from sinklib.core.anatomy import pad_batch, positions

#: rows decoded together by the suites (wider than the likelihood batches: see the module docstring)
GENERATION_BATCH_SIZE = 32


def common_prefix(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the longest token prefix shared by every sequence, leaving each at least one token of its own."""
    if not seqs:
        return 0
    first, n = seqs[0], min(len(s) for s in seqs) - 1
    k = 0
    while k < n and all(s[k] == first[k] for s in seqs):
        k += 1
    return k


def _window(model: Any) -> int | None:
    """The smallest sliding window of the model's layers, or None when every layer attends to everything."""
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    w = getattr(cfg, "sliding_window", None)
    types = getattr(cfg, "layer_types", None)
    if not isinstance(w, int) or (types is not None and "sliding_attention" not in types):
        return None
    return w


def shared_length(model: Any, prompts: Sequence[Sequence[int]]) -> int:
    """The prefix `greedy` computes once: `common_prefix`, or 0 where it would fill a sliding-window layer's cache
    (that cache would then keep only the window's last keys before the batch's own tokens are run, and hooks
    that address keys by their column, as chapter 8's sink intervention does, would see shifted columns)."""
    n = common_prefix(prompts) if len(prompts) > 1 else 0
    w = _window(model)
    return 0 if w is not None and n >= w - 1 else n


def _cache(model: Any):
    from transformers import DynamicCache

    return DynamicCache(config=model.config)


def prefix_states(model: Any, prefix: Sequence[int], device: torch.device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Keys and values of `prefix` at every layer, each `[1, H_kv, P, D]` (every position kept, sliding or not)."""
    from transformers import DynamicCache

    if not prefix:
        return []
    cache = DynamicCache()  # no config: full layers, so sliding-window layers keep the whole prefix too
    ids = torch.tensor([list(prefix)], dtype=torch.long, device=device)
    model(input_ids=ids, attention_mask=torch.ones_like(ids), past_key_values=cache, use_cache=True, logits_to_keep=1)
    return [(layer.keys, layer.values) for layer in cache.layers]


def prime(model: Any, seqs: Sequence[Sequence[int]], states: list, n_prefix: int, pad: int, device: torch.device):
    """Prefill one batch whose rows all start with the same `n_prefix` tokens (their `states`, from
    `prefix_states`): returns (logits of the last position `[B, 1, V]`, cache, attention mask `[B, T]`,
    last positions `[B]`). The prefix's keys and values are copied, not recomputed, except where a row's
    padding pushes part of its prefix past column `n_prefix`."""
    ids, mask = pad_batch(seqs, pad, "left", device=device)
    pos = positions(mask)
    cache, P = _cache(model), n_prefix if states else 0
    if P:
        own = [len(s) - P for s in seqs]
        width = max(own)
        for li, (k, v) in enumerate(states):
            kb = k.new_zeros(len(seqs), k.shape[1], P, k.shape[3])
            vb = v.new_zeros(len(seqs), v.shape[1], P, v.shape[3])
            for r, n_own in enumerate(own):
                off = width - n_own  # this row's padding; its prefix starts here
                if off < P:
                    kb[r, :, off:] = k[0, :, :P - off]
                    vb[r, :, off:] = v[0, :, :P - off]
            cache.update(kb, vb, li)
    out = model(input_ids=ids[:, P:], attention_mask=mask, position_ids=pos[:, P:], past_key_values=cache,
                use_cache=True, logits_to_keep=1)
    return out.logits, cache, mask, pos[:, -1]


def _ended(tokenizer: Any, row: list[int], eos: set[int], stop: Sequence[str]) -> bool:
    if row[-1] in eos:
        return True
    return bool(stop) and any(s in tokenizer.decode(row, skip_special_tokens=True) for s in stop if s)


def decode(model: Any, tokenizer: Any, logits: torch.Tensor, cache: Any, mask: torch.Tensor, last: torch.Tensor,
           max_new_tokens: int, eos: Sequence[int], stop: Sequence[str] = ()) -> list[list[int]]:
    """Greedy continuation of a primed batch: each row's new token ids, up to and including the token that
    ended it (an `eos` id, or the token that completed a stop string), at most `max_new_tokens`. A row
    that ends leaves the batch (its cache rows are dropped)."""
    eos_set = set(int(e) for e in eos)
    alive = list(range(mask.shape[0]))
    rows: list[list[int]] = [[] for _ in alive]
    for step in range(max_new_tokens):
        nxt = logits[:, -1].float().argmax(-1)
        keep = []
        for j, (r, t) in enumerate(zip(alive, nxt.tolist())):
            rows[r].append(t)
            if not _ended(tokenizer, rows[r], eos_set, stop):
                keep.append(j)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(alive):
            sel = torch.tensor(keep, device=mask.device)
            cache.batch_select_indices(sel)
            mask, last, nxt = mask[sel], last[sel], nxt[sel]
            alive = [alive[j] for j in keep]
        mask = torch.cat([mask, mask.new_ones(len(alive), 1)], dim=1)
        last = last + 1
        logits = model(input_ids=nxt[:, None], attention_mask=mask, position_ids=last[:, None], past_key_values=cache,
                       use_cache=True).logits
    return rows


def balanced_width(n: int, batch_size: int) -> int:
    """Rows per batch: as few batches as `batch_size` allows, of (nearly) equal widths (72 rows at 32: 24, 24, 24)."""
    if n <= 0:
        return max(1, batch_size)
    batches = -(-n // batch_size)
    return -(-n // batches)


def greedy(model: Any, tokenizer: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, pad: int,
           eos: Sequence[int], batch_size: int = GENERATION_BATCH_SIZE, stop: Sequence[str] = (),
           share_prefix: bool = True) -> list[list[int]]:
    """New token ids of every prompt (input order): prompts batched longest first in batches of nearly equal
    widths (at most `batch_size` rows), the shared prefix run once."""
    device = next(model.parameters()).device
    n_prefix = shared_length(model, prompts) if share_prefix else 0
    states = prefix_states(model, prompts[0][:n_prefix], device) if n_prefix else []
    order = sorted(range(len(prompts)), key=lambda i: -len(prompts[i]))
    out: list[list[int]] = [[] for _ in prompts]
    width = balanced_width(len(order), batch_size)
    for b in range(0, len(order), width):
        idx = order[b:b + width]
        logits, cache, mask, last = prime(model, [prompts[i] for i in idx], states, n_prefix, pad, device)
        for i, row in zip(idx, decode(model, tokenizer, logits, cache, mask, last, max_new_tokens, eos, stop)):
            out[i] = row
        progress.advance(b + len(idx), len(order))
    return out
