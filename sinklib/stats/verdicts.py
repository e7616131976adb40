"""Verdicts by one stated rule: the vocabulary, the rule as the claims page prints it (`decide` applies it to every
row), and the interval arithmetic behind it (Wilson intervals for scores, MOVER intervals for differences and
means, t intervals over training seeds).

Used by the claims page (``sinklib.claims``) and by the chapters that state a verdict (chapters 4 and 7).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from sinklib.errors import ParameterError

REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_TESTED = "reproduced", "contradicted", "inconclusive", "not tested"
#: the names the chapters' code used before the four outcomes (chapter 7's executed copy prints "not reproduced"
#: from them until its next run); the same outcomes
NOT_REPRODUCED, NOT_TESTABLE = CONTRADICTED, NOT_TESTED


NOT_RUN = "not run yet"


VERDICTS = (REPRODUCED, CONTRADICTED, INCONCLUSIVE, NOT_TESTED)


RULES = (
    (REPRODUCED, "the 95 % interval of the tested quantity lies wholly on the paper's side of zero (or, for the "
                 "few quantities without an interval, of the margin named in the row); across models: in at least "
                 "one tested model, and no tested model contradicts it"),
    (CONTRADICTED, "the interval lies wholly on the other side: the data say the opposite of the claim"),
    (INCONCLUSIVE, "the interval contains zero (or straddles the margin), the sample is too small to decide, or "
                   "models disagree: the claim is neither supported nor refuted here"),
    (NOT_TESTED, "a precondition of the test failed (named in the row: the VL model did not learn the visual task, "
                 "the loss the test should explain is within noise, the injected model does not start as the "
                 "original, no sink formed), or the models, benchmarks or panels do not exist here: the claim was "
                 "not put to the test, which says nothing about it"),
    (NOT_RUN, "the chapter's results file is missing; run the chapter"),
)


INTERVALS = ("One interval method per kind of quantity. Scores: Wilson 95 % intervals over their n items. A change "
             "between two conditions evaluated on the same items, the strict-format mean (instructions strict and "
             "math strict) and a difference of two changes: paired 95 % bootstrap intervals (the shared items "
             "resampled together; the exact McNemar test gives the p-value of a pass/fail change); where a chapter "
             "trained several seeds, the seeds are pooled: the bootstrap also resamples the training seeds. Where "
             "no per-item outcomes are stored, MOVER (Newcombe's method) combines the scores' Wilson intervals, "
             "treating conditions as independent, which is conservative. A change in S over training seeds: the "
             "t interval over the seeds (paired by seed). Spearman's ρ: the Fisher interval. A difference inside "
             "such an interval is not an effect.")


class Est(NamedTuple):
    """A point value with its 95 % interval."""
    v: float
    lo: float
    hi: float


class Verdict(NamedTuple):
    """One of the four outcomes and the reason, in words."""
    outcome: str
    why: str


def decide(e: Est | None, sign: int = +1, *, quantity: str = "the interval", not_tested: str = "",
           too_small: str = "", band: tuple[float, float] = (0.0, 0.0),
           counts: tuple[int, int, int] | None = None, need: float = 1.0) -> Verdict:
    """THE rule of every claim row (`RULES`): `not_tested` (a failed precondition, or the models do not exist)
    wins, then `too_small` (or no estimate) is inconclusive; otherwise the interval of `quantity` decides. `sign`
    is the paper's direction (+1: above zero); `band` widens zero to a margin (lo, hi) for the few quantities with
    a margin rule instead of an interval (pass ``Est(x, x, x)``): reproduced beyond the band on the paper's side,
    contradicted beyond it on the other, inconclusive inside. A claim about several settings ("no merge
    recovers", "most merges make it worse") passes `counts` (settings whose interval is on the paper's side,
    settings whose interval is against it, all settings) and `need` (the share the claim names: 1 for "every",
    0.5 for "most"): reproduced when more than `need` of them (every one at 1) are on the paper's side, contradicted
    when more than 1 - `need` are against it (any one at 1), inconclusive otherwise."""
    if not_tested:
        return Verdict(NOT_TESTED, not_tested)
    if too_small or (e is None and counts is None):
        return Verdict(INCONCLUSIVE, too_small or f"no estimate of {quantity}")
    if counts is not None:
        k_for, k_against, n = counts
        if k_against > (1 - need) * n:
            return Verdict(CONTRADICTED, f"{k_against} of {n} {quantity} against the claim")
        ok = k_for == n if need >= 1 else k_for > need * n
        return Verdict(REPRODUCED if ok else INCONCLUSIVE, f"{k_for} of {n} {quantity} on the claim's side")
    lo_edge, hi_edge = band
    above, below = e.lo > hi_edge, e.hi < lo_edge
    where = "the margin" if band != (0.0, 0.0) else "zero"
    if above or below:
        ours = above == (sign > 0)
        return Verdict(REPRODUCED if ours else CONTRADICTED,
                       f"{quantity} lies beyond {where} {'in the paper' if ours else 'against the paper'}'s direction")
    return Verdict(INCONCLUSIVE, f"{quantity} {'straddles the margin' if band != (0.0, 0.0) else 'contains zero'}")


def num(x: float, d: int = 1, sign: bool = True) -> str:
    """`x` with `d` decimals and the typographic minus; signed (no signed zero) unless `sign` is false."""
    from sinklib.core.numbers import signed

    return signed(x, d, minus="−") if sign else format(x, f".{d}f").replace("-", "−")


def est(e: Est, d: int = 1, unit: str = "") -> str:
    """'v [lo, hi]' with the typographic minus; an endpoint that would read as zero but is not gets one more
    decimal (`sinklib.core.numbers.endpoint`: its sign decides the verdict)."""
    from sinklib.core.numbers import endpoint

    return f"{num(e.v, d)}{unit} [{endpoint(e.lo, d, '−')}, {endpoint(e.hi, d, '−')}]"


def wilson_pct(score: float, n: int) -> Est:
    """A score in % of n items with its Wilson 95 % interval in %."""
    lo, hi = wilson_interval(int(round(score * n / 100)), int(n))
    return Est(score, 100 * lo, 100 * hi)


def diff(a: Est, b: Est) -> Est:
    """a - b with its MOVER interval (independent samples)."""
    d = a.v - b.v
    return Est(d, d - math.hypot(a.v - a.lo, b.hi - b.v), d + math.hypot(a.hi - a.v, b.v - b.lo))


def mean(*es: Est) -> Est:
    """The mean of independent estimates with its MOVER interval."""
    v = sum(e.v for e in es) / len(es)
    return Est(v, v - math.hypot(*(e.v - e.lo for e in es)) / len(es), v + math.hypot(*(e.hi - e.v for e in es)) / len(es))


def t_interval(values) -> Est | None:
    """The mean of replicates (e.g. training seeds) with its t 95 % interval; None with fewer than 2 values."""
    from scipy import stats as sst

    x = np.asarray(list(values), float)
    if x.size < 2:
        return None
    half = float(sst.t.ppf(0.975, x.size - 1) * x.std(ddof=1) / math.sqrt(x.size))
    return Est(float(x.mean()), float(x.mean()) - half, float(x.mean()) + half)


def fisher_diff(r1: float, r2: float, n1: int, n2: int) -> Est:
    """r1 - r2 of two correlations on independent samples, with the Fisher-z 95 % interval back-transformed by
    Zou's method (MOVER on the two Fisher intervals)."""
    def one(r, n):
        z, s = math.atanh(r), 1.959963984540054 / math.sqrt(n - 3)
        return Est(r, math.tanh(z - s), math.tanh(z + s))
    return diff(one(r1, n1), one(r2, n2))


def direction(e: Est, sign: int) -> str:
    """`decide`'s outcome for an interval: REPRODUCED on the side of `sign`, CONTRADICTED on the other side."""
    return decide(e, sign).outcome


def compare_words(e: Est, worse: str = "lower", better: str = "higher") -> str:
    """An interval of a difference in words: which way it goes and whether it is outside the noise."""
    if e.hi < 0:
        return f"{worse} (interval excludes zero)"
    if e.lo > 0:
        return f"{better} (interval excludes zero)"
    return "within noise (interval contains zero)"


def combine(verdicts) -> str:
    """Across models: models not tested drop out; reproduced in one and contradicted in none -> reproduced, models
    that disagree -> inconclusive; NOT_TESTED only when no model was tested."""
    s = set(verdicts) - {NOT_TESTED}
    if not s:
        return NOT_TESTED
    if REPRODUCED in s:
        return INCONCLUSIVE if CONTRADICTED in s else REPRODUCED
    return CONTRADICTED if CONTRADICTED in s else INCONCLUSIVE


def wilson_interval(k: int, n: int, z: float = 1.959963984540054) -> tuple[float, float]:
    """Wilson score interval for k successes in n trials, as fractions in [0, 1] (95 % by default)."""
    if not isinstance(n, (int, np.integer)) or n <= 0:
        raise ParameterError(f"parameter 'n' got {n!r}; allowed: a positive integer (number of items)")
    if not 0 <= k <= n:
        raise ParameterError(f"parameter 'k' got {k!r}; allowed: an integer in [0, n={n}]")
    p = k / n
    den = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    # the interval always holds p: exact bounds at k = 0 and k = n (not 1e-15 of rounding)
    return min(p, max(0.0, centre - half)), max(p, min(1.0, centre + half))

