"""Chapter 8's mass-matched control, matched within a stated tolerance.

The control removes as much attention as the sink intervention does, but not from the first token. The unit
of comparison is the **attention mass removed per query, summed over the intervened heads and divided by the
dose's number of sink heads k** (for `remove` on k heads it is the mean sink mass taken per head and query).
Sink-heavy heads hold less attention on their other keys than on the sink, so the sink heads alone cannot
give up as much: the control takes from more heads until the mass matches. One knob x orders the choices:

- x in [0, 1]: the k sink heads each lose the share x of their non-sink attention (most-attended keys first);
- x in (1, 1 + n]: the k sink heads lose all of it, and so do the first floor(x - 1) heads of `candidate_heads`
  (outside the sink set: the considered layers first, then the nearest other layers; in each layer the least
  sink mass, the most attention to give, first), the next one the share x - 1 - floor(x - 1).

`match_control` measures the sink condition's removed mass on the calibration prompts, then searches x
(integer search over the added heads, then bisection) until the matched control's removed mass is within
`tolerance` of it. Both are measured again by the evaluation itself (`sinklib.causal.evaluate`); `flag`
compares those, and a matched condition outside the tolerance is not tested.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from sinklib.core import intervene
from sinklib.core.anatomy import pad_batch
from sinklib.core.cache import cached_json
from sinklib.core.params import check_float
from sinklib.core.sink import encode_prompts
from sinklib.errors import ParameterError

#: |matched - sink| of the removed mass (per query, in units of the dose's k heads) allowed, per model and dose
TOLERANCE = 0.05
MATCH_VERSION = 2  # 2: measured without padding


def removed_mass(model, seqs: Sequence[Sequence[int]], heads: Mapping[int, Sequence[int]], k: int, *,
                 mode: str = "remove", take: Mapping[int, Mapping[int, float]] | None = None, pad_id: int = 0,
                 batch_size: int = 1) -> float:
    """Attention mass removed per query, summed over the intervened heads, divided by `k`, on the token id
    lists `seqs` (the sink is each row's first token). batch_size 1 (the default) pads nothing: padded query
    rows would be counted as queries and move the mass with the pad token's id. Runs the decoder alone
    (`base_model`): the LM head (Gemma-3's 262k rows, most of that model's arithmetic) does not change the mass."""
    n = sum(len(v) for v in heads.values())
    if not n:
        return 0.0
    body = getattr(model, "base_model", model)  # the decoder without its LM head: the logits are not needed
    with torch.no_grad(), intervene.sink_intervention(model, heads, mode=mode, take=take) as plan:
        for b0 in range(0, len(seqs), batch_size):
            ids, att = pad_batch(seqs[b0:b0 + batch_size], pad_id, "right")
            dev = next(model.parameters()).device
            body(input_ids=ids.to(dev), attention_mask=att.to(dev))
    return plan.mean_taken * n / k


def candidate_heads(mass, layers: Sequence[int], exclude: Mapping[int, Sequence[int]]) -> list[tuple[int, int]]:
    """The heads the control may add, in order: outside `exclude`, the considered `layers` first, then the other
    layers by their distance to them (nearest first, the later of two as near); among the considered layers and
    within another layer, the least sink mass [L, H] first."""
    m = np.asarray(mass, dtype=float)
    inside = set(int(l) for l in layers)
    skip = {(int(l), int(h)) for l, hs in exclude.items() for h in hs}

    def dist(l: int) -> int:
        return 0 if l in inside else min(abs(l - x) for x in inside)

    pairs = [(l, h) for l in range(m.shape[0]) for h in range(m.shape[1]) if (l, h) not in skip]
    return sorted(pairs, key=lambda p: (dist(p[0]), 0 if p[0] in inside else -p[0], m[p], p))


def knob_plan(top: Mapping[int, Sequence[int]], extras: Sequence[tuple[int, int]],
              x: float) -> tuple[dict[int, list[int]], dict[int, dict[int, float]]]:
    """(heads, take) of the control at knob `x` (see the module's docstring)."""
    heads = {int(l): sorted(int(h) for h in hs) for l, hs in top.items() if len(hs)}
    if x <= 1:
        return heads, {l: {h: float(x) for h in hs} for l, hs in heads.items()}
    j = int(np.floor(x - 1))
    frac = float(x - 1 - j)
    take: dict[int, dict[int, float]] = {}
    for i, (l, h) in enumerate(extras[:j + (frac > 0)]):
        heads.setdefault(l, []).append(h)
        if i == j:
            take.setdefault(l, {})[h] = frac
    return {l: sorted(hs) for l, hs in sorted(heads.items())}, take


def _search(f, target: float, n: int, tolerance: float, steps: int) -> float:
    """The knob x whose removed mass f(x) is nearest `target`: integer search over the added heads, then
    bisection (stops within tolerance / 2 or after `steps`)."""
    seen: dict[float, float] = {}

    def g(x: float) -> float:
        if x not in seen:
            seen[x] = f(x)
        return seen[x]

    lo, hi = 0.0, 1.0
    if g(1.0) < target:
        if n == 0 or g(1.0 + n) < target:
            return 1.0 + n
        a, b = 0, n  # g(1 + a) < target <= g(1 + b)
        while b - a > 1:
            mid = (a + b) // 2
            a, b = (a, mid) if g(1.0 + mid) >= target else (mid, b)
        lo, hi = 1.0 + a, 1.0 + b
    for _ in range(steps):
        if abs(g(hi) - target) <= tolerance / 2:
            break
        x = (lo + hi) / 2
        lo, hi = (x, hi) if g(x) < target else (lo, x)
    return min(seen, key=lambda x: (abs(seen[x] - target), x))


def match_control(model, seqs: Sequence[Sequence[int]], mass, layers: Sequence[int], top: Mapping[int, Sequence[int]],
                  *, tolerance: float = TOLERANCE, steps: int = 8, pad_id: int = 0) -> dict:
    """The matched control of the sink heads `top`, searched on the token id lists `seqs`. -> {'heads', 'take',
    'extra' (heads added), 'target' and 'achieved' (removed mass, `removed_mass`), 'within' (|difference| <=
    tolerance on these prompts)}."""
    tolerance = check_float("tolerance", tolerance, 0.0, 1.0)
    k = sum(len(v) for v in top.values())
    extras = candidate_heads(mass, layers, top)
    target = removed_mass(model, seqs, top, k, pad_id=pad_id)

    def f(x: float) -> float:
        h, t = knob_plan(top, extras, x)
        return removed_mass(model, seqs, h, k, mode="remove_matched", take=t, pad_id=pad_id)

    x = _search(f, target, len(extras), tolerance, steps)
    heads, take = knob_plan(top, extras, x)
    achieved = f(x)
    return {"heads": heads, "take": take, "extra": sum(map(len, heads.values())) - k, "x": x, "target": target,
            "achieved": achieved, "within": bool(abs(achieved - target) <= tolerance)}


def match_plans(lm: Any, prompts: Sequence[str] | None, plans: Sequence[Mapping], mass, layers: Sequence[int], *,
                max_tokens: int = 64, tolerance: float = TOLERANCE,
                seqs: Sequence[Sequence[int]] | None = None) -> list[dict]:
    """`sinklib.causal.dose_plans` rows with each `matched` row matched (`match_control`, cached under `causal/`)
    on `prompts` (encoded, at most `max_tokens` each) or on the token id lists `seqs` (for example the suites'
    own inputs, `sinklib.evals.inputs.inputs_of`; give one of the two) with `lm` (.model, .tokenizer, .name,
    .weights_sha256): its heads become the matched set, 'take' the shares and 'match' the search's result."""
    tok = lm.tokenizer
    if (prompts is None) == (seqs is None):
        raise ParameterError("match_plans needs the prompts or the token sequences (seqs) to match on, not both; "
                             "for the suites' own inputs pass seqs=sinklib.evals.inputs.inputs_of(lm.tokenizer, "
                             "eval_n, seed=seed)")
    if seqs is None:
        seqs = encode_prompts(tok, prompts, max_tokens=max_tokens, min_tokens=3)
    seqs = [[int(t) for t in s] for s in seqs]
    if not seqs or min(map(len, seqs)) < 2:
        raise ParameterError("match_plans got an empty sequence list or a sequence of fewer than 2 tokens; the "
                             "matched control needs queries after the first token")
    pad = getattr(tok, "pad_token_id", None) or 0
    out = []
    for p in plans:
        p = dict(p)
        if p["control"] == "matched":
            top = {int(l): list(hs) for l, hs in p["heads"].items()}
            key = {"kind": "matched control", "model": lm.name, "weights": lm.weights_sha256, "version": MATCH_VERSION,
                   "heads": {str(l): sorted(hs) for l, hs in sorted(top.items())}, "seqs": seqs, "layers": list(layers),
                   "mass": np.round(np.asarray(mass, dtype=float), 6).tolist(), "tolerance": float(tolerance)}

            def compute(top=top) -> dict:
                r = match_control(lm.model, seqs, mass, layers, top, tolerance=tolerance, pad_id=pad)
                return {**r, "heads": {str(l): h for l, h in r["heads"].items()},
                        "take": {str(l): {str(h): s for h, s in t.items()} for l, t in r["take"].items()}}

            r = cached_json(key, compute, folder="causal")
            p["heads"] = {int(l): list(h) for l, h in r["heads"].items()}
            p["take"] = {int(l): {int(h): float(s) for h, s in t.items()} for l, t in r["take"].items()}
            p["match"] = {k: r[k] for k in ("extra", "x", "target", "achieved", "within")}
        out.append(p)
    return out


def flag(table, tolerance: float = TOLERANCE):
    """`sinklib.causal.dose_response`'s table with 'mass_diff' (removed mass of the row minus the sink
    condition's at the same model and dose) and 'matched_ok' (False for a matched row outside `tolerance`, or
    without a sink row to match; True elsewhere)."""
    t = table.copy()
    sink = t[t.control == "sink"].groupby(["model", "dose"]).mass_removed.first()
    ref = [sink.get((m, d), np.nan) for m, d in zip(t.model, t.dose)]
    t["mass_diff"] = t.mass_removed - np.asarray(ref, dtype=float)
    t["matched_ok"] = [c != "matched" or bool(abs(x) <= tolerance) for c, x in zip(t.control, t.mass_diff)]
    return t


def mass_table(table, tolerance: float = TOLERANCE):
    """One row per (model, dose): the removed mass of each condition (per query, in units of the dose's sink
    heads; the random sets after the first as their mean), the heads the matched control intervened on, its difference from the sink condition and whether it
    is within `tolerance` (else 'no: not tested')."""
    import pandas as pd

    t = table if "mass_diff" in table else flag(table, tolerance)
    rows = []
    for (m, d), g in t.groupby(["model", "dose"], sort=False):
        by = g.groupby("control").first()
        row = {"model": m, "dose": d, "k": int(by.k.iloc[0])}
        row.update({c: round(float(by.loc[c, "mass_removed"]), 3) for c in ("sink", "random", "matched") if c in by.index})
        more = [c for c in by.index if c.startswith("random ")]  # the further random sets ('random 2', ...)
        if more:
            name = "random 2" if len(more) == 1 else f"random 2-{len(more) + 1} (mean)"  # the further sets' mean
            row[name] = round(float(by.loc[more, "mass_removed"].mean()), 3)
        if "matched" in by.index:
            r = by.loc["matched"]
            row.update({"matched heads": int(r.n_heads), "matched - sink": round(float(r.mass_diff), 3),
                        f"within ±{tolerance:g}": "yes" if r.matched_ok else "no: not tested"})
        rows.append(row)
    return pd.DataFrame(rows).set_index(["model", "dose"])


def sentence(table, tolerance: float = TOLERANCE) -> str:
    """`flag`ged rows in words, per model: the doses at which the matched control is within the tolerance of the
    sink condition's removed mass (the largest |difference|), and those at which it is not tested."""
    t = table if "mass_diff" in table else flag(table, tolerance)
    t = t[t.control == "matched"]
    parts = []
    for m, g in t.groupby("model", sort=False):
        by = g.groupby("dose").first()
        ok, bad = by[by.matched_ok], by[~by.matched_ok]
        part = (f"{m}: within ±{tolerance:g} at dose {', '.join(f'{d:g}' for d in ok.index)} (largest |difference| "
                f"{ok.mass_diff.abs().max():.3f})" if len(ok) else f"{m}: within ±{tolerance:g} at no dose")
        if len(bad):
            part += (f", not tested at dose {', '.join(f'{d:g}' for d in bad.index)} (differences "
                     f"{', '.join(f'{x:+.3f}' for x in bad.mass_diff)})")
        parts.append(part)
    return "; ".join(parts) if parts else "no matched control in this run"
