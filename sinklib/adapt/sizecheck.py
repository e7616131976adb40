"""Chapter 4's four predictions for the random control's sizes, judged against a run by one rule each.

The predictions were written into the chapter before the sizes beyond 8x and the functional yardstick first ran
(session 40): (1) VL moves the next-token distribution at least ten times as far as the random change of its norm;
(2) the random control's KL grows about as the square of its size (log-log slope 1.7 to 2.3 here), so it reaches
VL's KL between 4x and 64x; (3) at that KL-matched size the random control's strict-format change lies inside
VL's paired 95 % interval (same seed, same items); (4) the random change first hurts outside the noise (the
strict-format mean or knowledge: paired interval wholly below zero) at 32x or 64x.

Each row's outcome is "as predicted", "not as predicted" or "not tested" (the quantity it needs was not
measured: a model without the random sizes, or no size that matches VL's KL)."""
from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from sinklib.adapt.isolate import first_harm, scaled_name
from sinklib.adapt.yardstick import matched_size
from sinklib.core.numbers import interval, signed
from sinklib.errors import ParameterError

RATIO_MIN = 10.0
SLOPE_SPAN = (1.7, 2.3)
MATCH_SPAN = (4.0, 64.0)
HARM_SIZES = (32.0, 64.0)
HARM_METRICS = ("strict-format mean", "knowledge acc")
#: the display's name of the rule column: the words were written before the run, the tolerances after it
RULE_COLUMN = "rule applied (tolerances of 2 and 3 set after the run)"


def kl_slope(kls: Mapping[str, Mapping], scales: Sequence[float]) -> float | None:
    """Least-squares slope of log KL against log size over the random control's measured sizes (1x included
    where present); None with fewer than two sizes."""
    sizes = sorted({float(k) for k in scales} | {1.0})
    pts = [(k, kls[scaled_name(k)]["kl"]) for k in sizes if scaled_name(k) in kls and kls[scaled_name(k)]["kl"] > 0]
    if len(pts) < 2:
        return None
    x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
    return float(np.polyfit(x, y, 1)[0])


def _row(model: str, number: int, said: str, measured: str, ok: bool | None) -> dict:
    outcome = "not tested" if ok is None else ("as predicted" if ok else "not as predicted")
    return {"model": model, "prediction": number, "said": said, "measured": measured, "outcome": outcome}


def _kl_rows(m: str, kls: Mapping[str, Mapping], scales: Sequence[float]) -> list[dict]:
    ratio = kls["vl"]["kl"] / kls["random"]["kl"] if kls.get("random", {}).get("kl", 0) > 0 else None
    slope, k = kl_slope(kls, scales), matched_size(kls, scales)
    two_ok = None if slope is None else (SLOPE_SPAN[0] <= slope <= SLOPE_SPAN[1]
                                         and k is not None and MATCH_SPAN[0] <= k <= MATCH_SPAN[1])
    matched = f"matches VL at {k:.3g}x" if k is not None else "matches VL at no size measured"
    return [_row(m, 1, f"VL's KL >= {RATIO_MIN:g} x the 1x random control's",
                 "no 1x random KL" if ratio is None else f"{ratio:.0f} times", None if ratio is None else ratio >= RATIO_MIN),
            _row(m, 2, f"KL slope {SLOPE_SPAN[0]:g}-{SLOPE_SPAN[1]:g} in log-log; matches VL between "
                 f"{MATCH_SPAN[0]:g}x and {MATCH_SPAN[1]:g}x",
                 "fewer than two sizes" if slope is None else f"slope {slope:.2f}; {matched}", two_ok)]


def _curve_rows(m: str, g: pd.DataFrame, k: float | None, vl: Mapping[str, float] | None) -> list[dict]:
    rows = []
    at = g[(g.metric == "strict-format mean") & np.isclose(g.scale, k)] if k is not None else g.iloc[:0]
    if k is None or at.empty or vl is None:
        rows.append(_row(m, 3, "at the KL-matched size, not distinguishable from VL (inside VL's strict-format interval, training seed 0)",
                         "no KL-matched size evaluated", None))
    else:
        c = float(at.change.iloc[0])
        rows.append(_row(m, 3, "at the KL-matched size, not distinguishable from VL (inside VL's strict-format interval, training seed 0)",
                         f"{signed(c)} at {k:g}x against VL's {interval(vl['change'], vl['lo'], vl['hi'])}",
                         vl["lo"] <= c <= vl["hi"]))
    firsts = [first_harm(g, metric).get(m) for metric in HARM_METRICS]
    hit = [f for f in firsts if f is not None]
    first = min(hit) if hit else None
    rows.append(_row(m, 4, f"first harm (strict-format mean or knowledge) at {HARM_SIZES[0]:g}x or {HARM_SIZES[1]:g}x",
                     f"first at {first:g}x" if first is not None else "at no size measured",
                     first is not None and any(math.isclose(first, h) for h in HARM_SIZES)))
    return rows


def judge(kls_by: Mapping[str, Mapping[str, Mapping]], curve: pd.DataFrame | None, vl_strict: pd.DataFrame,
          scales: Sequence[float], kl_sizes: Mapping[str, float | None]) -> pd.DataFrame:
    """One row per model of `kls_by` and prediction: what it said, what the run measured, the outcome.
    `curve`: `isolate.random_sizes`; `vl_strict`: VL's strict-format mean rows of `pairs.paired_table` (model,
    change, lo, hi); `kl_sizes`: {model: the KL-matched size as evaluated (`yardstick.round_size`), or None}."""
    if curve is None:   # no model ran the random sizes: predictions (3) and (4) are not tested
        curve = pd.DataFrame(columns=["model", "scale", "metric", "change", "lo", "hi"])
    missing = {"model", "change", "lo", "hi"} - set(vl_strict.columns)
    if missing:
        raise ParameterError(f"judge: vl_strict lacks the columns {sorted(missing)}; pass the VL rows of "
                             "pairs.paired_table with metric 'strict-format mean'")
    vl_by = {r.model: {"change": r.change, "lo": r.lo, "hi": r.hi} for r in vl_strict.itertuples()}
    rows = []
    for m, kls in kls_by.items():
        rows += _kl_rows(m, kls, scales)
        rows += _curve_rows(m, curve[curve.model == m], kl_sizes.get(m), vl_by.get(m))
    return pd.DataFrame(rows, columns=["model", "prediction", "said", "measured", "outcome"])


def display(frame: pd.DataFrame):
    """`judge`'s table as the chapter shows it: one row per model and prediction, no cell cut short."""
    from sinklib.plots import Table

    shown = frame.rename(columns={"said": RULE_COLUMN, "measured": "this run measured"})
    return Table(shown.set_index(["model", "prediction"]),
                 "Outcome by the rule of sinklib.adapt.sizecheck; intervals are paired 95 % bootstrap intervals "
                 "(points of the strict-format mean), sizes are multiples of VL's weight-change norm.")


def _below_first(g: pd.DataFrame, first: float | None) -> str:
    """The size just below the first harm, on the metric that hurt first, with its interval and p."""
    if first is None:
        return ""
    for metric in HARM_METRICS:
        sub = g[g.metric == metric].sort_values("scale")
        if first_harm(sub, metric).get(g.model.iloc[0]) == first:
            before = sub[sub.scale < first]
            if len(before):
                r = before.iloc[-1]
                return (f"one size below it, at {r.scale:g}x, the {metric.replace(' acc', '')} changed "
                        f"{interval(r.change, r.lo, r.hi)} (p {r.p:.3f})")
    return ""


def caveat_sentence(evaluations: Mapping[tuple[str, str], dict], curve: pd.DataFrame,
                    kl_sizes: Mapping[str, float | None], seed: int = 0) -> str:
    """What (3) and (4) rest on, per model: the paired difference random at the KL-matched size minus VL on the
    strict-format mean (same items, training seed `seed`), and the size just below the first harm (each size
    has its own uncorrected interval)."""
    from sinklib.adapt.isolate import _pair_rows

    parts = []
    for m, g in curve.groupby("model", sort=False):
        clauses, k = [], kl_sizes.get(m)
        name = scaled_name(k) if k is not None else None
        if name is not None and (m, name) in evaluations and (m, "vl") in evaluations:
            t = _pair_rows(evaluations, m, "vl", name, seed)
            r = t[t.metric == "strict-format mean"].iloc[0]
            clauses.append(f"(3) random at {k:g}x minus VL, paired on the same items (training seed {seed}): "
                           f"{interval(r.change, r.lo, r.hi)} points of the strict-format mean")
        firsts = [f for f in (first_harm(g, metric).get(m) for metric in HARM_METRICS) if f is not None]
        below = _below_first(g, min(firsts) if firsts else None)
        if below:
            clauses.append(f"(4) first harm at {min(firsts):g}x; {below}")
        if clauses:
            parts.append(f"{m}: " + "; ".join(clauses))
    return ". ".join(parts)


def sentence(frame: pd.DataFrame) -> str:
    """'smollm2-135m: 3 of 4 predictions as predicted (1, 2, 3); not as predicted: 4 (first at 16x); ...'."""
    if frame.empty:
        return "no model ran the random control's sizes, so none of the four predictions was tested"
    parts = []
    for m, g in frame.groupby("model", sort=False):
        by = {o: g[g.outcome == o] for o in ("as predicted", "not as predicted", "not tested")}
        text = f"{m}: {len(by['as predicted'])} of {len(g)} as predicted"
        if len(by["as predicted"]):
            text += " (" + ", ".join(str(p) for p in by["as predicted"].prediction) + ")"
        for o in ("not as predicted", "not tested"):
            if len(by[o]):
                text += f"; {o}: " + ", ".join(f"{r.prediction} ({r.measured})" for r in by[o].itertuples())
        parts.append(text)
    return ". ".join(parts)


__all__ = ["kl_slope", "judge", "display", "caveat_sentence", "sentence", "RULE_COLUMN", "RATIO_MIN", "SLOPE_SPAN", "MATCH_SPAN", "HARM_SIZES"]
