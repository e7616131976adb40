"""One seaborn theme for the whole book, and the figures more than one chapter draws.

Tables as shown are `sinklib.plots.table`, chapter 5's tables `sinklib.plots.panel_display`, and the measurement of
overlapping figure text (run on every figure a notebook displays once `set_theme` was called) with the placement of
point labels that avoids it `sinklib.plots.overlap`; their names are re-exported here (`plots.tables`, ...).
"""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from sinklib.plots.overlap import (FIGURE_CHECK_MIME, OVERLAP_MARK, Overlap, figure_check,  # noqa: F401
    figure_checks_in_notebook, install_display_check, label_points, overlap_warning, text_overlaps)
from sinklib.plots.overlap import label_points as _place_labels  # scatter_panel's argument `label_points` hides it
from sinklib.plots.panel_display import (TASK_ABBREVIATIONS, availability_table, caveat_lines,  # noqa: F401
    not_computed_lines, panel_tables, show_panel_summary, summary_tables, task_label)
from sinklib.plots.table import (CELL_PAD_PX, CHAR_PX, COLUMN_PX, Table, fmt, number_text, short_label,  # noqa: F401
    show, split_to_fit, table_width_px, tables)
from sinklib.stats.schema import TASK_PREFIX, task_columns, usable

QK_NORM_COLORS = {"none": "#d62728", "per_head": "#1f77b4", "layerwise": "#ff7f0e", "unknown": "#7f7f7f"}


DPI = 110
#: default figure width (in): a figure this wide renders at its natural size in the output column
FIG_WIDTH = COLUMN_PX / DPI
#: smallest font size (pt) of the theme: at DPI and natural size it is at least the body font (16 px)
MIN_FONT_PT = 11


def set_theme() -> None:
    """The book's single plotting theme (call once at the top of a notebook): figures FIG_WIDTH wide,
    no text smaller than MIN_FONT_PT, so that figure text reads at the size of the body text. In a notebook it
    also installs the figure check (`install_display_check`): every displayed figure is measured for
    overlapping text, and one that has it gets a printed warning under it. A DataFrame shown as it is keeps
    every cell whole (pandas would cut a cell past 50 characters with '...', which the browser check refuses)."""
    import matplotlib as mpl
    import pandas as pd
    import seaborn as sns

    pd.set_option("display.max_colwidth", None)
    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    mpl.rcParams.update({"figure.dpi": DPI, "savefig.dpi": DPI, "figure.figsize": (FIG_WIDTH, 3.8),
                         "axes.titleweight": "bold", "axes.titlesize": 12, "figure.titlesize": 13,
                         "figure.titleweight": "bold", "font.size": 12, "axes.labelsize": 12,
                         "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT,
                         "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT})
    install_display_check()


def subplots(nrows: int = 1, ncols: int = 1, *, height: float = 3.4, width: float | None = None, **kwargs):
    """``plt.subplots`` sized for the book: FIG_WIDTH wide (or `width`), `height` inches per row;
    returns (fig, axes as a flat list)."""
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(nrows, ncols, figsize=(width or FIG_WIDTH, height * nrows), squeeze=False, **kwargs)
    return fig, list(grid.flat)


def panel_grid(n: int, *, ncols: int = 2, height: float = 3.4, width: float | None = None, **kwargs):
    """One panel per model (or any `n` items) in rows of at most `ncols`, the book's width (`subplots`) and
    `height` inches per row. -> (fig, the first `n` axes as a list); cells left over in the last row are hidden."""
    if n < 1 or ncols < 1:
        raise ValueError(f"panel_grid needs n >= 1 and ncols >= 1, got n={n}, ncols={ncols}")
    cols = min(n, ncols)
    fig, axes = subplots(math.ceil(n / cols), cols, height=height, width=width, **kwargs)
    for ax in axes[n:]:
        ax.set_visible(False)
    return fig, axes[:n]


def rendered_font_px(fig, column_px: int = COLUMN_PX) -> float:
    """Smallest visible text of `fig` in screen px once the book shows it in a `column_px` column (the
    image is saved with a tight bounding box and scaled down when wider than the column)."""
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    width_px = fig.get_tightbbox(renderer).width * fig.dpi
    scale = min(1.0, column_px / width_px)
    sizes = [t.get_fontsize() for t in fig.findobj(lambda a: hasattr(a, "get_text") and hasattr(a, "get_fontsize"))
             if t.get_visible() and t.get_text().strip()]
    return min(sizes) * fig.dpi / 72 * scale if sizes else float("inf")


def image_grid(images: Sequence[np.ndarray], titles: Sequence[str], *, ncols: int = 3, title: str = "",
               wrap: int = 22, height: float = 2.9):
    """Images in a grid `ncols` wide at the book's figure width, each titled (wrapped at `wrap` characters)."""
    import textwrap

    nrows = math.ceil(len(images) / ncols)
    fig, axes = subplots(nrows, ncols, height=height)
    for ax, im, t in zip(axes, images, titles):
        ax.imshow(im)
        ax.set_xticks([])
        ax.set_yticks([])
        ax.grid(False)
        ax.set_title("\n".join(textwrap.fill(line, wrap) for line in t.split("\n")), fontsize=MIN_FONT_PT,
                     fontweight="normal")
    for ax in axes[len(images):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig


def head_map(ax, values: np.ndarray, title: str, cbar_label: str, layers: list[int] | None = None,
             vmin: float | None = None, vmax: float | None = None, cmap: str = "viridis", center: float | None = None,
             cbar: bool = True):
    """Layer x head heatmap of a [L, H] array (rows = layers, top = first); `cbar` False: no colour bar (a grid of
    maps on one scale shows one, on its last column, so that no bar's tick labels run into the next title)."""
    import seaborn as sns

    L, H = values.shape
    layers = list(range(L)) if layers is None else layers
    sns.heatmap(values, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, center=center, cbar=cbar,
                cbar_kws={"label": cbar_label} if cbar else None, xticklabels=[str(h) if (H <= 10 or h % 2 == 0) else "" for h in range(H)],
                yticklabels=[str(l) if (L <= 20 or l % 2 == 0) else "" for l in layers])
    ax.set_xlabel("head")
    ax.set_ylabel("layer")
    ax.set_title(title)
    return ax


def change_label(task: str) -> str:
    """The y-axis label of a panel task's change: points, except a perplexity change (no unit)."""
    return "change in perplexity" if ("ppl" in task or "perplexity" in task) else "change after VL (points)"


def scatter_panel(df, tasks: Sequence[str] | None = None, *, title: str = "", ncols: int = 2,
                  axes: Sequence[Any] | None = None, label_points: bool = True):
    """One scatter per task: S (x) against the change in points (y), labelled by pair (unless
    `label_points` is False: a panel of many models; the labels are placed by `overlap.label_points` once the
    layout is final, so none overlaps another text), coloured by qk_norm.

    Returns the matplotlib Figure (a new one, or the one holding ``axes``: one Axes per
    plotted task). Tasks with no pair holding both values are skipped; each panel's title
    gives Spearman rho when at least 3 pairs are available.
    """
    from sinklib.errors import PanelError

    tasks = [t for t in (list(tasks) if tasks is not None else task_columns(df)) if len(usable(df, t))]
    if not tasks:
        raise PanelError("nothing to plot: no task has a pair with both S and the change")
    if axes is None:
        ncols = max(1, min(ncols, len(tasks)))
        nrows = math.ceil(len(tasks) / ncols)
        fig, ax_list = subplots(nrows, ncols, height=3.3 if ncols > 1 else 3.8)
    else:
        ax_list = list(axes)
        if len(ax_list) < len(tasks):
            raise PanelError(f"scatter_panel got {len(ax_list)} axes for {len(tasks)} tasks {tasks}")
        fig = ax_list[0].figure
    for ax, t in zip(ax_list, tasks):
        _scatter_task(ax, usable(df, t), t, label_points, legend=axes is not None)
    for ax in ax_list[len(tasks):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    if axes is None:  # one legend for the whole grid, under it
        handles = {l: h for ax in ax_list[:len(tasks)] for h, l in zip(*ax.get_legend_handles_labels())}
        fig.legend(list(handles.values()), list(handles), title="QK-norm", loc="lower center", ncol=len(handles),
                   frameon=False)
        fig.tight_layout(rect=(0, 0.7 / fig.get_figheight(), 1, 1))
    else:
        fig.tight_layout()
    for ax, t in zip(ax_list, tasks) if label_points else ():  # once the layout is final: no label overlaps
        d = usable(df, t)
        _place_labels(ax, d["S"].to_numpy(float), d[t].to_numpy(float),
                      [str(p).replace(" (this book)", "") for p in d["pair"]], fontsize=MIN_FONT_PT)
    return fig


def _scatter_task(ax, d, t: str, label_points: bool, legend: bool) -> None:
    """One panel of `scatter_panel`: the pairs of `d` (usable for task `t`) coloured by QK-norm type."""
    from scipy import stats

    from sinklib.core.anatomy import QK_NORM_TYPES

    for g in QK_NORM_TYPES:
        s = d[d["qk_norm"] == g]
        if len(s):
            ax.scatter(s["S"], s[t], color=QK_NORM_COLORS[g], label=g, s=45, edgecolor="black", linewidth=0.5)
    ax.margins(x=0.3 if label_points else 0.08, y=0.25 if label_points else 0.1)
    ax.axhline(0, color="grey", lw=0.8, ls=":")
    sub = short_label(t[len(TASK_PREFIX):])
    if len(d) >= 3 and np.ptp(d["S"]) > 0 and np.ptp(d[t]) > 0:
        sub += f"\n(rho = {stats.spearmanr(d['S'], d[t]).statistic:.2f}, n = {len(d)})"
    else:
        sub += f"\n(n = {len(d)})"
    ax.set_title(sub, fontsize=12)
    ax.set_xlabel("Sink Strength S (log-odds)")
    ax.set_ylabel(change_label(t))
    if legend:
        ax.legend(title="QK-norm", fontsize=MIN_FONT_PT, title_fontsize=MIN_FONT_PT)


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
    from sinklib.core.anatomy import QK_NORM_TYPES

    order = [g for g in QK_NORM_TYPES if g in set(df["qk_norm"])]
    for i, g in enumerate(order):
        d = df[(df["qk_norm"] == g) & df[task].notna()]
        ax.scatter([i] * len(d), d[task], color=QK_NORM_COLORS[g], s=60, edgecolor="black", zorder=3)
        for _, r in d.iterrows():
            ax.annotate(r["pair"], (i, r[task]), xytext=(6, 0), textcoords="offset points", fontsize=MIN_FONT_PT)
    for g, (lo, hi) in (ranges or {}).items():
        if g in order:
            ax.vlines(order.index(g) - 0.12, lo, hi, color=QK_NORM_COLORS[g], lw=6, alpha=0.35,
                      label=f"reported range, {g}")
    ax.set_xticks(range(len(order)), order)
    ax.set_xlim(-0.5, len(order) - 0.2)
    ax.set_xlabel("QK-norm type of the backbone")
    return ax


#: colours of chapter 8's conditions (the sink heads and their two controls)
CONTROL_COLORS = {"sink": "#d62728", "random": "#7f7f7f", "matched": "#1f77b4"}


def dose_panel(ax, table, metric: str, title: str = "", xlabel: str = "fraction of the last-K-layer heads ablated") -> None:
    """One metric's change against the dose (fraction of heads ablated), a line per control with its paired 95 %
    interval as error bars (rows of `sinklib.causal.suites.dose_response`'s table for one model)."""
    t = table[table.metric == metric]
    for j, (control, d) in enumerate(t.groupby("control", sort=False)):
        d = d.sort_values("dose")
        x = d.dose.to_numpy() + (j - 1) * 0.012  # side by side at each dose
        y = d.change.to_numpy()
        ax.errorbar(x, y, yerr=[y - d.lo.to_numpy(), d.hi.to_numpy() - y], marker="o", capsize=3,
                    color=CONTROL_COLORS.get(control), label=control)
    ax.axhline(0, color="grey", lw=0.8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("change" + (" (ppl)" if metric.startswith("perplexity") else " (points)"))
    ax.set_title(title or metric)


def dose_grid(blocks: Sequence[tuple[str, Any]], metrics: Sequence[str], *, xlabel: str, height: float = 3.0):
    """`dose_panel`s two to a row: for each (name, table) of `blocks` one panel per metric, titled with the name
    over the metric; the x label once under the grid and one legend of the controls under it (a half-width panel
    has no room for either). Returns the Figure."""
    per = -(-len(metrics) // 2)  # rows of two panels per block
    fig, axes = subplots(per * len(blocks), 2, height=height)
    for j, (name, table) in enumerate(blocks):
        block = axes[2 * per * j: 2 * per * (j + 1)]
        for ax, m in zip(block, metrics):
            dose_panel(ax, table, m, title=f"{name}\n{m}", xlabel="")
        for ax in block[len(metrics):]:
            ax.set_visible(False)
    handles, labels = axes[0].get_legend_handles_labels()
    inch = 1 / fig.get_figheight()
    fig.tight_layout(rect=(0, 0.9 * inch, 1, 1))  # under the panels: the x label, then the legend
    fig.supxlabel(xlabel, y=0.62 * inch, va="bottom", fontsize=12)
    fig.legend(handles, labels, title="heads", loc="lower center", ncol=len(labels), frameon=False,
               bbox_to_anchor=(0.5, 0), borderaxespad=0.1)
    return fig
