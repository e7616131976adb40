"""Statistical power of the book's comparisons (#13): the smallest change of a pass/fail suite that a test
detects with a given probability, for the base model's accuracy and the number of items.

Paired (the same items before and after), the exact McNemar test (`evals.grading.mcnemar_exact`) sees only
the discordant items. Under the alternative, each item independently turns from pass to fail with
probability ``delta + flip`` and from fail to pass with probability ``flip`` (``flip`` is background churn:
items that change in both directions without a net effect; 0 is the best case, every change one way).
Its power is computed exactly by summing over the number of discordant items. Unpaired (two independent
samples of n items, as when two intervals are compared), the two-proportion z test's usual approximation.
"""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
from scipy import stats

from sinklib.errors import ParameterError
from sinklib.core.params import check_float, check_int


def _mcnemar_reject(n: int, alpha: float) -> np.ndarray:
    """[n + 1, n + 1] bool: reject at level alpha for d discordant items of which c went one way (c <= d)."""
    rej = np.zeros((n + 1, n + 1), dtype=bool)
    for d in range(1, n + 1):
        c = np.arange(d + 1)
        tail = stats.binom.cdf(np.minimum(c, d - c), d, 0.5)
        rej[d, : d + 1] = np.minimum(1.0, 2 * tail) <= alpha
    return rej


def mcnemar_power(n: int, delta: float, flip: float = 0.0, alpha: float = 0.05) -> float:
    """Probability that the exact two-sided McNemar test at level `alpha` rejects on `n` paired items when
    the pass rate falls by `delta` (fraction; items fail with probability delta + flip and recover with
    probability flip)."""
    n = check_int("n", n, 1, 100_000)
    delta, flip = check_float("delta", delta, 0.0, 1.0), check_float("flip", flip, 0.0, 0.5)
    alpha = check_float("alpha", alpha, 1e-9, 0.5)
    p10, p01 = delta + flip, flip
    if p10 + p01 > 1:
        raise ParameterError(f"delta + 2 * flip = {p10 + p01:g} exceeds 1: no item can change that often")
    if p10 + p01 == 0:
        return 0.0
    rej = _mcnemar_reject(n, alpha)
    q = p01 / (p10 + p01)
    d = np.arange(n + 1)
    pd = stats.binom.pmf(d, n, p10 + p01)
    power = 0.0
    for dd in range(1, n + 1):
        c = np.arange(dd + 1)
        power += pd[dd] * float(stats.binom.pmf(c, dd, q)[rej[dd, : dd + 1]].sum())
    return float(power)


def unpaired_power(n: int, p_base: float, delta: float, alpha: float = 0.05) -> float:
    """Approximate power of the two-sided two-proportion z test between two independent samples of `n` items
    with pass rates p_base and p_base - delta."""
    p1, p2 = p_base, p_base - delta
    if not 0 <= p2 <= 1:
        raise ParameterError(f"p_base - delta = {p2:g} lies outside [0, 1]")
    se = math.sqrt((p1 * (1 - p1) + p2 * (1 - p2)) / n)
    if se == 0:
        return float(delta != 0)
    z = stats.norm.ppf(1 - alpha / 2)
    return float(stats.norm.cdf(abs(delta) / se - z) + stats.norm.cdf(-abs(delta) / se - z))


def min_detectable_drop(n: int, p_base: float, *, power: float = 0.8, alpha: float = 0.05, flip: float = 0.0,
                        paired: bool = True, step: float = 0.005) -> float:
    """The smallest fall of the pass rate (in points) detected with probability >= `power`, searched on a grid
    of `step`; NaN when even losing every passed item is not detected that often."""
    p_base = check_float("p_base", p_base, 0.0, 1.0)
    power = check_float("power", power, 0.0, 1.0)
    for delta in np.arange(step, p_base + 1e-12, step):
        pw = mcnemar_power(n, float(delta), flip, alpha) if paired else unpaired_power(n, p_base, float(delta), alpha)
        if pw >= power:
            return round(100 * float(delta), 6)
    return float("nan")


def power_table(suites: Mapping[str, tuple[int, float]], *, power: float = 0.8, alpha: float = 0.05,
                flips: tuple[float, ...] = (0.0, 0.05)):
    """One row per suite {'suite': (items, base pass rate as a fraction)}: the smallest detectable drop (points)
    for the paired McNemar test at each background flip rate and for two unpaired samples."""
    import pandas as pd

    rows = []
    for name, (n, p) in suites.items():
        row = {"suite": name, "items": int(n), "base (%)": 100 * p}
        for f in flips:
            row[f"paired, flip {f:g}"] = min_detectable_drop(n, p, power=power, alpha=alpha, flip=f)
        row["unpaired"] = min_detectable_drop(n, p, power=power, alpha=alpha, paired=False)
        rows.append(row)
    return pd.DataFrame(rows)


def base_power_table(base_outcomes: Mapping[str, Mapping], metrics: tuple[str, ...] = (
        "instructions strict", "math strict", "knowledge acc"), **kw):
    """`power_table` of each model's pass/fail suites at the base model's accuracy on the items it was
    evaluated on: base_outcomes {model: per-item outcomes of its base evaluation (`sinklib.evals.paired`)}; a
    row per (model, metric) named 'model: metric'. Other keyword arguments go to `power_table`."""
    from sinklib.evals.paired import unpack

    suites = {}
    for model, out in base_outcomes.items():
        out = unpack(out)
        for m in metrics:
            if m in out and len(out[m]):
                suites[f"{model}: {m}"] = (len(out[m]), float(np.mean(out[m])))
    return power_table(suites, **kw)


def sentence(table, column: str = "paired, flip 0.05") -> str:
    """`power_table` rows in words: per suite, the smallest detectable fall (points) paired and unpaired."""
    def pts(v: float) -> str:
        return f"{v:.1f} points" if v == v else "no fall of any size"

    return "; ".join(f"{r['suite']} {pts(r[column])} paired (unpaired {pts(r['unpaired'])}) at a base accuracy of "
                     f"{r['base (%)']:.0f} % on {r['items']} items" for _, r in table.iterrows())
