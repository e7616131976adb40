"""A functional yardstick for a weight change: how far it moves the model's next-token distribution.

The random control of chapter 4 is matched to VL in the *norm* of the weight change. Two changes of the same
norm can do very different things to what the model says, so issue #29 asks for a second yardstick: the mean
KL divergence of the changed model's next-token distribution from the base model's, KL(base || changed), over
every real position of held-out text. The random control is then grown until it hurts, and the size at which
it moves the distribution as far as VL does is marked (`match_scale`).

    kls = next_token_kl(lm.model, {"base": base_sd, "vl": vl_sd, "random x4": r4_sd}, seqs)
    kls["vl"]["kl"], kls["vl"]["per_seq"]          # nats per position; one mean per sequence
    match_scale([1, 2, 4, 8], [kls[f"random x{k}"]["kl"] ...], kls["vl"]["kl"])

The model's weights are swapped in turn for every state (`load_state_dict`), batch by batch, so only one
batch of the reference's log-probabilities is held at a time; the model is left holding the reference state.
"""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from sinklib.core.anatomy import pad_batch
from sinklib.core.params import check_int
from sinklib.errors import ParameterError


def _logprobs(model: Any, ids: torch.Tensor, att: torch.Tensor) -> torch.Tensor:
    dev = next(model.parameters()).device
    with torch.no_grad():
        out = model(input_ids=ids.to(dev), attention_mask=att.to(dev))
    return torch.log_softmax(out.logits.double(), dim=-1).cpu()


def next_token_kl(model: Any, states: Mapping[str, Mapping[str, torch.Tensor]], seqs: Sequence[Sequence[int]], *,
                  ref: str = "base", batch_size: int = 4, pad_id: int = 0) -> dict[str, dict]:
    """KL(ref || state) of the next-token distributions, for every state of `states` other than `ref`, over
    every real position of the token id lists `seqs` (right-padded batches of `batch_size`; padded positions
    excluded). -> {name: {'kl' (mean nats per position), 'per_seq' (mean per sequence), 'n_tokens'}}."""
    if ref not in states:
        raise ParameterError(f"next_token_kl: the reference state {ref!r} is not among the states "
                             f"{sorted(states)}; pass it (the base model's state dict) or name another with ref=")
    batch_size = check_int("batch_size", batch_size, 1)
    seqs = [list(map(int, s)) for s in seqs]
    if not seqs or min(map(len, seqs)) < 1:
        raise ParameterError("next_token_kl needs at least one non-empty token sequence")
    names = [n for n in states if n != ref]
    per_seq: dict[str, list[float]] = {n: [] for n in names}
    for b0 in range(0, len(seqs), batch_size):
        ids, att = pad_batch(seqs[b0:b0 + batch_size], pad_id, "right")
        model.load_state_dict(states[ref])
        lp_ref = _logprobs(model, ids, att)
        mask = att.bool()
        for n in names:
            model.load_state_dict(states[n])
            lp = _logprobs(model, ids, att)
            kl = (lp_ref.exp() * (lp_ref - lp)).sum(-1)                     # [B, T]
            per_seq[n] += [float(kl[r][mask[r]].mean()) for r in range(len(ids))]
    model.load_state_dict(states[ref])
    lengths = np.array([len(s) for s in seqs], dtype=float)
    return {n: {"kl": float(np.dot(per_seq[n], lengths) / lengths.sum()), "per_seq": per_seq[n],
                "n_tokens": int(lengths.sum())} for n in names}


def match_scale(scales: Sequence[float], values: Sequence[float], target: float) -> float | None:
    """The size at which a quantity that grows with the size (for example the random control's KL at
    `scales` times VL's norm) reaches `target` (VL's own value): linear interpolation in log-log between the
    two sizes that bracket it; exactly a measured size when one hits it; None when `target` lies outside the
    measured range (grow the control further, or start smaller). Sizes are sorted; values must be positive."""
    s = np.asarray(scales, dtype=float)
    v = np.asarray(values, dtype=float)
    if s.shape != v.shape or s.size < 1:
        raise ParameterError(f"match_scale needs one value per size; got {s.size} sizes and {v.size} values")
    if (s <= 0).any() or (v <= 0).any() or not math.isfinite(target) or target <= 0:
        raise ParameterError("match_scale works in log-log: sizes, values and the target must be positive and finite")
    order = np.argsort(s)
    s, v = s[order], v[order]
    hit = np.isclose(v, target, rtol=1e-12, atol=0)
    if hit.any():
        return float(s[hit][0])
    for i in range(len(s) - 1):
        lo, hi = sorted((v[i], v[i + 1]))
        if lo <= target <= hi:
            f = (math.log(target) - math.log(v[i])) / (math.log(v[i + 1]) - math.log(v[i]))
            return float(math.exp(math.log(s[i]) + f * (math.log(s[i + 1]) - math.log(s[i]))))
    return None


def yardstick_rows(kls: Mapping[str, Mapping], sizes: Mapping[str, float] | None = None) -> list[dict]:
    """One row per state of `next_token_kl`'s result: condition, size (from `sizes`, for example the random
    control's multiples of VL's norm), mean KL, the smallest and largest per-sequence mean (how much the
    sequences disagree) and the number of positions."""
    rows = []
    for n, r in kls.items():
        rows.append({"condition": n, "size": (sizes or {}).get(n, np.nan), "KL (nats/position)": r["kl"],
                     "per-sequence min": min(r["per_seq"]), "per-sequence max": max(r["per_seq"]),
                     "positions": r["n_tokens"]})
    return rows


__all__ = ["next_token_kl", "match_scale", "yardstick_rows"]
