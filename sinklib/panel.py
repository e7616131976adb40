"""Panel statistics: does Sink Strength S rank the text-capability change of VLM-LLM pairs?

A *panel* is one row per VLM-LLM pair. The CSV schema (``validate_panel`` enforces it):

=========  ========  ===========================================================
column     type      meaning
=========  ========  ===========================================================
pair       str       unique short id of the pair, e.g. ``qwen2.5-vl``
vlm        str       the vision-language model (may be empty when unnamed)
llm        str       the reference LLM whose S is measured (may be empty)
S          float     Sink Strength of the reference LLM (empty = not measured)
qk_norm    str       QK-norm type of the backbone: ``none``, ``per_head``, ``layerwise``
delta_*    float     one column per task: post-VL score minus pre-VL score, in points
                     (empty = not reported / not measured)
source     str       where the row's numbers come from (non-empty)
=========  ========  ===========================================================

Other columns (``note``, ``results_file``) are carried along and ignored by the statistics.

Statistics (scipy / statsmodels do the work):

* ``spearman``: rho, an exact permutation p-value over all n! orderings for n <= 10
  (Monte Carlo beyond), a bootstrap and a Fisher-z confidence interval;
* ``lopo``: leave-one-pair-out OLS prediction of the change from S against the constant
  baseline, as mean absolute error in points;
* ``per_task``: ``spearman`` for every ``delta_*`` column, never raising on small n;
* ``architecture_test``: does S add anything beyond the QK-norm type? Nested OLS models,
  a partial Spearman correlation with an exact within-architecture permutation p-value,
  and small-n caveats computed from the panel;
* ``availability``: for every task, what can be computed and, if not, why;
* ``panel_summary``: all of the above as tables, for a panel of any size.
"""
from __future__ import annotations

import csv
import itertools
import json
import math
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from .resources import data_path, results_dir as _default_results_dir
from .errors import PanelError
from .plots import QK_NORM_COLORS

REQUIRED_COLUMNS: tuple[str, ...] = ("pair", "vlm", "llm", "S", "qk_norm", "source")
TASK_PREFIX = "delta_"
QK_NORM_TYPES: tuple[str, ...] = ("none", "per_head", "layerwise")
PAPER_CSV: Path = data_path("paper_reported.csv")
QK_PALETTE: dict[str, str] = QK_NORM_COLORS  # the book's colours, from sinklib.plots
_ALTERNATIVES = ("two-sided", "greater", "less")
_FISHER_SE = ("bonett-wright", "fieller", "pearson")


# --------------------------------------------------------------------------- schema


def task_columns(df: pd.DataFrame) -> list[str]:
    """The task-change columns of a panel (names starting with ``delta_``), in column order."""
    return [c for c in df.columns if str(c).startswith(TASK_PREFIX)]


def _is_blank(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return isinstance(v, str) and not v.strip()


def _label(df: pd.DataFrame, i: int) -> str:
    pair = df["pair"].iloc[i] if "pair" in df.columns else None
    return f"row {i + 1}" + ("" if _is_blank(pair) else f" (pair {str(pair).strip()!r})")


def validate_panel(df: pd.DataFrame, *, min_rows: int = 0, where: str = "panel") -> pd.DataFrame:
    """Check a panel against the schema and return a cleaned copy.

    Cleaned: strings stripped, ``S`` and ``delta_*`` as float (blank -> NaN), index 0..n-1.
    Raises PanelError naming the problem: a missing column, no task column, an empty or
    duplicate pair id, an unknown qk_norm value, a non-numeric or infinite number, an
    empty source, or fewer than ``min_rows`` rows. ``where`` names the panel in messages.
    """
    if not isinstance(df, pd.DataFrame):
        raise PanelError(f"{where}: expected a pandas DataFrame, got {type(df).__name__}")
    dup_cols = sorted({str(c) for c in df.columns if list(df.columns).count(c) > 1})
    if dup_cols:
        raise PanelError(f"{where}: duplicate column name(s) {dup_cols}; each column may appear once")
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise PanelError(
            f"{where}: missing column(s) {missing}; a panel needs {list(REQUIRED_COLUMNS)} "
            f"plus at least one '{TASK_PREFIX}<task>' column; found {list(map(str, df.columns))}"
        )
    tasks = task_columns(df)
    if not tasks:
        raise PanelError(
            f"{where}: no task-change column; add at least one column named "
            f"'{TASK_PREFIX}<task>' (e.g. {TASK_PREFIX}ifeval) holding the change in points"
        )
    out = df.copy().reset_index(drop=True)
    for c in out.columns:
        if c not in ("S", *tasks):
            out[c] = [v.strip() if isinstance(v, str) else v for v in out[c]]

    blank_pairs = [_label(out, i) for i, v in enumerate(out["pair"]) if _is_blank(v)]
    if blank_pairs:
        raise PanelError(f"{where}: empty pair id in {', '.join(blank_pairs)}; every row needs one")
    out["pair"] = out["pair"].astype(str)
    dup = out["pair"][out["pair"].duplicated(keep=False)]
    if len(dup):
        rows = {p: [i + 1 for i in dup.index[dup == p]] for p in dict.fromkeys(dup)}
        desc = "; ".join(f"{p!r} in rows {r}" for p, r in rows.items())
        raise PanelError(f"{where}: duplicate pair id(s): {desc}; each pair may appear once")

    bad_qk = [
        f"{_label(out, i)}: {v!r}" for i, v in enumerate(out["qk_norm"]) if _is_blank(v) or v not in QK_NORM_TYPES
    ]
    if bad_qk:
        raise PanelError(f"{where}: qk_norm must be one of {list(QK_NORM_TYPES)}; got {'; '.join(bad_qk)}")

    for c in ("S", *tasks):
        col = out[c]
        values: list[float] = []
        bad: list[str] = []
        for i, v in enumerate(col):
            if _is_blank(v):
                values.append(float("nan"))
                continue
            try:
                if isinstance(v, bool):
                    raise ValueError
                f = float(v.strip()) if isinstance(v, str) else float(v)
            except (TypeError, ValueError):
                bad.append(f"{_label(out, i)}: {v!r}")
                continue
            if not math.isfinite(f):
                bad.append(f"{_label(out, i)}: {v!r} (not finite)")
                continue
            values.append(f)
        if bad:
            raise PanelError(
                f"{where}: column {c!r} must hold numbers (leave a cell empty when the value "
                f"is unknown); non-numeric value(s): {'; '.join(bad)}"
            )
        out[c] = np.asarray(values, dtype=float)

    blank_src = [_label(out, i) for i, v in enumerate(out["source"]) if _is_blank(v)]
    if blank_src:
        raise PanelError(f"{where}: empty source in {', '.join(blank_src)}; say where each row's numbers come from")
    for c in ("vlm", "llm"):
        out[c] = ["" if _is_blank(v) else str(v) for v in out[c]]

    if len(out) < min_rows:
        raise PanelError(
            f"{where}: {len(out)} pair(s) ({', '.join(out['pair']) or 'none'}); "
            f"at least {min_rows} are needed"
        )
    return out


def read_panel(path: str | Path | None = None, *, min_rows: int = 0) -> pd.DataFrame:
    """Read and validate a panel CSV (``None`` or ``""``: ``data/paper_reported.csv``)."""
    p = PAPER_CSV if path is None or (isinstance(path, str) and not path.strip()) else Path(path)
    if not p.is_file():
        raise PanelError(f"panel CSV {str(p)!r} does not exist; pass an existing file or '' for {PAPER_CSV.name}")
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            lines = [r for r in csv.reader(fh) if any(c.strip() for c in r)]
    except (csv.Error, UnicodeDecodeError) as e:
        raise PanelError(f"panel CSV {str(p)!r} cannot be parsed as CSV: {e}") from None
    if not lines:
        raise PanelError(f"panel CSV {str(p)!r} is empty; it needs a header row {list(REQUIRED_COLUMNS)} + delta_* columns")
    header = [h.strip() for h in lines[0]]
    ragged = [f"line {i + 2} has {len(r)} fields" for i, r in enumerate(lines[1:]) if len(r) != len(header)]
    if ragged:
        raise PanelError(f"panel CSV {p.name}: the header has {len(header)} columns but {'; '.join(ragged)} "
                         "(quote values that contain commas)")
    raw = pd.DataFrame(lines[1:], columns=header, dtype=object)
    return validate_panel(raw, min_rows=min_rows, where=f"panel CSV {p.name}")


def _results_dir(results_dir: str | Path | None) -> Path:
    if results_dir is not None:
        return Path(results_dir)
    return _default_results_dir(create=False)


def collect_panel_rows(results_dir: str | Path | None = None) -> pd.DataFrame:
    """All measured pairs: ``results.panel_rows`` of every ``*.json`` in the results folder.

    The folder is ``results_dir``, else ``sinklib.resources.results_dir()``. Files
    without ``panel_rows`` are skipped; a ``results_file`` column names each row's file.
    Returns an empty frame with the schema columns when there are no rows; the rows found
    are validated (PanelError names the file on a malformed JSON or a bad row).
    """
    d = _results_dir(results_dir)
    rows: list[dict] = []
    for f in sorted(d.glob("*.json")) if d.is_dir() else []:
        try:
            doc = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise PanelError(f"results file {str(f)!r} is not valid JSON: {e}") from None
        res = doc.get("results") if isinstance(doc, dict) else None
        pr = res.get("panel_rows") if isinstance(res, dict) else None
        if pr is None:
            continue
        if not isinstance(pr, list) or not all(isinstance(r, dict) for r in pr):
            raise PanelError(f"results file {f.name}: results.panel_rows must be a list of objects (one per pair)")
        rows.extend({**r, "results_file": f.name} for r in pr)
    if not rows:
        return pd.DataFrame(columns=[*REQUIRED_COLUMNS, "results_file"])
    return validate_panel(pd.DataFrame(rows), where=f"measured panel in {d}")


def usable(df: pd.DataFrame, task: str, predictor: str = "S") -> pd.DataFrame:
    """The rows of a validated panel where both ``predictor`` and ``task`` are present."""
    for c in (predictor, task):
        if c not in df.columns:
            raise PanelError(f"panel has no column {c!r}; task columns are {task_columns(df)}")
    return df[df[predictor].notna() & df[task].notna()].reset_index(drop=True)


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
    n = 10 takes about 15 s on one core); beyond, ``n_perm`` random orderings (Monte
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


# --------------------------------------------------------------------------- architecture


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
    freedom or S is collinear with the architecture. The partial rho's p-value permutes S
    only *within* architecture groups (the null "S adds nothing beyond the QK-norm type"):
    exact over all prod(n_g!) orderings when that is <= ``exact_max``, Monte Carlo otherwise.
    ``caveats`` states, in numbers, what this n can and cannot show at significance ``level``.
    """
    import statsmodels.formula.api as smf
    from statsmodels.stats.anova import anova_lm

    _check_alternative(alternative)
    d = usable(df, task)
    n = len(d)
    if n < 3:
        raise PanelError(f"the architecture test on {task} needs at least 3 pairs with S and {task}, got {n}")
    x = d["S"].to_numpy(float)
    y = d[task].to_numpy(float)
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        raise PanelError(f"the architecture test on {task} is undefined: S or {task} is constant over the {n} pairs")
    groups = d["qk_norm"].tolist()
    sizes = {g: int(c) for g, c in pd.Series(groups).value_counts().items()}
    sizes = {g: sizes[g] for g in QK_NORM_TYPES if g in sizes}
    k = len(sizes)
    data = pd.DataFrame({"y": y, "S": x, "qk": groups})
    arch_formula = "y ~ C(qk)" if k > 1 else "y ~ 1"
    m0 = smf.ols(arch_formula, data).fit()
    with warnings.catch_warnings():  # rank deficiency is detected below and reported as a caveat
        warnings.simplefilter("ignore")
        m1 = smf.ols(arch_formula + " + S", data).fit()
    rank_full = int(np.linalg.matrix_rank(m1.model.exog))
    collinear = rank_full < m1.model.exog.shape[1]
    df_resid = n - rank_full
    s_on_arch = smf.ols("S ~ C(qk)", data).fit().rsquared if k > 1 else 0.0

    caveats = [
        f"n = {n} pairs in {k} QK-norm group(s) ({', '.join(f'{g}: {c}' for g, c in sizes.items())}); "
        f"the model change ~ architecture + S has {m1.model.exog.shape[1]} coefficients and "
        f"{df_resid} residual degree(s) of freedom."
    ]
    if k == 1:
        caveats.append(f"All pairs share qk_norm = {groups[0]!r}: the architecture question cannot be asked "
                       "on this panel; the nested test reduces to 'does S predict the change at all'.")
    else:
        caveats.append(f"The architecture alone explains {s_on_arch:.0%} of the variance of S "
                       f"(R^2 of S ~ qk_norm) and {m0.rsquared:.0%} of the variance of the change.")
    singles = [g for g, c in sizes.items() if c == 1]
    if singles:
        caveats.append(f"{len(singles)} of {k} group(s) ({', '.join(singles)}) hold a single pair and carry no "
                       "within-architecture information about S.")

    if collinear or df_resid <= 0:
        f_stat = f_p = lr = lr_p = float("nan")
        table = None
        caveats.append("S is a linear function of the architecture on this panel (collinear): the nested models "
                       "cannot be told apart." if collinear else
                       "The full model fits every pair exactly (no residual degrees of freedom): no F or "
                       "likelihood-ratio test is possible.")
    else:
        table = anova_lm(m0, m1)
        f_stat, f_p = float(table["F"].iloc[1]), float(table["Pr(>F)"].iloc[1])
        lr, lr_p, _ = m1.compare_lr_test(m0)
        lr, lr_p = float(lr), float(lr_p)
        if df_resid < 5:
            caveats.append(f"With {df_resid} residual degree(s) of freedom the F and likelihood-ratio p-values "
                           "rest almost entirely on the assumption of normal errors (the LR test's chi-square "
                           "approximation is also poor at this n).")

    # partial Spearman with a within-architecture permutation test
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    mres = _residual_maker(groups)
    ey = mres @ ry
    n_orders = int(np.prod([math.factorial(c) for c in sizes.values()]))
    obs = partial_spearman(x, y, groups)
    if math.isnan(obs):
        part_p, method, min_p = float("nan"), "", float("nan")
        caveats.append("S (or the change) does not vary within any architecture group, so the partial "
                       "Spearman rho is undefined.")
    else:
        idx_groups = [np.flatnonzero(np.asarray(groups, dtype=object) == g) for g in sizes]
        if n_orders <= exact_max:
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
            null = (ex @ ey) / np.sqrt((ex * ex).sum(axis=1) * (ey @ ey))
        part_p = pvalue_from_null(obs, null, alternative=alternative, monte_carlo=method == "monte carlo")
        if method == "exact":
            extreme = null.max() if alternative != "less" else null.min()
            min_p = pvalue_from_null(float(extreme), null, alternative=alternative)
            if alternative == "two-sided":
                min_p = min(min_p, pvalue_from_null(float(null.min()), null, alternative="two-sided"))
        else:
            min_p = (1 if alternative != "two-sided" else 2) / n_orders
        caveats.append(f"S can be reordered within architecture groups in only {n_orders} way(s), so no "
                       f"within-architecture permutation test can give p below {min_p:.3g}"
                       + (f" (above {level}: this panel cannot show that S adds to the architecture, "
                          "whatever the data)." if min_p > level else "."))
    return ArchitectureResult(
        task=task, n=n, group_sizes=sizes, r2_architecture=float(m0.rsquared), r2_full=float(m1.rsquared),
        r2_S_on_architecture=float(s_on_arch), df_resid_full=int(df_resid), f_stat=f_stat, f_pvalue=f_p,
        lr_stat=lr, lr_pvalue=lr_p, partial_rho=obs, partial_p=part_p, partial_p_method=method,
        n_within_orderings=n_orders, min_attainable_p=float(min_p), caveats=caveats, anova=table,
    )


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


# --------------------------------------------------------------------------- figure


def scatter_panel(df: pd.DataFrame, tasks: Sequence[str] | None = None, *, title: str = "", ncols: int = 3,
                  axes: Sequence[Any] | None = None):
    """One scatter per task: S (x) against the change in points (y), labelled by pair, coloured by qk_norm.

    Returns the matplotlib Figure (a new one, or the one holding ``axes``: one Axes per
    plotted task). Tasks with no pair holding both values are skipped; each panel's title
    gives Spearman rho when at least 3 pairs are available.
    """
    import matplotlib.pyplot as plt

    tasks = [t for t in (list(tasks) if tasks is not None else task_columns(df)) if len(usable(df, t))]
    if not tasks:
        raise PanelError("nothing to plot: no task has a pair with both S and the change")
    if axes is None:
        ncols = max(1, min(ncols, len(tasks)))
        nrows = math.ceil(len(tasks) / ncols)
        fig, grid = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.6 * nrows), squeeze=False)
        ax_list = list(grid.flat)
    else:
        ax_list = list(axes)
        if len(ax_list) < len(tasks):
            raise PanelError(f"scatter_panel got {len(ax_list)} axes for {len(tasks)} tasks {tasks}")
        fig = ax_list[0].figure
    for ax, t in zip(ax_list, tasks):
        d = usable(df, t)
        for g in QK_NORM_TYPES:
            s = d[d["qk_norm"] == g]
            if len(s):
                ax.scatter(s["S"], s[t], color=QK_PALETTE[g], label=g, s=45, edgecolor="black", linewidth=0.5)
        for _, r in d.iterrows():
            ax.annotate(r["pair"], (r["S"], r[t]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        ax.axhline(0, color="grey", lw=0.8, ls=":")
        sub = t[len(TASK_PREFIX):]
        if len(d) >= 3 and np.ptp(d["S"]) > 0 and np.ptp(d[t]) > 0:
            sub += f"  (rho = {stats.spearmanr(d['S'], d[t]).statistic:.2f}, n = {len(d)})"
        else:
            sub += f"  (n = {len(d)})"
        ax.set_title(sub, fontsize=10)
        ax.set_xlabel("Sink Strength S (log-odds)")
        ax.set_ylabel("change after VL adaptation (points)")
        ax.legend(title="QK-norm", fontsize=8, title_fontsize=8)
    for ax in ax_list[len(tasks):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


__all__ = [
    "REQUIRED_COLUMNS", "TASK_PREFIX", "QK_NORM_TYPES", "PAPER_CSV", "QK_PALETTE",
    "task_columns", "validate_panel", "read_panel", "collect_panel_rows", "usable",
    "rho_from_d2", "d2_from_rho", "PermutationResult", "spearman_permutation", "rho_null",
    "pvalue_from_null", "fisher_ci", "bootstrap_ci", "SpearmanResult", "spearman",
    "tie_configurations", "simulate_rho", "LopoResult", "lopo", "constant_lopo_mae", "per_task",
    "partial_spearman", "ArchitectureResult", "architecture_test", "availability", "panel_summary",
    "scatter_panel",
]
