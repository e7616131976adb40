"""Does S add anything beyond the QK-norm type? Nested OLS models (change ~ qk_norm against
change ~ qk_norm + S), a partial Spearman correlation with an exact within-architecture
permutation p-value, and small-n caveats computed from the panel.
"""
from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy import stats

from sinklib.core.anatomy import QK_NORM_TYPES
from sinklib.errors import PanelError
from sinklib.stats.rank import _check_alternative, _check_xy, pvalue_from_null
from sinklib.stats.schema import task_name, usable


def _dummies(groups: Sequence[str]) -> np.ndarray:
    """Intercept + treatment dummies of the groups: [n, k]."""
    g = np.asarray(groups, dtype=object)
    levels = sorted(set(g), key=lambda v: QK_NORM_TYPES.index(v) if v in QK_NORM_TYPES else len(QK_NORM_TYPES))
    cols = [np.ones(len(g))] + [(g == lv).astype(float) for lv in levels[1:]]
    return np.column_stack(cols)


def _residual_maker(groups: Sequence[str]) -> np.ndarray:
    """M = I - D (D'D)^+ D': residuals after removing group means. [n, n]"""
    d = _dummies(groups)
    return np.eye(len(d)) - d @ np.linalg.pinv(d)


def partial_spearman(x: Sequence[float], y: Sequence[float], groups: Sequence[str]) -> float:
    """Spearman rho of x and y controlling for a categorical ``groups``.

    Both are turned into ranks over the whole panel, the group means are removed from the
    ranks (OLS on group dummies), and the residuals are correlated (Pearson). NaN when
    either residual is zero (x or y constant within every group).
    """
    x, y = _check_xy(x, y, "partial Spearman rho")
    m = _residual_maker(groups)
    ex, ey = m @ stats.rankdata(x), m @ stats.rankdata(y)
    if np.allclose(ex, 0) or np.allclose(ey, 0):
        return float("nan")
    return float(stats.pearsonr(ex, ey).statistic)


@dataclass(frozen=True)
class ArchitectureResult:
    """Does S add anything beyond the QK-norm type? Nested models, partial rho, caveats."""

    task: str
    n: int
    group_sizes: dict[str, int]
    r2_architecture: float  # R^2 of change ~ qk_norm
    r2_full: float  # R^2 of change ~ qk_norm + S
    r2_S_on_architecture: float  # how much of S the architecture already explains
    df_resid_full: int
    f_stat: float
    f_pvalue: float
    lr_stat: float
    lr_pvalue: float
    partial_rho: float
    partial_p: float
    partial_p_method: str
    n_within_orderings: int  # distinct within-architecture orderings of S (prod of n_g!)
    min_attainable_p: float  # smallest p the within-architecture permutation test can reach
    caveats: list[str]
    anova: pd.DataFrame | None = field(default=None, repr=False)


def _within_group_null(rx: np.ndarray, ey: np.ndarray, mres: np.ndarray, groups: Sequence[str],
                       sizes: dict[str, int], exact_max: int, n_perm: int, seed: int) -> tuple[np.ndarray, str]:
    """Null distribution of the partial rho when S's ranks `rx` are permuted within groups only:
    all prod(n_g!) orderings ("exact") when that is <= exact_max, else `n_perm` random ones."""
    n = len(rx)
    idx_groups = [np.flatnonzero(np.asarray(groups, dtype=object) == g) for g in sizes]
    if int(np.prod([math.factorial(c) for c in sizes.values()])) <= exact_max:
        perms = []
        for combo in itertools.product(*(itertools.permutations(ix) for ix in idx_groups)):
            p = np.arange(n)
            for ix, c in zip(idx_groups, combo):
                p[ix] = c
            perms.append(p)
        perm_idx = np.array(perms)
        method = "exact"
    else:
        rng = np.random.default_rng(seed)
        perm_idx = np.tile(np.arange(n), (int(n_perm), 1))
        for ix in idx_groups:
            perm_idx[:, ix] = rng.permuted(np.tile(ix, (int(n_perm), 1)), axis=1)
        method = "monte carlo"
    ex = rx[perm_idx] @ mres.T  # [m, n]
    with np.errstate(invalid="ignore", divide="ignore"):
        return (ex @ ey) / np.sqrt((ex * ex).sum(axis=1) * (ey @ ey)), method


def _min_attainable_p(null: np.ndarray, method: str, alternative: str, n_orders: int) -> float:
    """The smallest p-value the within-architecture permutation test can give on this panel."""
    if method != "exact":
        return (1 if alternative != "two-sided" else 2) / n_orders
    extreme = null.max() if alternative != "less" else null.min()
    min_p = pvalue_from_null(float(extreme), null, alternative=alternative)
    if alternative == "two-sided":
        min_p = min(min_p, pvalue_from_null(float(null.min()), null, alternative="two-sided"))
    return min_p


def architecture_test(
    df: pd.DataFrame,
    task: str,
    *,
    alternative: str = "two-sided",
    exact_max: int = 200_000,
    n_perm: int = 9999,
    seed: int = 0,
    level: float = 0.05,
) -> ArchitectureResult:
    """Compare ``change ~ C(qk_norm)`` with ``change ~ C(qk_norm) + S`` and compute the partial Spearman rho.

    Nested OLS (statsmodels): F test (``anova_lm``) and likelihood-ratio test
    (``compare_lr_test``); both are NaN when the full model leaves no residual degree of
    freedom or S is collinear with the architecture, the LR test also below ``LR_MIN_DF`` of them. The partial rho's p-value permutes S
    only *within* architecture groups (the null "S adds nothing beyond the QK-norm type"):
    exact over all prod(n_g!) orderings when that is <= ``exact_max``, Monte Carlo otherwise.
    ``caveats`` states, in numbers, what this n can and cannot show at significance ``level``.
    """
    _check_alternative(alternative)
    d = usable(df, task)
    n = len(d)
    if n < 3:
        raise PanelError(f"the architecture test on {task_name(task)} needs at least 3 pairs with both S and the change, "
                         f"got {n}")
    x = d["S"].to_numpy(float)
    y = d[task].to_numpy(float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        raise PanelError(f"the architecture test on {task_name(task)} is undefined: S or the change is constant over "
                         f"the {n} pairs")
    groups = d["qk_norm"].tolist()
    sizes = {g: int(c) for g, c in pd.Series(groups).value_counts().items()}
    sizes = {g: sizes[g] for g in QK_NORM_TYPES if g in sizes}
    nested = _nested_ols(x, y, groups, len(sizes))
    caveats = _design_caveats(n, sizes, groups, nested)
    partial = _partial_permutation(x, y, groups, sizes, alternative, exact_max, n_perm, seed, level)
    caveats += partial.pop("caveats")
    return ArchitectureResult(task=task, n=n, group_sizes=sizes, caveats=caveats, **nested["result"], **partial)


#: the likelihood-ratio test's chi-square approximation is not reported below this many residual degrees of
#: freedom (on four pairs and one, it gave p 4e-05 where the F test, exact for normal errors, gave 0.08)
LR_MIN_DF = 5


def _nested_ols(x: np.ndarray, y: np.ndarray, groups: list[str], k: int) -> dict:
    """change ~ C(qk_norm) against change ~ C(qk_norm) + S: fits, ranks, F and likelihood-ratio tests (NaN
    when S is collinear with the architecture or no residual degree of freedom is left)."""
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    data = pd.DataFrame({"y": y, "S": x, "qk": groups})
    arch_formula = "y ~ C(qk)" if k > 1 else "y ~ 1"
    m0 = smf.ols(arch_formula, data).fit()
    with warnings.catch_warnings():  # rank deficiency is detected below and reported as a caveat
        warnings.simplefilter("ignore")
        m1 = smf.ols(arch_formula + " + S", data).fit()
    rank_full = int(np.linalg.matrix_rank(m1.model.exog))
    collinear = rank_full < m1.model.exog.shape[1]
    df_resid = len(y) - rank_full
    s_on_arch = smf.ols("S ~ C(qk)", data).fit().rsquared if k > 1 else 0.0
    f_stat = f_p = lr = lr_p = float("nan")
    table = None
    if not (collinear or df_resid <= 0):
        table = anova_lm(m0, m1)
        f_stat, f_p = float(table["F"].iloc[1]), float(table["Pr(>F)"].iloc[1])
        if df_resid >= LR_MIN_DF:
            lr, lr_p, _ = m1.compare_lr_test(m0)
            lr, lr_p = float(lr), float(lr_p)
    return {"n_coef": m1.model.exog.shape[1], "collinear": collinear, "r2_arch": float(m0.rsquared),
            "result": dict(r2_architecture=float(m0.rsquared), r2_full=float(m1.rsquared),
                           r2_S_on_architecture=float(s_on_arch), df_resid_full=int(df_resid), f_stat=f_stat,
                           f_pvalue=f_p, lr_stat=lr, lr_pvalue=lr_p, anova=table)}


def _design_caveats(n: int, sizes: dict[str, int], groups: list[str], nested: dict) -> list[str]:
    """What this panel's design can and cannot show, in numbers (the nested models' part)."""
    k, r = len(sizes), nested["result"]
    df_resid = r["df_resid_full"]
    caveats = [
        f"n = {n} pairs in {k} QK-norm group(s) ({', '.join(f'{g}: {c}' for g, c in sizes.items())}); "
        f"the model change ~ architecture + S has {nested['n_coef']} coefficients and "
        f"{df_resid} residual degree(s) of freedom."
    ]
    if k == 1:
        caveats.append(f"All pairs share qk_norm = {groups[0]!r}: the architecture question cannot be asked "
                       "on this panel; the nested test reduces to 'does S predict the change at all'.")
    else:
        caveats.append(f"The architecture alone explains {r['r2_S_on_architecture']:.0%} of the variance of S "
                       f"(R^2 of S ~ qk_norm) and {nested['r2_arch']:.0%} of the variance of the change.")
    singles = [g for g, c in sizes.items() if c == 1]
    if singles:
        caveats.append(f"{len(singles)} of {k} group(s) ({', '.join(singles)}) hold a single pair and carry no "
                       "within-architecture information about S.")
    if nested["collinear"] or df_resid <= 0:
        caveats.append("S is a linear function of the architecture on this panel (collinear): the nested models "
                       "cannot be told apart." if nested["collinear"] else
                       "The full model fits every pair exactly (no residual degrees of freedom): no F or "
                       "likelihood-ratio test is possible.")
    elif df_resid < LR_MIN_DF:
        caveats.append(f"With {df_resid} residual degree(s) of freedom the F test's p-value rests almost entirely "
                       "on the assumption of normal errors, and the likelihood-ratio test is not reported (its "
                       f"chi-square approximation needs at least {LR_MIN_DF}).")
    return caveats


def _partial_permutation(x: np.ndarray, y: np.ndarray, groups: list[str], sizes: dict[str, int], alternative: str,
                         exact_max: int, n_perm: int, seed: int, level: float) -> dict:
    """Partial Spearman rho of S and the change given the architecture, with its within-group permutation p."""
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    mres = _residual_maker(groups)
    ey = mres @ ry
    n_orders = int(np.prod([math.factorial(c) for c in sizes.values()]))
    obs = partial_spearman(x, y, groups)
    if math.isnan(obs):
        part_p, method, min_p = float("nan"), "", float("nan")
        caveats = ["S (or the change) does not vary within any architecture group, so the partial "
                   "Spearman rho is undefined."]
    else:
        null, method = _within_group_null(rx, ey, mres, groups, sizes, exact_max, n_perm, seed)
        part_p = pvalue_from_null(obs, null, alternative=alternative, monte_carlo=method == "monte carlo")
        min_p = _min_attainable_p(null, method, alternative, n_orders)
        caveats = [f"S can be reordered within architecture groups in only {n_orders} way(s), so no "
                   f"within-architecture permutation test can give p below {min_p:.3g}"
                   + (f" (above {level}: this panel cannot show that S adds to the architecture, "
                      "whatever the data)." if min_p > level else ".")]
    return dict(partial_rho=obs, partial_p=part_p, partial_p_method=method, n_within_orderings=n_orders,
                min_attainable_p=float(min_p), caveats=caveats)
