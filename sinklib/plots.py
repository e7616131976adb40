"""One seaborn theme for the whole book, and the figures more than one chapter draws."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

QK_NORM_COLORS = {"none": "#d62728", "per_head": "#1f77b4", "layerwise": "#ff7f0e", "unknown": "#7f7f7f"}


def set_theme() -> None:
    """The book's single plotting theme (call once at the top of a notebook)."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    mpl.rcParams.update({"figure.dpi": 110, "savefig.dpi": 110, "figure.figsize": (7.0, 4.0),
                         "axes.titleweight": "bold", "axes.titlesize": 11})


def head_map(ax, values: np.ndarray, title: str, cbar_label: str, layers: list[int] | None = None,
             vmin: float | None = None, vmax: float | None = None, cmap: str = "viridis", center: float | None = None):
    """Layer x head heatmap of a [L, H] array (rows = layers, top = first)."""
    import seaborn as sns

    L, H = values.shape
    layers = list(range(L)) if layers is None else layers
    sns.heatmap(values, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, center=center,
                cbar_kws={"label": cbar_label}, xticklabels=list(range(H)),
                yticklabels=[str(l) if (L <= 20 or l % 2 == 0) else "" for l in layers])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    return ax


def scatter_panel(df, tasks: Sequence[str] | None = None, *, title: str = "", ncols: int = 3,
                  axes: Sequence[Any] | None = None):
    """One scatter per task: S (x) against the change in points (y), labelled by pair, coloured by qk_norm.

    Returns the matplotlib Figure (a new one, or the one holding ``axes``: one Axes per
    plotted task). Tasks with no pair holding both values are skipped; each panel's title
    gives Spearman rho when at least 3 pairs are available.
    """
    import matplotlib.pyplot as plt
    from scipy import stats

    from .anatomy import QK_NORM_TYPES
    from .errors import PanelError
    from .panel_schema import TASK_PREFIX, task_columns, usable

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
                ax.scatter(s["S"], s[t], color=QK_NORM_COLORS[g], label=g, s=45, edgecolor="black", linewidth=0.5)
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


def placeholder(ax, message: str, title: str, xlabel: str = "Sink Strength S (log-odds)",
                ylabel: str = "change after VL adaptation (points)", fontsize: float | None = None):
    """An empty panel that says why there is nothing to plot (no ticks)."""
    ax.text(0.5, 0.5, message, ha="center", va="center", fontsize=fontsize, transform=ax.transAxes)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_xticks([])
    ax.set_yticks([])
    return ax


def qk_norm_strip(ax, df, task: str, ranges: dict[str, tuple[float, float]] | None = None):
    """One column of points per QK-norm type: each pair's `task` change, labelled by pair, with
    `ranges` ({qk_norm: (lo, hi)}) drawn as translucent bars beside the points."""
    from .anatomy import QK_NORM_TYPES

    order = [g for g in QK_NORM_TYPES if g in set(df["qk_norm"])]
    for i, g in enumerate(order):
        d = df[(df["qk_norm"] == g) & df[task].notna()]
        ax.scatter([i] * len(d), d[task], color=QK_NORM_COLORS[g], s=60, edgecolor="black", zorder=3)
        for _, r in d.iterrows():
            ax.annotate(r["pair"], (i, r[task]), xytext=(6, 0), textcoords="offset points", fontsize=8)
    for g, (lo, hi) in (ranges or {}).items():
        if g in order:
            ax.vlines(order.index(g) - 0.12, lo, hi, color=QK_NORM_COLORS[g], lw=6, alpha=0.35,
                      label=f"reported range, {g}")
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.5, len(order) - 0.2)
    ax.set_xlabel("QK-norm type of the backbone")
    return ax
