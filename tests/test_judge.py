"""Tests of sinklib.controls.judge: chapter 6's predictions judged from the data."""
from __future__ import annotations

import pandas as pd

from sinklib.controls.judge import iv, judge_injection, judge_merges, side


def test_side_and_iv():
    assert side(-3, -1) == "below zero, outside the noise"
    assert side(0.5, 2) == "above zero, outside the noise"
    assert side(0.0, 2) == "within the noise"
    assert iv(1.9, 0.004, 4.4) == "+1.9 [+0.004, +4.4]" and iv(1.9, 0.0, 4.4) == "+1.9 [0.0, +4.4]"


def test_judge_injection_held_and_failed():
    drops = {"math strict": (-30.0, -38.0, -21.0)}
    assert judge_injection(drops, 0.7, 3.5, (-3.0, -8.0, 1.0)).startswith("(1) held")
    assert "(2) held" in judge_injection(drops, 0.7, 3.5, (-3.0, -8.0, 1.0))
    out = judge_injection(drops, 0.7, 3.5, (-12.9, -19.4, -6.6))
    assert "(2) did not hold" in out and "outside the noise" in out
    assert judge_injection({"math strict": (-1.0, -3.0, 1.0)}, 0.7, 3.5, (0, -1, 1)).startswith("(1) did not hold")


def _verdicts(star_hi: float, ta_lo: float):
    rows = [("a", "star", -7.0, -12.0, star_hi), ("a", "task_arithmetic", 1.0, ta_lo, 4.0)]
    return pd.DataFrame([{"model": m, "method": k, "strict format change vs VL (pt)": v, "lo": lo, "hi": hi,
                          "worse than VL": hi < 0, "recovers to base level": False} for m, k, v, lo, hi in rows])


def test_judge_merges():
    earlier = {("a", "star"): (-14.0, -24.0, -4.0), ("a", "task_arithmetic"): (2.0, -4.0, 8.0)}
    out = judge_merges(_verdicts(-2.0, -1.0), earlier, run="abc1234")
    assert out.startswith("(1) held") and "(2) held: 0 of 2" in out and "(3) held:" in out and "abc1234" in out
    assert judge_merges(_verdicts(1.0, 0.5), earlier).startswith("(1) did not hold")
    assert "(3) held in part" in judge_merges(_verdicts(-2.0, 0.5), earlier)
