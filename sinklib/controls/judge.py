"""Chapter 6's written predictions judged against a run: the direction words come from the data.

The predictions were written before the whole-suite run, with reference numbers from an earlier run
(`EARLIER_RUN`); those numbers are kept here, labelled with that run, so the page never shows them as this run's.
"""
from __future__ import annotations

from sinklib.core.numbers import interval

EARLIER_RUN = "d56cec1"  # the run on 24 instruction, 30 math and 100 knowledge items the predictions quote
# strict-format change vs VL (pt) [paired 95 % interval] in that run, for the merges the predictions name
EARLIER_VS_VL = {("smollm2-135m", "star"): (-14.2, -26.3, -2.9), ("gemma3-270m", "star"): (-12.5, -22.1, -5.0),
                 ("smollm2-135m", "task_arithmetic"): (4.2, 0.0, 10.4), ("smollm2-135m", "ties"): (4.2, 0.0, 10.4),
                 ("gemma3-270m", "task_arithmetic"): (2.1, 0.0, 6.3), ("gemma3-270m", "ties"): (2.1, 0.0, 6.3)}


def side(lo: float, hi: float) -> str:
    """Where a paired interval lies: 'below zero, outside the noise', 'above zero, ...' or 'within the noise'."""
    return ("below zero, outside the noise" if hi < 0 else "above zero, outside the noise" if lo > 0
            else "within the noise")


def iv(v: float, lo: float, hi: float) -> str:
    """`interval` (a bound that is not zero but would print as 0.0 gets more decimals: `numbers.endpoint`)."""
    return interval(v, lo, hi)


def held(ok: bool, partly: bool = False) -> str:
    return "held" if ok else "held in part" if partly else "did not hold"


def judge_injection(drops: dict, s_before: float, s_after: float, gap) -> str:
    """Predictions (1) and (2) of the injection: `drops` maps a metric to the injected-minus-original paired
    (v, lo, hi); `gap` is injected + recovery minus its control (v, lo, hi)."""
    cut = {m: d[1] < 0 and d[2] < 0 for m, d in drops.items()}
    one = all(cut.values()) and s_after > s_before
    p1 = (f"(1) {held(one)}: " + "; ".join(f"{m} {iv(*d)} pt ({side(d[1], d[2])})" for m, d in drops.items())
          + f"; S {s_before:.2f} -> {s_after:.2f} ({'up' if s_after > s_before else 'not up'})")
    below_hidden = gap[0] < 0 and gap[1] <= 0 <= gap[2]
    p2 = (f"(2) {held(below_hidden)}: the injected model ends {iv(*gap)} pt from its control, {side(gap[1], gap[2])}"
          + ("" if below_hidden else ", so the suites do detect the gap" if gap[2] < 0 else ""))
    return f"{p1}. {p2}"


def judge_merges(verdicts, earlier: dict = EARLIER_VS_VL, run: str = EARLIER_RUN) -> str:
    """Predictions (1)-(3) of the merges, from chapter 6's verdict table (columns model, method, lo, hi,
    'strict format change vs VL (pt)', 'worse than VL', 'recovers to base level')."""
    v = verdicts.set_index(["model", "method"])
    models = list(dict.fromkeys(verdicts.model))
    worse = {m: sorted(verdicts[(verdicts.model == m) & verdicts["worse than VL"]].method) for m in models}
    one = all(w == ["star"] for w in worse.values())
    p1 = f"(1) {held(one)}: merges below VL outside the noise: " + "; ".join(
        f"{m} {', '.join(w) or 'none'}" for m, w in worse.items())
    if all(("star" in w) for w in worse.values()):
        p1 += " (STAR " + "; ".join(
            f"{m} {iv(*v.loc[(m, 'star'), ['strict format change vs VL (pt)', 'lo', 'hi']])} pt, earlier run "
            f"({run}) {iv(*earlier[(m, 'star')])}" for m in models if (m, "star") in earlier) + ")"
    n_rec, n = int(verdicts["recovers to base level"].sum()), len(verdicts)
    p2 = f"(2) {held(n_rec == 0)}: {n_rec} of {n} merges recover to the base level"
    named = [k for k in earlier if k in v.index]
    ratio = {k: (v.loc[k, "hi"] - v.loc[k, "lo"]) / (earlier[k][2] - earlier[k][1]) for k in named}
    halved = [k for k, r in ratio.items() if r <= 0.6]
    inside = [k for k in named if k[1] != "star" and v.loc[k, "lo"] <= 0 <= v.loc[k, "hi"]]
    others = [k for k in named if k[1] != "star"]
    p3 = (f"(3) {held(len(halved) == len(named) and inside == others, bool(halved) or bool(inside))}: interval widths "
          f"as a fraction of the earlier run's ({run}): " + ", ".join(f"{m} {meth} {r:.2f}" for (m, meth), r
                                                                         in ratio.items())
          + f"; task arithmetic and TIES within the noise in {len(inside)} of {len(others)} cases")
    return f"{p1}. {p2}. {p3}"
