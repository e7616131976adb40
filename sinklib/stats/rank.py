"""Spearman's rho on a panel: exact and Monte-Carlo permutation nulls, Fisher and bootstrap intervals, tie
configurations and simulated sampling distributions (the tests chapter 5 and every panel use)."""
from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from sinklib.errors import PanelError

_ALTERNATIVES = ("two-sided", "greater", "less")
_FISHER_SE = ("bonett-wright", "fieller", "pearson")

# --------------------------------------------------------------------------- Spearman


def _rank_corr(x: np.ndarray, y: np.ndarray, axis: int = -1) -> np.ndarray:
    """Spearman rho along ``axis`` (Pearson correlation of average ranks); NaN if a side is constant."""
    rx = stats.rankdata(x, axis=axis)
    ry = stats.rankdata(y, axis=axis)
    rx = rx - rx.mean(axis=axis, keepdims=True)
    ry = ry - ry.mean(axis=axis, keepdims=True)
    den = np.sqrt((rx * rx).sum(axis=axis) * (ry * ry).sum(axis=axis))
    with np.errstate(invalid="ignore", divide="ignore"):
        return (rx * ry).sum(axis=axis) / den


def _rng_kw(fn: Any, seed: int) -> dict:
    """The seed argument scipy expects: ``rng`` (scipy >= 1.15) or ``random_state`` (older)."""
    import inspect

    name = "rng" if "rng" in inspect.signature(fn).parameters else "random_state"
    return {name: np.random.default_rng(seed)}


def _check_xy(x: Any, y: Any, what: str = "Spearman rho") -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(x, dtype=float)
    y = np.asarray(y, dtype=float)
    if x.ndim != 1 or x.shape != y.shape:
        raise PanelError(f"{what}: x and y must be 1-D of equal length, got shapes {x.shape} and {y.shape}")
    if not (np.isfinite(x).all() and np.isfinite(y).all()):
        raise PanelError(f"{what}: x and y must be finite (drop pairs with missing values first)")
    if len(x) < 3:
        raise PanelError(f"{what} needs at least 3 pairs, got {len(x)}")
    for name, v in (("x", x), ("y", y)):
        if np.ptp(v) == 0:
            raise PanelError(f"{what} is undefined: {name} is constant ({v[0]!r} for all {len(v)} pairs)")
    return x, y


def _check_alternative(alternative: str) -> None:
    if alternative not in _ALTERNATIVES:
        raise PanelError(f"alternative must be one of {list(_ALTERNATIVES)}, got {alternative!r}")


def rho_from_d2(sum_d2: float, n: int) -> float:
    """rho = 1 - 6 sum(d^2) / (n (n^2 - 1)): Spearman's formula, exact when there are no ties."""
    return 1.0 - 6.0 * sum_d2 / (n * (n * n - 1))


def d2_from_rho(rho: float, n: int) -> float:
    """The sum of squared rank differences that the no-ties formula implies for a given rho."""
    return (1.0 - rho) * n * (n * n - 1) / 6.0


@dataclass(frozen=True)
class PermutationResult:
    """A permutation test of rho: the null distribution and the p-value it gives."""

    rho: float
    p_value: float
    method: str  # "exact" (all n! orderings) or "monte carlo"
    n_null: int  # orderings enumerated or resampled
    null_distribution: np.ndarray = field(repr=False)


def spearman_permutation(
    x: Sequence[float],
    y: Sequence[float],
    *,
    alternative: str = "two-sided",
    exact_max_n: int = 10,
    n_perm: int = 9999,
    seed: int = 0,
) -> PermutationResult:
    """Permutation p-value of Spearman rho via ``scipy.stats.permutation_test``.

    The ranks of ``x`` are permuted against those of ``y`` (ties keep their average
    ranks). For n <= ``exact_max_n`` every one of the n! orderings is enumerated (exact;
    n! grows fast: 3.6 million orderings at n = 10); beyond, ``n_perm`` random orderings (Monte
    Carlo, p = (k + 1) / (n_perm + 1)).
    """
    x, y = _check_xy(x, y)
    _check_alternative(alternative)
    n = len(x)
    ry = stats.rankdata(y)
    ry = (ry - ry.mean()) / np.sqrt(((ry - ry.mean()) ** 2).sum())

    def stat(rx: np.ndarray, axis: int = -1) -> np.ndarray:
        rx = rx - rx.mean(axis=axis, keepdims=True)
        return (rx * ry).sum(axis=axis) / np.sqrt((rx * rx).sum(axis=axis))

    exact = n <= exact_max_n
    res = stats.permutation_test(
        (stats.rankdata(x),),
        stat,
        permutation_type="pairings",
        vectorized=True,
        n_resamples=np.inf if exact else int(n_perm),
        batch=100_000,
        alternative=alternative,
        **_rng_kw(stats.permutation_test, seed),
    )
    return PermutationResult(
        rho=float(res.statistic),
        p_value=float(res.pvalue),
        method="exact" if exact else "monte carlo",
        n_null=len(res.null_distribution),
        null_distribution=np.asarray(res.null_distribution),
    )


def rho_null(n: int, *, exact_max_n: int = 10, n_perm: int = 9999, seed: int = 0) -> np.ndarray:
    """Null distribution of Spearman rho for n untied pairs: all n! orderings (n <= exact_max_n) or n_perm random ones."""
    if n < 3:
        raise PanelError(f"the null distribution of rho needs n >= 3, got {n}")
    a = np.arange(n, dtype=float)
    return spearman_permutation(a, a, exact_max_n=exact_max_n, n_perm=n_perm, seed=seed).null_distribution


def pvalue_from_null(rho: float, null: np.ndarray, *, alternative: str = "greater", monte_carlo: bool = False) -> float:
    """p-value of an observed (e.g. reported) rho against a null distribution.

    Same conventions as ``scipy.stats.permutation_test``: (k + 1) / (m + 1) for a Monte
    Carlo null, and 2 x the smaller tail for two-sided. Values within 1e-9 of ``rho``
    count as ties (so a rho printed or rounded to 9+ decimals still matches its null value).
    """
    _check_alternative(alternative)
    null = np.asarray(null, dtype=float)
    tol = 1e-9 * max(1.0, abs(rho))
    adj = 1 if monte_carlo else 0
    m = len(null)
    greater = (np.count_nonzero(null >= rho - tol) + adj) / (m + adj)
    less = (np.count_nonzero(null <= rho + tol) + adj) / (m + adj)
    if alternative == "greater":
        return float(greater)
    if alternative == "less":
        return float(less)
    return float(min(1.0, 2 * min(greater, less)))


def fisher_ci(rho: float, n: int, *, level: float = 0.95, se: str = "bonett-wright") -> tuple[float, float]:
    """Fisher-z confidence interval for a Spearman rho: tanh(atanh(rho) -/+ z_{1-a/2} * SE).

    SE choices: ``bonett-wright`` sqrt((1 + rho^2/2)/(n - 3)) (Bonett & Wright 2000, meant
    for Spearman), ``fieller`` sqrt(1.06/(n - 3)) (Fieller et al. 1957), ``pearson``
    1/sqrt(n - 3). Needs n >= 4. At |rho| = 1 the interval is undefined: (nan, nan).
    """
    if se not in _FISHER_SE:
        raise PanelError(f"fisher_ci: se must be one of {list(_FISHER_SE)}, got {se!r}")
    if n < 4:
        raise PanelError(f"the Fisher-z interval needs n >= 4 (its SE divides by n - 3), got n = {n}")
    if not 0 < level < 1:
        raise PanelError(f"confidence level must be in (0, 1), got {level}")
    if not -1 <= rho <= 1:
        raise PanelError(f"rho must be in [-1, 1], got {rho}")
    if abs(rho) >= 1 - 1e-12:  # atanh is infinite (or float noise away from it)
        return (float("nan"), float("nan"))
    s = {"bonett-wright": math.sqrt((1 + rho * rho / 2) / (n - 3)),
         "fieller": math.sqrt(1.06 / (n - 3)),
         "pearson": 1 / math.sqrt(n - 3)}[se]
    z = stats.norm.ppf(0.5 + level / 2)
    c = math.atanh(rho)
    return (math.tanh(c - z * s), math.tanh(c + z * s))


def bootstrap_ci(
    x: Sequence[float], y: Sequence[float], *, n_boot: int = 9999, level: float = 0.95, seed: int = 0
) -> tuple[float, float, int]:
    """Percentile bootstrap interval of rho (``scipy.stats.bootstrap``, pairs resampled together).

    Returns (low, high, n_undefined): resamples whose x or y is constant have no rho; they
    are counted and left out of the percentiles (rare, but more frequent with ties). At
    small n the resamples hold few distinct pairs, so the interval is too narrow; with
    perfectly ranked data it collapses to (1, 1).
    """
    x, y = _check_xy(x, y, "bootstrap interval of rho")
    with warnings.catch_warnings():  # a degenerate distribution (e.g. perfect ranks) is reported, not warned
        warnings.simplefilter("ignore", stats.DegenerateDataWarning)
        res = stats.bootstrap(
            (x, y), _rank_corr, paired=True, vectorized=True, n_resamples=int(n_boot),
            confidence_level=level, method="percentile", **_rng_kw(stats.bootstrap, seed),
        )
    dist = np.asarray(res.bootstrap_distribution)
    n_undef = int(np.isnan(dist).sum())
    if n_undef == 0:
        lo, hi = res.confidence_interval
    else:
        lo, hi = np.percentile(dist[~np.isnan(dist)], [50 * (1 - level), 50 * (1 + level)])
    return (float(lo), float(hi), n_undef)


@dataclass(frozen=True)
class SpearmanResult:
    """Spearman rho with its permutation p-value and two confidence intervals."""

    rho: float
    n: int
    p_value: float
    p_method: str
    n_null: int
    alternative: str
    ci_level: float
    ci_fisher: tuple[float, float]
    ci_bootstrap: tuple[float, float]
    n_boot_undefined: int


def spearman(
    x: Sequence[float],
    y: Sequence[float],
    *,
    alternative: str = "two-sided",
    exact_max_n: int = 10,
    n_perm: int = 9999,
    n_boot: int = 9999,
    ci_level: float = 0.95,
    fisher_se: str = "bonett-wright",
    seed: int = 0,
) -> SpearmanResult:
    """Spearman rho of (x, y), x = S and y = a task change, one entry per pair.

    rho is ``scipy.stats.spearmanr`` (average ranks for ties); the p-value is a permutation
    test (``spearman_permutation``); the intervals are ``fisher_ci`` (needs n >= 4) and
    ``bootstrap_ci``. Raises PanelError for n < 3, missing values or a constant side.
    """
    x, y = _check_xy(x, y)
    rho = float(stats.spearmanr(x, y).statistic)
    perm = spearman_permutation(x, y, alternative=alternative, exact_max_n=exact_max_n, n_perm=n_perm, seed=seed)
    n = len(x)
    ci_f = fisher_ci(rho, n, level=ci_level, se=fisher_se) if n >= 4 else (float("nan"), float("nan"))
    lo, hi, n_undef = bootstrap_ci(x, y, n_boot=n_boot, level=ci_level, seed=seed)
    return SpearmanResult(
        rho=rho, n=n, p_value=perm.p_value, p_method=perm.method, n_null=perm.n_null,
        alternative=alternative, ci_level=ci_level, ci_fisher=ci_f, ci_bootstrap=(lo, hi),
        n_boot_undefined=n_undef,
    )


def tie_configurations(n: int, rho: float, *, decimals: int = 3, max_n: int = 7) -> pd.DataFrame:
    """Every pair of rank vectors (ties allowed) whose Spearman rho rounds to ``rho``.

    x is taken in sorted order (w.l.o.g.; within a tie of x, y is sorted too), y ranges
    over all weak orderings of n items. Columns: x_ranks, y_ranks, rho, sum_d2 (sum of
    squared rank differences), ties_x / ties_y (number of tied groups). n <= ``max_n``
    (n = 6: 32 x 4,683 candidates).
    """
    if not 2 <= n <= max_n:
        raise PanelError(f"tie_configurations enumerates n^n level vectors; n must be in [2, {max_n}], got {n}")
    levels = np.array(list(itertools.product(range(n), repeat=n)), dtype=float)
    weak = np.unique(stats.rankdata(levels, axis=1), axis=0)  # all weak orderings, as average ranks
    xs = weak[np.all(np.diff(weak, axis=1) >= 0, axis=1)]
    target = round(float(rho), decimals)
    rows = []
    seen = set()
    for x in xs:
        r = _rank_corr(np.broadcast_to(x, weak.shape), weak)
        for i in np.flatnonzero(np.round(r, decimals) == target):
            y = weak[i].copy()
            for v in np.unique(x):  # canonical form: y sorted within ties of x
                m = x == v
                y[m] = np.sort(y[m])
            key = (tuple(x), tuple(y))
            if key in seen:
                continue
            seen.add(key)
            rows.append({
                "x_ranks": tuple(float(a) for a in x), "y_ranks": tuple(float(a) for a in y),
                "rho": float(r[i]), "sum_d2": float(((x - y) ** 2).sum()),
                "ties_x": int(sum(c > 1 for c in np.unique(x, return_counts=True)[1])),
                "ties_y": int(sum(c > 1 for c in np.unique(y, return_counts=True)[1])),
            })
    return pd.DataFrame(rows, columns=["x_ranks", "y_ranks", "rho", "sum_d2", "ties_x", "ties_y"])


def simulate_rho(true_rho: float, n: int, n_sim: int, *, seed: int = 0, scale: str = "spearman") -> np.ndarray:
    """Observed Spearman rho of ``n_sim`` panels of ``n`` pairs from a bivariate normal. Returns [n_sim].

    ``scale="spearman"``: ``true_rho`` is the population Spearman correlation, turned into
    the normal's Pearson correlation r = 2 sin(pi rho / 6); ``scale="pearson"``: used as r.
    """
    if scale not in ("spearman", "pearson"):
        raise PanelError(f"scale must be 'spearman' or 'pearson', got {scale!r}")
    if not -1 <= true_rho <= 1:
        raise PanelError(f"true_rho must be in [-1, 1], got {true_rho}")
    if n < 3 or n_sim < 1:
        raise PanelError(f"simulate_rho needs n >= 3 and n_sim >= 1, got n = {n}, n_sim = {n_sim}")
    r = 2 * math.sin(math.pi * true_rho / 6) if scale == "spearman" else float(true_rho)
    rng = np.random.default_rng(seed)
    z = rng.standard_normal((2, n_sim, n))
    x = z[0]
    y = r * z[0] + math.sqrt(max(0.0, 1 - r * r)) * z[1]
    return _rank_corr(x, y)
