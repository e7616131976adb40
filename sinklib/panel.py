"""Panel statistics: does Sink Strength S rank the text-capability change of VLM-LLM pairs?

The panel itself (CSV schema, validation, measured rows) is `sinklib.panel_schema`; the test of
whether S adds anything beyond the QK-norm type is `sinklib.architecture`. Both are re-exported
here, so `panel.read_panel`, `panel.architecture_test`, ... work. Statistics (scipy / statsmodels
do the work):

* ``spearman``: rho, an exact permutation p-value over all n! orderings for n <= 10
  (Monte Carlo beyond), a bootstrap and a Fisher-z confidence interval;
* ``lopo``: leave-one-pair-out OLS prediction of the change from S against the constant
  baseline, as mean absolute error in points;
* ``per_task``: ``spearman`` for every ``delta_*`` column, never raising on small n;
* ``availability``: for every task, what can be computed and, if not, why;
* ``panel_summary``: all of the above and the architecture test as tables, for a panel of any size.
"""
from __future__ import annotations

import itertools
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .anatomy import QK_NORM_TYPES
from .errors import PanelError
from .panel_schema import (PAPER_CSV, PANEL_KEYS, REQUIRED_COLUMNS, STRICT_TASK, TASK_PREFIX, TINY_STRICT_TASK, collect_panel_rows, read_panel, task_column,
                           task_columns, usable, validate_panel)
from .params import COMMON, check_str, integer, list_of, number, text
from .plots import QK_NORM_COLORS

QK_PALETTE: dict[str, str] = QK_NORM_COLORS  # the book's colours, from sinklib.plots
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


# --------------------------------------------------------------------------- prediction


@dataclass(frozen=True)
class LopoResult:
    """Leave-one-pair-out prediction of a task change from S (OLS) vs the constant baseline."""

    task: str
    n: int
    mae_model: float  # points
    mae_constant: float  # points
    table: pd.DataFrame = field(repr=False)  # pair, observed, pred_model, pred_constant, err_model, err_constant


def lopo(df: pd.DataFrame, task: str, predictor: str = "S") -> LopoResult:
    """Leave each pair out, fit ``task ~ 1 + predictor`` by OLS (statsmodels) on the rest, predict it.

    The constant baseline predicts the mean change of the other pairs; its mean absolute
    error equals n/(n-1) times the mean absolute deviation of the changes. Needs n >= 3
    usable pairs, and ``predictor`` must vary among the n - 1 training pairs of every fold.
    """
    import statsmodels.api as sm

    d = usable(df, task, predictor)
    n = len(d)
    if n < 3:
        raise PanelError(
            f"leave-one-pair-out on {task} needs at least 3 pairs with both {predictor} and {task}, got {n}"
        )
    x = d[predictor].to_numpy(float)
    y = d[task].to_numpy(float)
    rows = []
    for i in range(n):
        keep = np.arange(n) != i
        if np.ptp(x[keep]) == 0:
            raise PanelError(
                f"leave-one-pair-out on {task}: without pair {d['pair'][i]!r} every other pair has "
                f"{predictor} = {x[keep][0]}, so the OLS slope is undefined"
            )
        fit = sm.OLS(y[keep], sm.add_constant(x[keep])).fit()
        pm = float(fit.predict(np.array([[1.0, x[i]]]))[0])
        pc = float(y[keep].mean())
        rows.append({"pair": d["pair"][i], "qk_norm": d["qk_norm"][i], predictor: x[i], "observed": y[i],
                     "pred_model": pm, "pred_constant": pc,
                     "err_model": abs(y[i] - pm), "err_constant": abs(y[i] - pc)})
    t = pd.DataFrame(rows)
    return LopoResult(task=task, n=n, mae_model=float(t["err_model"].mean()),
                      mae_constant=float(t["err_constant"].mean()), table=t)


def constant_lopo_mae(y: Sequence[float]) -> float:
    """Leave-one-out MAE of the constant (mean-of-the-others) prediction: n/(n-1) * mean|y - mean(y)|."""
    y = np.asarray(y, dtype=float)
    if len(y) < 2 or not np.isfinite(y).all():
        raise PanelError(f"constant_lopo_mae needs at least 2 finite values, got {y.tolist()}")
    return float(len(y) / (len(y) - 1) * np.mean(np.abs(y - y.mean())))


# --------------------------------------------------------------------------- per task


def per_task(df: pd.DataFrame, tasks: Sequence[str] | None = None, **spearman_kwargs: Any) -> pd.DataFrame:
    """``spearman(S, change)`` for every task; a task that cannot be computed gets NaNs and a note saying why."""
    tasks = list(tasks) if tasks is not None else task_columns(df)
    rows = []
    for t in tasks:
        d = usable(df, t)
        row: dict[str, Any] = {"task": t, "n": len(d)}
        try:
            r = spearman(d["S"], d[t], **spearman_kwargs)
        except PanelError as e:
            row.update(rho=np.nan, p_value=np.nan, p_method="", ci_fisher_lo=np.nan, ci_fisher_hi=np.nan,
                       ci_boot_lo=np.nan, ci_boot_hi=np.nan, note=str(e))
        else:
            row.update(rho=r.rho, p_value=r.p_value, p_method=r.p_method,
                       ci_fisher_lo=r.ci_fisher[0], ci_fisher_hi=r.ci_fisher[1],
                       ci_boot_lo=r.ci_bootstrap[0], ci_boot_hi=r.ci_bootstrap[1],
                       note="" if r.n >= 4 else "Fisher interval needs n >= 4")
        rows.append(row)
    return pd.DataFrame(rows)


# --------------------------------------------------------------------------- what can be computed


def availability(df: pd.DataFrame, tasks: Sequence[str] | None = None) -> pd.DataFrame:
    """Per task: how many pairs have the change, how many also have S, and what can be computed (or why not)."""
    tasks = list(tasks) if tasks is not None else task_columns(df)
    rows = []
    for t in tasks:
        d = usable(df, t)
        n = len(d)
        n_change = int(df[t].notna().sum())
        if n < 3:
            why = (f"needs >= 3 pairs with both S and the change; have {n}"
                   + (f" ({n_change - n} more have the change but no S)" if n_change > n else ""))
            rho = loo = arch = why
        else:
            const = [c for c in ("S", t) if np.ptp(d[c].to_numpy(float)) == 0]
            rho = "yes" if not const else f"no: {const[0]} is constant"
            loo = rho
            k = d["qk_norm"].nunique()
            arch = rho if k > 1 else "only one QK-norm type: reduces to S alone"
            if rho == "yes" and n - k - 1 <= 0:
                arch = f"partial rho only: {n} pairs leave no residual df for the nested F test"
        rows.append({"task": t, "pairs_with_change": n_change, "pairs_with_S_and_change": n,
                     "spearman": rho, "lopo": loo, "architecture": arch})
    return pd.DataFrame(rows)


def panel_summary(
    df: pd.DataFrame, tasks: Sequence[str] | None = None, *, seed: int = 0, **spearman_kwargs: Any
) -> dict[str, pd.DataFrame]:
    """Every statistic of this module on one panel, as tables; never raises for a small panel.

    Keys: ``availability``, ``rho`` (``per_task``), ``lopo`` (task, n, mae_model,
    mae_constant, note), ``architecture`` (task, n, F/LR/partial-rho p-values, ...,
    note), ``caveats`` (task, caveat). A statistic that cannot be computed has NaNs and a
    note saying why. ``spearman_kwargs`` go to ``spearman`` (n_boot, n_perm, ...).
    """
    tasks = list(tasks) if tasks is not None else task_columns(df)
    lo_rows, ar_rows, cav_rows = [], [], []
    for t in tasks:
        n = len(usable(df, t))
        try:
            r = lopo(df, t)
            lo_rows.append({"task": t, "n": n, "mae_model": r.mae_model, "mae_constant": r.mae_constant, "note": ""})
        except PanelError as e:
            lo_rows.append({"task": t, "n": n, "mae_model": np.nan, "mae_constant": np.nan, "note": str(e)})
        try:
            a = architecture_test(df, t, seed=seed)
            ar_rows.append({"task": t, "n": n, "groups": ", ".join(f"{g}: {c}" for g, c in a.group_sizes.items()),
                            "r2_arch": a.r2_architecture, "r2_arch_plus_S": a.r2_full,
                            "r2_S_on_arch": a.r2_S_on_architecture, "df_resid": a.df_resid_full,
                            "F_p": a.f_pvalue, "LR_p": a.lr_pvalue, "partial_rho": a.partial_rho,
                            "partial_p": a.partial_p, "min_attainable_p": a.min_attainable_p, "note": ""})
            cav_rows.extend({"task": t, "caveat": c} for c in a.caveats)
        except PanelError as e:
            ar_rows.append({"task": t, "n": n, "note": str(e)})
    return {
        "availability": availability(df, tasks),
        "rho": per_task(df, tasks, seed=seed, **spearman_kwargs),
        "lopo": pd.DataFrame(lo_rows, columns=["task", "n", "mae_model", "mae_constant", "note"]),
        "architecture": pd.DataFrame(ar_rows, columns=[
            "task", "n", "groups", "r2_arch", "r2_arch_plus_S", "r2_S_on_arch", "df_resid", "F_p", "LR_p",
            "partial_rho", "partial_p", "min_attainable_p", "note"]),
        "caveats": pd.DataFrame(cav_rows, columns=["task", "caveat"]),
    }




def measured_statistic(summary: dict[str, pd.DataFrame] | None, stat: str, tasks: Sequence[str] = (STRICT_TASK,)) -> str:
    """One statistic of a measured panel's `panel_summary` as text: 'rho' (with n, task, p) or 'lopo'
    (model vs constant MAE), on the first of `tasks` the summary has (else its first task)."""
    if summary is None:
        return "n/a: no measured pairs (run chapter 4)"
    rho_t = summary["rho"].set_index("task")
    lopo_t = summary["lopo"].set_index("task")
    task = next((t for t in tasks if t in rho_t.index), rho_t.index[0] if len(rho_t) else None)
    if task is None:
        return "n/a: no task columns"
    if stat == "rho":
        r = rho_t.loc[task]
        return f"{r['rho']:.3f} (n = {r['n']}, {task}, p = {r['p_value']:.3g})" if np.isfinite(r["rho"]) else f"n/a: {r['note']}"
    r = lopo_t.loc[task]
    return (f"{r['mae_model']:.2f} pt vs {r['mae_constant']:.2f} pt (n = {r['n']}, {task})"
            if np.isfinite(r["mae_model"]) else f"n/a: {r['note']}")


def architecture_statistic(summary: dict[str, pd.DataFrame] | None, task: str = STRICT_TASK) -> str:
    """The architecture test of one task of a `panel_summary` as text: the partial rho of S with its
    within-variant permutation p-value and the nested F-test's p-value (or why they are missing)."""
    if summary is None:
        return "n/a: no measured panel"
    ar = summary["architecture"].set_index("task")
    if task not in ar.index:
        return f"n/a: no column {task}"
    r = ar.loc[task]
    if not np.isfinite(r.get("partial_rho", np.nan)):
        return f"n/a: {r['note']}"
    return (f"partial rho of S given the QK-norm variant {r['partial_rho']:+.2f} (within-variant permutation "
            f"p = {r['partial_p']:.3g}); nested F-test of S beyond the variant p = {r['F_p']:.3g} (n = {int(r['n'])})")


# --------------------------------------------------------------------------- the parameters of chapter 5


def _panel_csv(name: str, value: Any) -> str:
    value = check_str(name, value, nonempty=False)
    if value.strip() and not Path(value).is_file():
        raise PanelError(f"parameter {name!r} = {value!r}: no such file; use '' for data/paper_reported.csv")
    return value


CHAPTER5_PARAMS = {
    "seed": integer(0), "n_sim": integer(100), "true_rhos": list_of(number(-1.0, 1.0)),
    "panel_sizes": list_of(integer(3, 1000)), "n_boot": integer(99), "n_perm": integer(99),
    "exact_max_n": integer(3, 10), "ci_level": number(0.5, 0.999), "panel_csv": _panel_csv,
    "results_dir": text(nonempty=False), **COMMON}

from .architecture import ArchitectureResult, architecture_test, partial_spearman  # noqa: E402  (uses this module)
from .plots import scatter_panel  # noqa: E402
from .panel_display import TASK_ABBREVIATIONS, availability_table, panel_tables, summary_tables, task_label  # noqa: E402

__all__ = [
    "REQUIRED_COLUMNS", "TASK_PREFIX", "QK_NORM_TYPES", "PAPER_CSV", "QK_PALETTE", "STRICT_TASK", "architecture_statistic", "TINY_STRICT_TASK", "PANEL_KEYS",
    "task_column", "task_columns", "measured_statistic", "CHAPTER5_PARAMS", "validate_panel", "read_panel",
    "collect_panel_rows", "usable", "rho_from_d2", "d2_from_rho", "PermutationResult", "spearman_permutation",
    "rho_null", "pvalue_from_null", "fisher_ci", "bootstrap_ci", "SpearmanResult", "spearman",
    "tie_configurations", "simulate_rho", "LopoResult", "lopo", "constant_lopo_mae", "per_task",
    "partial_spearman", "ArchitectureResult", "architecture_test", "availability", "panel_summary",
    "scatter_panel", "TASK_ABBREVIATIONS", "task_label", "panel_tables", "availability_table", "summary_tables",
]
