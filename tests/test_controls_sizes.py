"""Chapter 6's statement of what its suites can detect (`sinklib.controls.sizes`)."""
from __future__ import annotations

import math

from sinklib.controls import sizes
from sinklib.evals import paired, power


def _outcomes(n_inst: int, p_inst: float, n_math: int, p_math: float) -> dict:
    def flags(n, p):
        return [i < round(n * p) for i in range(n)]
    return paired.pack({"instructions strict": flags(n_inst, p_inst), "math strict": flags(n_math, p_math),
                        "knowledge acc": flags(100, 0.75)})


def test_detectable_changes_are_computed_for_the_suites_used():
    t = sizes.detectable_table({"a": _outcomes(24, 0.25, 48, 0.4), "b": _outcomes(32, 1 / 3, 48, 0.25)})
    assert list(t.model) == ["a"] * 3 + ["b"] * 3
    row = t[(t.model == "b") & (t.metric == "math strict")].iloc[0]
    assert row["items"] == 48 and row[sizes.BEST] == power.min_detectable_drop(48, 0.25)
    assert row[sizes.CHURN] == power.min_detectable_drop(48, 0.25, flip=0.05)
    assert sizes.undetectable(t, "a") == ["instructions strict"]  # 24 items at 25 %: no fall is detected
    assert math.isnan(t[(t.model == "a") & (t.metric == "instructions strict")][sizes.BEST].iloc[0])
    words = sizes.detectable_sentence(t)
    assert "a: instructions strict (24 items, base 25 %): no fall of any size" in words
    assert "b: instructions strict (32 items" in words and "points at best" in words
    shown = sizes.detectable_display(t).frame
    assert shown.loc[("a", "instructions strict"), "smallest fall, no churn (pt)"] == "none"
    assert "np.float64" not in shown.to_string()


def test_one_formatter_prints_every_detectable_fall():
    from sinklib.claims.core import power_note
    from sinklib.controls.sizes import points

    assert points(14.46) == "14.5" and points(18.0) == "18.0" and points(float("nan")) == "none"
    note = power_note({"instructions strict": (72, 60.0)})
    fall = note.split("instructions strict ")[1].split(" points")[0]
    assert fall == points(float(fall)) and "." in fall   # the claims page's note prints it as chapter 6 does
