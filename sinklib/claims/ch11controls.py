"""Chapter 11's controls against its predictions 4 and 5 (section 11.1), in words with their numbers: the text-only
control (VL minus text-only of strict instructions, pooled over the training seeds, and what the text-only control
did to math: the answer format alone, or right answers too) and the random control matched to VL on the
next-token KL (random minus VL, at the first training seed, whose VL change gives the random direction). Each
prediction is judged held, failed, or not judged yet, from the rows alone: a prediction that the missing controls
could still decide is not judged."""
from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from sinklib.adapt.primary import PRIMARY
from sinklib.core.numbers import interval

CONTRAST = "VL minus text-only: " + PRIMARY


def has_control(rows: pd.DataFrame) -> bool:
    """Whether some pair has its text-only control (its controlled contrast, VL minus text-only)."""
    return any(e is not None for e in rows[CONTRAST])


def uncontrolled(rows: pd.DataFrame) -> str:
    """Said while no pair has its text-only control: the loss is against the base model, not yet the control."""
    if has_control(rows):
        return ""
    return (" (against the base model: whether the image or the fine-tuning itself costs it waits for the text-only "
            "control)")


def _names(xs: Sequence[str]) -> str:
    return ", ".join(xs) or "none"


def _iv(e) -> str:
    return interval(e[0], e[1], e[2])


def prediction4(rows: pd.DataFrame) -> str:
    """Prediction 4 (VL minus text-only contains zero in at least three models): held when three do, failed when
    too few can still do so (a pair whose precondition failed runs no control), else not judged yet; each model's
    contrast in words (which condition cost more)."""
    have = {m: e for m, e in zip(rows.model, rows[CONTRAST]) if e is not None}
    zero = [m for m, e in have.items() if e.lo <= 0 <= e.hi]
    more_to = [m for m, e in have.items() if e.lo > 0]   # VL kept more than text-only: text-only cost more
    more_vl = [m for m, e in have.items() if e.hi < 0]
    can = rows[rows.precondition]  # a model that passed no rate runs no control (section 11.1)
    missing = sum(m not in have for m in can.model)
    word = ("held" if len(zero) >= 3 else "failed" if len(zero) + missing < 3 else
            f"is not judged yet ({len(have)} of the {len(can)} models that can run it have)")
    each = "; ".join(f"{m} {_iv(e)}" for m, e in have.items())
    return (f"- **Prediction 4** (the text-only control costs strict instruction format about as much as VL: VL minus "
            f"text-only contains zero in at least three models) {word}: VL minus text-only, pooled over the training "
            f"seeds, {each} points; within the noise in {len(zero)} ({_names(zero)}); the text-only control cost more "
            f"in {len(more_to)} ({_names(more_to)}), VL more in {len(more_vl)} ({_names(more_vl)}).")


def text_only_math(rows: pd.DataFrame) -> str:
    """What the text-only control did to math, per model that ran it: strict math alone beyond the noise (the
    answer format, which no training template shares with the math items), lenient math too (right answers), or
    neither."""
    parts = []
    for _, r in rows.iterrows():
        s, le = r["text-only: math strict"], r["text-only: math lenient"]
        if s is None or le is None:
            continue
        what = ("lenient math fell too, so it lost right answers, not only their format" if le.hi < 0 else
                "lenient math held, so what it lost is the answer format" if s.hi < 0 else
                "neither fell beyond the noise")
        parts.append(f"{r.model}: strict {_iv(s)}, lenient {_iv(le)} points ({what})")
    return ("- **The text-only control and math** (changes from base, pooled over the training seeds; no training "
            "template collides with a math item, section 11.2): " + "; ".join(parts) + ".") if parts else ""


def prediction5(rnd: pd.DataFrame | None, can: Sequence[str]) -> str:
    """Prediction 5 (the random control at VL's next-token KL costs strict format no more than VL): failed where
    random minus VL lies beyond the noise below zero in some model, held when none does and every model of `can`
    (those whose pair passed, the only ones that run controls) has run it, else not judged yet."""
    if rnd is None or not len(rnd):
        return ""
    col = "random minus VL: " + PRIMARY
    ran = {r.model: r[col] for _, r in rnd.iterrows() if isinstance(r[col], (tuple, list))}  # pandas: None or NaN
    if not ran:
        return ("- **Prediction 5** (the random control at VL's next-token KL costs strict format no more than VL) "
                "is not judged: no random control was evaluated in this run.")
    worse = [m for m, e in ran.items() if e[2] < 0]
    waiting = [m for _, r in rnd.iterrows() if (m := r.model) in can and r.note == "not run in this run"]
    word = ("failed" if worse else "held" if not waiting else
            f"is not judged yet (waiting for {_names(waiting)})")
    each = "; ".join(f"{m} {_iv(e)}" for m, e in ran.items())
    unmatched = [r.model for _, r in rnd.iterrows() if r.note and r.model in can]
    return (f"- **Prediction 5** (the random control at VL's next-token KL costs strict format no more than VL) "
            f"{word}: random minus VL of strict instructions, at the first training seed (whose VL change gives the "
            f"random direction), {each} points; beyond the noise below zero in {len(worse)} ({_names(worse)})"
            + (f"; no matched evaluation for {_names(unmatched)}" if unmatched else "") + ".")


def controls_lines(rows: pd.DataFrame, rnd: pd.DataFrame | None = None) -> list[str]:
    """The findings' lines on the controls: predictions 4 and 5 are said not judged while no pair has its text-only
    control; then prediction 4, the text-only control's math and prediction 5 (`rnd`: `ch11.random_rows`)."""
    if not has_control(rows):
        return ["- Predictions 4 and 5 (the text-only and the random control) are not judged: the controls have not "
                "run yet."]
    return [line for line in (prediction4(rows), text_only_math(rows), prediction5(rnd, list(rows.model[rows.precondition]))) if line]
