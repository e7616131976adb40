"""Panel statistics: does Sink Strength S rank the text-capability change of VLM-LLM pairs?

The panel itself (CSV schema, validation, measured rows) is `sinklib.stats.schema`; the test of
whether S adds anything beyond the QK-norm type is `sinklib.stats.architecture`. Both are re-exported
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

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from sinklib.core.anatomy import QK_NORM_TYPES
from sinklib.errors import PanelError
from sinklib.stats.schema import (PAPER_CSV, PANEL_KEYS, REQUIRED_COLUMNS, STRICT_TASK, TASK_PREFIX,
    TINY_STRICT_TASK, collect_panel_rows, read_panel, task_column, task_columns, task_name, usable, validate_panel)
from sinklib.core.params import COMMON, check_str, integer, list_of, number, text

from sinklib.stats.architecture import LR_MIN_DF, ArchitectureResult, architecture_test, partial_spearman
from sinklib.stats.rank import (PermutationResult, SpearmanResult, bootstrap_ci,
    d2_from_rho, fisher_ci, pvalue_from_null, rho_from_d2, rho_null, simulate_rho, spearman, spearman_permutation,
    tie_configurations)

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
            f"leave-one-pair-out on {task_name(task)} needs at least 3 pairs with both {predictor} and the change, got {n}"
        )
    x = d[predictor].to_numpy(float)
    y = d[task].to_numpy(float)
    rows = []
    for i in range(n):
        keep = np.arange(n) != i
        if np.ptp(x[keep]) == 0:
            raise PanelError(
                f"leave-one-pair-out on {task_name(task)}: without pair {d['pair'][i]!r} every other pair has "
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
    """One statistic of a measured panel's `panel_summary` as text: 'rho' (with n, the task in words, p) or 'lopo'
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
        return (f"{r['rho']:.3f} (n = {r['n']}, {task_name(task)}, two-sided p = {r['p_value']:.3g})"
                if np.isfinite(r["rho"]) else f"n/a: {r['note']}")
    r = lopo_t.loc[task]
    return (f"{r['mae_model']:.2f} pt vs {r['mae_constant']:.2f} pt (n = {r['n']}, {task_name(task)})"
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

__all__ = [
    "REQUIRED_COLUMNS", "TASK_PREFIX", "QK_NORM_TYPES", "PAPER_CSV", "STRICT_TASK", "architecture_statistic", "TINY_STRICT_TASK", "PANEL_KEYS",
    "task_column", "task_columns", "task_name", "measured_statistic", "CHAPTER5_PARAMS", "validate_panel", "read_panel",
    "collect_panel_rows", "usable", "rho_from_d2", "d2_from_rho", "PermutationResult", "spearman_permutation",
    "rho_null", "pvalue_from_null", "fisher_ci", "bootstrap_ci", "SpearmanResult", "spearman",
    "tie_configurations", "simulate_rho", "LopoResult", "lopo", "constant_lopo_mae", "per_task",
    "partial_spearman", "LR_MIN_DF", "ArchitectureResult", "architecture_test", "availability", "panel_summary",
]
