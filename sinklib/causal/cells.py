"""The cells of chapter 8's change tables, and where the two tests of a pass/fail change disagree.

A change between two evaluations on the same items is decided by its paired 95 % bootstrap interval (the book's
one rule, `sinklib.stats.verdicts.INTERVALS`); the exact McNemar test gives the p-value of a pass/fail change. Near
the 5 % boundary the two can disagree (an interval that just excludes zero with p slightly above 0.05, or the
reverse). The tables mark those cells (`DISAGREE`) and `disagreement_sentence` says how many there are, so a reader
sees where a verdict rests on the choice of test (a referee's item 5 on chapter 8)."""
from __future__ import annotations

from collections.abc import Sequence

from sinklib.core.numbers import interval

#: the mark of a cell whose interval and exact McNemar p (at `LEVEL`) disagree
DISAGREE = "†"
LEVEL = 0.05
NOT_TESTED_CELL = "not tested (mass)"
UNCHANGED_CELL = "inputs unchanged"


def disagrees(lo: float, hi: float, p: float, level: float = LEVEL) -> bool:
    """True where the exact McNemar p (NaN for perplexity: no test, never marked) says 'outside the noise' at
    `level` and the interval [lo, hi] does not, or the reverse."""
    return p == p and (p < level) != (lo > 0 or hi < 0)


def digits(metric: str) -> int:
    """Decimals of a change of `metric`: two for perplexity (its changes are fractions of a unit), else one."""
    return 2 if str(metric).startswith("perplexity") else 1


def change_cells(table, tested: Sequence[bool] | None = None, value: str = "change", *, lo: str = "lo", hi: str = "hi",
                 unchanged: Sequence[bool] | None = None, marks: bool = True) -> list[str]:
    """One cell per row of a paired-changes table (columns `value`, `lo`, `hi`, p, metric): 'v [lo, hi]' (two
    decimals for perplexity, whose changes are fractions of a unit) with `DISAGREE` where the two tests disagree
    (`marks`: p belongs to this change), `NOT_TESTED_CELL` where `tested` is False (a matched control outside its
    tolerance), `UNCHANGED_CELL` where `unchanged` is True (the condition left every input of that suite as it was:
    a zero there is not a measurement)."""
    n = len(table)
    ok = [True] * n if tested is None else [bool(t) for t in tested]
    same = [False] * n if unchanged is None else [bool(u) for u in unchanged]
    metric = list(table["metric"]) if "metric" in table else [""] * n
    ps = list(table["p"]) if marks and "p" in table else [float("nan")] * n
    return [NOT_TESTED_CELL if not k else UNCHANGED_CELL if u else
            interval(c, a, b, digits=digits(m)) + (DISAGREE if disagrees(a, b, q) else "")
            for c, a, b, q, k, u, m in zip(table[value], table[lo], table[hi], ps, ok, same, metric)]


def disagreement_sentence(table, tested: Sequence[bool] | None = None, what: str = "cells") -> str:
    """How many pass/fail cells of `table` the two tests decide differently, with their p-values, in words."""
    ok = [True] * len(table) if tested is None else [bool(t) for t in tested]
    rows = [r for (_, r), k in zip(table.iterrows(), ok) if k and r.p == r.p]
    odd = [r for r in rows if disagrees(r.lo, r.hi, r.p)]
    if not rows:
        return f"no pass/fail {what} to test"
    if not odd:
        where = f"all {len(rows)} pass/fail {what}" if len(rows) > 1 else f"the one pass/fail {what.rstrip('s')}"
        return f"the paired interval and the exact McNemar test agree at the 5 % level in {where}"
    ps = sorted(float(r.p) for r in odd)
    span = f"p = {ps[0]:.3f}" if len(ps) == 1 else f"p from {ps[0]:.3f} to {ps[-1]:.3f}"
    return (f"the paired interval and the exact McNemar test disagree at the 5 % level in {len(odd)} of {len(rows)} "
            f"pass/fail {what} (marked {DISAGREE}; {span}): the interval decides, the rule every page uses, so "
            f"{'this cell is' if len(odd) == 1 else 'these cells are'} near the boundary of either test")
