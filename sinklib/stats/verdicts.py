"""Verdicts by stated rules: the vocabulary, the rules as the claims page prints them, and the interval
arithmetic behind them (Wilson intervals for scores, MOVER intervals for differences and means).

Used by the claims page (``sinklib.claims``) and by the chapters that state a verdict (chapter 4).
"""
from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np

from sinklib.errors import ParameterError

REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE = "reproduced", "not reproduced", "inconclusive", "not testable here"


NOT_RUN = "not run yet"


VERDICTS = (REPRODUCED, NOT_REPRODUCED, INCONCLUSIVE, NOT_TESTABLE)


RULES = (
    (REPRODUCED, "the 95 % interval of the tested quantity excludes zero in the paper's direction (or, where no "
                 "interval is stored, the paper's ordering holds by the margin named in the row) in at least one "
                 "model, and no model contradicts it"),
    (NOT_REPRODUCED, "the interval excludes zero the other way, or a precondition of the test failed (named in "
                     "the row: the VL model did not learn the visual task, i.e. its VQA interval is not above the "
                     "majority-answer baseline; the VL change it should explain is within noise; the injected "
                     "model does not start as the original; a fine-tune has no control)"),
    (INCONCLUSIVE, "the interval contains zero, the sample is too small, no interval is stored, or models disagree"),
    (NOT_TESTABLE, "needs models, benchmarks or panels this book cannot run offline (named in the row)"),
    (NOT_RUN, "the chapter's results file is missing; run the chapter"),
)


INTERVALS = ("Scores carry Wilson 95 % intervals over their n items (computed from the score and n where a "
             "chapter stores none). Where a chapter stores every item's outcome (chapter 4), a change between two "
             "conditions, the mean of the two strict-format suites (instructions strict, math strict) and a "
             "difference of two changes carry paired 95 % bootstrap intervals: the shared items are resampled "
             "together, and the exact McNemar test gives the p-value of a pass/fail change. Elsewhere they "
             "combine the scores' intervals by MOVER (Newcombe's method), treating conditions as independent "
             "samples, which is conservative. A difference inside such an interval is not an effect.")


class Est(NamedTuple):
    """A point value with its 95 % interval."""
    v: float
    lo: float
    hi: float


def num(x: float, d: int = 1, sign: bool = True) -> str:
    return format(x, f"{'+' if sign else ''}.{d}f").replace("-", "−")


def est(e: Est, d: int = 1, unit: str = "") -> str:
    return f"{num(e.v, d)}{unit} [{num(e.lo, d)}, {num(e.hi, d)}]"


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


def direction(e: Est, sign: int) -> str:
    """REPRODUCED when the interval excludes zero on the side of `sign`, NOT_REPRODUCED on the other side."""
    if e.lo > 0 or e.hi < 0:
        return REPRODUCED if (e.lo > 0) == (sign > 0) else NOT_REPRODUCED
    return INCONCLUSIVE


def compare_words(e: Est, worse: str = "lower", better: str = "higher") -> str:
    """An interval of a difference in words: which way it goes and whether it is outside the noise."""
    if e.hi < 0:
        return f"{worse} (interval excludes zero)"
    if e.lo > 0:
        return f"{better} (interval excludes zero)"
    return "within noise (interval contains zero)"


def combine(verdicts) -> str:
    s = set(verdicts)
    if not s or s == {NOT_TESTABLE}:
        return NOT_TESTABLE
    if REPRODUCED in s:
        return INCONCLUSIVE if NOT_REPRODUCED in s else REPRODUCED
    return NOT_REPRODUCED if NOT_REPRODUCED in s else INCONCLUSIVE


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
