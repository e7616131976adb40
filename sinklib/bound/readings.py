"""Chapter 3's findings on real layers in words (its prose comes from these, for any number of models): how the
real layers' input-scale slopes compare with their variant's random layers (`sweep_note`), the sink token's norm in
the residual stream and at the projections' input (`norms_note`), and whether the bound holds on real weights, how
loose it is and how sensitive each model's sink gaps are (`real_note`)."""
from __future__ import annotations

import math

import pandas as pd

#: a real layer "follows" its variant when its slope is within this of the random layers' slope
SLOPE_TOLERANCE = 0.25
LABELS = {"none": "none", "per_head": "per-head", "layerwise": "layerwise"}


def sweep_note(sweep: pd.DataFrame, slopes: pd.DataFrame) -> str:
    """sweep: rows {source, variant, bias (real layers: whether q_proj / k_proj carry a bias)}, random sources named
    "random <variant label>"; slopes: indexed by source with column slope_change. -> one sentence per real layer
    group: which follow their variant's random layers and which do not (with the slopes)."""
    real = sweep[~sweep.source.astype(str).str.startswith("random")].drop_duplicates("source")
    if real.empty:
        return ""
    follow, other = [], []
    for _, r in real.iterrows():
        ref_src = f"random {LABELS.get(r.variant, r.variant)}"
        slope = float(slopes.loc[r.source, "slope_change"])
        if ref_src in slopes.index and abs(slope - float(slopes.loc[ref_src, "slope_change"])) <= SLOPE_TOLERANCE:
            follow.append(f"{r.source} {slope:.2f}")
        else:
            ref = (f" against {float(slopes.loc[ref_src, 'slope_change']):.2f} for the random {ref_src[7:]} layers"
                   if ref_src in slopes.index else "")
            why = ", with a projection bias" if bool(r.get("bias", False)) else ""
            other.append(f"{r.source} {slope:.2f}{ref}{why}")
    out = f"The real layers that follow their variant: {', '.join(follow) if follow else 'none'}."
    if other:
        out += f" Those that do not: {'; '.join(other)}."
    return out


def norms_note(ratios: dict[str, dict[str, float]]) -> str:
    """ratios: model -> {residual_max, qk_input_max, qk_input_median} (sink token norm / median other token norm,
    over layers and prompts). -> the largest ratio in the residual stream and at the projections' input, per model."""
    parts = [f"{m} up to {r['residual_max']:.0f} in the residual stream and up to {r['qk_input_max']:.2f} at the "
             f"input of the projections (median {r['qk_input_median']:.2f})" for m, r in ratios.items()]
    return "Sink token norm over the median other token's: " + "; ".join(parts) + "."


def real_note(summary: dict[str, dict], sensitivity: dict[str, dict[str, float]], norms: dict[str, str]) -> str:
    """summary: `real_models_summary`; sensitivity: model -> {median, bound_median} (per unit of relative weight
    change, medians over layers); norms: model -> QK-norm variant. -> violations, how loose the bound is and each
    model's median sensitivity, with where the per-head models stand among the others."""
    viol = sum(s["violations"] for s in summary.values())
    n = sum(s["gap_values"] for s in summary.values())
    held = ("No model breaks its bound" if viol == 0 else f"{viol:,} gap values break their bound")
    loose = {m: s["bound_median"] / s["median"] for m, s in sensitivity.items() if s["median"] > 0}
    lo, hi = min(loose.values()), max(loose.values())
    order = sorted(sensitivity, key=lambda m: sensitivity[m]["median"])
    each = ", ".join(f"{m} ({LABELS.get(norms.get(m, ''), '?')}) {sensitivity[m]['median']:.2f}" for m in order)
    out = (f"{held} ({viol:,} violations in {n:,} gap values). The median bound is {lo:.0f} to {hi:.0f} times the "
           f"median actual change, depending on the model ({math.log10(lo):.1f} to {math.log10(hi):.1f} orders of "
           f"magnitude). Median sensitivity of the sink log-odds per unit of relative change, lowest first: {each}.")
    ph = [m for m in order if norms.get(m) == "per_head"]
    rest = [m for m in order if norms.get(m) != "per_head"]
    if ph and rest:
        where = ("less sensitive than every model without it" if order.index(ph[-1]) < order.index(rest[0]) else
                 "more sensitive than every model without it" if order.index(ph[0]) > order.index(rest[-1]) else
                 "between the models without it")
        out += f" The per-head QK-norm model{'s are' if len(ph) > 1 else ' is'} {where}."
    return out
