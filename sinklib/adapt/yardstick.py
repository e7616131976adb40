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


# bump when what `pair_kl` computes changes (its cached values are then recomputed)
KL_VERSION = 1


def pair_kl(lm: Any, pair: Any, conditions: Sequence[str] = ("vl",), scales: Sequence[float] = (), *,
            seqs: Sequence[Sequence[int]], batch_size: int = 4, refresh: bool = False) -> dict[str, dict]:
    """`next_token_kl` of a chapter-4 pair: KL(base || condition) for each of `conditions` (states of the pair)
    and for the random control at each of `scales` times VL's norm (`isolate.scaled_name`: 'random x4'; each
    scaled state exists only while it is measured), over the token id lists `seqs` (the perplexity suite's
    held-out documents: `evals.inputs.suite_inputs(tok, 'perplexity', n)`). Each value is cached by the pair's
    parameters, the condition and the sequences, so a rerun reads no weights. -> {condition: next_token_kl's row}."""
    from sinklib.adapt.isolate import scaled_name
    from sinklib.core import cache
    from sinklib.vl import scaled_change

    seqs = [list(map(int, s)) for s in seqs]
    tok = getattr(lm, "tokenizer", None)
    pad = getattr(tok, "pad_token_id", None)
    pad = pad if pad is not None else (getattr(tok, "eos_token_id", None) or 0)
    todo = [(c, None) for c in conditions] + [(scaled_name(k), float(k)) for k in scales]
    for c, k in todo:
        if k is None and c not in pair.states:
            raise ParameterError(f"pair_kl: the pair has no condition {c!r} (it has {sorted(pair.states)}); "
                                 "name one it trained, or give the random control's sizes as scales=")
    if any(k is not None for _, k in todo) and "random" not in pair.states:
        raise ParameterError("pair_kl: scales= needs the pair's random control ('random'), which it lacks")
    out = {}
    for c, k in todo:
        def compute(c=c, k=k) -> dict:
            base = pair.states["base"]
            state = pair.states[c] if k is None else scaled_change(base, pair.states["random"], k)
            return next_token_kl(lm.model, {"base": base, c: state}, seqs, batch_size=batch_size, pad_id=pad)[c]

        key = {"kind": "next-token KL", "pair": dict(pair.params), "condition": c, "seqs": cache.key({"s": seqs}),
               "version": KL_VERSION}
        out[c] = cache.cached_json(key, compute, refresh=refresh)
    return out


def matched_size(kls: Mapping[str, Mapping], scales: Sequence[float], target: str = "vl") -> float | None:
    """The random control's size (multiple of VL's norm) at which its KL reaches `target`'s (`match_scale` over
    `pair_kl`'s 'random xK' rows; 'random' counts as 1x where present); None outside the sizes measured."""
    from sinklib.adapt.isolate import scaled_name

    sizes = sorted({float(k) for k in scales} | ({1.0} if "random" in kls else set()))
    sizes = [k for k in sizes if scaled_name(k) in kls]
    if target not in kls:
        raise ParameterError(f"matched_size: no KL for {target!r} among {sorted(kls)}")
    if not sizes:
        raise ParameterError("matched_size needs the random control's KL at one size at least")
    return match_scale(sizes, [max(kls[scaled_name(k)]["kl"], 1e-300) for k in sizes], kls[target]["kl"])


def round_size(k: float, digits: int = 2) -> float:
    """`k` to `digits` significant digits (a readable condition name for the KL-matched random control)."""
    if not (math.isfinite(k) and k > 0):
        raise ParameterError(f"round_size needs a positive finite size, got {k!r}")
    return float(f"{k:.{digits}g}")


def kl_frame(kls_by: Mapping[str, Mapping[str, Mapping]], scales: Sequence[float]):
    """`yardstick_rows` of every model as the chapter shows them: one row per model and condition, the random
    control's size as 'Kx' ('-' for a trained condition), the KLs to three significant digits."""
    import pandas as pd

    from sinklib.adapt.isolate import scaled_name

    sizes = {scaled_name(k): float(k) for k in [1.0, *scales]}
    rows = [{"model": m, **r} for m, kls in kls_by.items() for r in yardstick_rows(kls, sizes)]
    out = pd.DataFrame(rows)
    out["size"] = [f"{k:g}x" if k == k else "-" for k in out["size"]]
    for c in ("KL (nats/position)", "per-sequence min", "per-sequence max"):
        out[c] = [f"{v:.3g}" for v in out[c]]
    return out.rename(columns={"size": "size (x VL's norm)"})


def kl_sentence(kls_by: Mapping[str, Mapping[str, Mapping]], scales: Sequence[float]) -> str:
    """Per model: VL's KL from the base model, the random control's at the largest size, and the size at which
    the random control matches VL on this yardstick (or that no size measured does)."""
    from sinklib.adapt.isolate import scaled_name

    parts = []
    for m, kls in kls_by.items():
        k = matched_size(kls, scales)
        big = max(float(s) for s in scales if scaled_name(s) in kls)
        text = (f"{m}: VL moves the next-token distribution by {kls['vl']['kl']:.2g} nats per position "
                f"(KL from the base model), the random control at {big:g}x VL's norm by "
                f"{kls[scaled_name(big)]['kl']:.2g}; ")
        text += (f"the random control matches VL on this yardstick at {k:.3g}x VL's norm" if k is not None else
                 "no size measured matches VL on this yardstick")
        parts.append(text)
    return ". ".join(parts)


__all__ = ["next_token_kl", "match_scale", "yardstick_rows", "pair_kl", "matched_size", "round_size", "kl_frame",
           "kl_sentence"]
