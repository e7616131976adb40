"""One seaborn theme for the whole book, and the figures more than one chapter draws."""
from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from sinklib.stats.schema import TASK_PREFIX, task_columns, usable

QK_NORM_COLORS = {"none": "#d62728", "per_head": "#1f77b4", "layerwise": "#ff7f0e", "unknown": "#7f7f7f"}


#: the width of a chapter's output column in the rendered book at a 1280 px window (px); wider figures
#: and tables are scaled down or overflow
COLUMN_PX = 688
DPI = 110
#: default figure width (in): a figure this wide renders at its natural size in the output column
FIG_WIDTH = COLUMN_PX / DPI
#: smallest font size (pt) of the theme: at DPI and natural size it is at least the body font (16 px)
MIN_FONT_PT = 11


def set_theme() -> None:
    """The book's single plotting theme (call once at the top of a notebook): figures FIG_WIDTH wide,
    no text smaller than MIN_FONT_PT, so that figure text reads at the size of the body text."""
    import matplotlib as mpl
    import seaborn as sns

    sns.set_theme(context="notebook", style="whitegrid", palette="colorblind")
    mpl.rcParams.update({"figure.dpi": DPI, "savefig.dpi": DPI, "figure.figsize": (FIG_WIDTH, 3.8),
                         "axes.titleweight": "bold", "axes.titlesize": 12, "figure.titlesize": 13,
                         "figure.titleweight": "bold", "font.size": 12, "axes.labelsize": 12,
                         "xtick.labelsize": MIN_FONT_PT, "ytick.labelsize": MIN_FONT_PT,
                         "legend.fontsize": MIN_FONT_PT, "legend.title_fontsize": MIN_FONT_PT})


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


# --------------------------------------------------------------------------- tables

#: estimated px of one character of a table cell, and the padding of one column (both generous: the
#: estimate is an upper bound of the rendered width measured in Chromium)
CHAR_PX = 9.3
CELL_PAD_PX = 16


@dataclass
class Table:
    """A table for display: `frame` (already formatted) and a `legend` line shown under it."""

    frame: Any
    legend: str = ""

    def _repr_html_(self) -> str:
        import html

        out = self.frame.to_html(border=0, na_rep="", escape=True)
        if self.legend:
            out += f'\n<p class="table-legend">{html.escape(self.legend)}</p>'
        return f"<div>{out}</div>"

    def __repr__(self) -> str:
        return self.frame.to_string(na_rep="") + (f"\n{self.legend}" if self.legend else "")

    def width_px(self) -> float:
        return table_width_px(self.frame)


def _cells(values: Sequence[Any]) -> list[str]:
    return ["" if v is None or (isinstance(v, float) and math.isnan(v)) else str(v) for v in values]


def table_width_px(frame) -> float:
    """Upper estimate of the rendered width (px) of `frame` as a book table: per column (index levels
    included) its longest unbreakable word, in header or cells, at CHAR_PX per character plus padding."""
    import pandas as pd

    columns = []
    idx = frame.index
    for level in range(idx.nlevels):
        vals = idx.get_level_values(level) if isinstance(idx, pd.MultiIndex) else idx
        name = idx.names[level] if idx.names[level] is not None else ""
        columns.append(_cells([name, *vals]))
    for j in range(frame.shape[1]):
        head = frame.columns[j] if isinstance(frame.columns[j], tuple) else (frame.columns[j],)
        columns.append(_cells([*head, *frame.iloc[:, j]]))
    return sum(max((len(w) for v in col for w in v.split()), default=0) * CHAR_PX + CELL_PAD_PX for col in columns)


def fmt(values, digits: int = 1, *, signed: bool = False) -> list[str]:
    """Numbers as text with `digits` decimals ('' for a missing value; '+' on positives if `signed`)."""
    spec = f"{'+' if signed else ''}.{digits}f"
    return ["" if v is None or (isinstance(v, float) and math.isnan(v)) else format(float(v), spec) for v in values]


def short_label(name: str, abbreviations: dict[str, str] | None = None) -> str:
    """A column or task name for display: `abbreviations` applied word by word, underscores as spaces (so
    the browser can wrap it)."""
    words = str(name).replace("_", " ").split()
    ab = abbreviations or {}
    return " ".join(ab.get(w, w) for w in words)


def head_map(ax, values: np.ndarray, title: str, cbar_label: str, layers: list[int] | None = None,
             vmin: float | None = None, vmax: float | None = None, cmap: str = "viridis", center: float | None = None):
    """Layer x head heatmap of a [L, H] array (rows = layers, top = first); beyond 20 layers or 10 heads only
    every other tick is labelled."""
    import seaborn as sns

    L, H = values.shape
    layers = list(range(L)) if layers is None else layers
    sns.heatmap(values, ax=ax, cmap=cmap, vmin=vmin, vmax=vmax, center=center,
                cbar_kws={"label": cbar_label}, xticklabels=[str(h) if (H <= 10 or h % 2 == 0) else "" for h in range(H)],
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
    `label_points` is False: a panel of many models), coloured by qk_norm.

    Returns the matplotlib Figure (a new one, or the one holding ``axes``: one Axes per
    plotted task). Tasks with no pair holding both values are skipped; each panel's title
    gives Spearman rho when at least 3 pairs are available.
    """
    from scipy import stats

    from sinklib.core.anatomy import QK_NORM_TYPES
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
        d = usable(df, t)
        for g in QK_NORM_TYPES:
            s = d[d["qk_norm"] == g]
            if len(s):
                ax.scatter(s["S"], s[t], color=QK_NORM_COLORS[g], label=g, s=45, edgecolor="black", linewidth=0.5)
        for _, r in (d.iterrows() if label_points else ()):
            ax.annotate(str(r["pair"]).replace(" (this book)", ""), (r["S"], r[t]), textcoords="offset points",
                        xytext=(0, 7), ha="center", fontsize=MIN_FONT_PT).set_in_layout(False)
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
        if axes is not None:
            ax.legend(title="QK-norm", fontsize=MIN_FONT_PT, title_fontsize=MIN_FONT_PT)
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


def split_to_fit(frame, max_px: float = COLUMN_PX) -> list:
    """`frame` as one or more frames of consecutive columns (each with the full index), each estimated
    (`table_width_px`) to fit `max_px`; a single column wider than that stays alone."""
    parts, start = [], 0
    while start < frame.shape[1]:
        stop = start + 1
        while stop < frame.shape[1] and table_width_px(frame.iloc[:, start:stop + 1]) <= max_px:
            stop += 1
        parts.append(frame.iloc[:, start:stop])
        start = stop
    return parts or [frame]


def tables(frame, legend: str = "", max_px: float = COLUMN_PX) -> list[Table]:
    """`split_to_fit` as Tables; the legend goes under the last one."""
    parts = split_to_fit(frame, max_px)
    return [Table(p, legend if i == len(parts) - 1 else "") for i, p in enumerate(parts)]


def show(*items) -> None:
    """Display Tables (or lists of them) one after another in a notebook."""
    from IPython.display import display

    for it in items:
        for t in (it if isinstance(it, (list, tuple)) else [it]):
            display(t)


#: colours of chapter 8's conditions (the sink heads and their two controls)
CONTROL_COLORS = {"sink": "#d62728", "random": "#7f7f7f", "matched": "#1f77b4"}


def dose_panel(ax, table, metric: str, title: str = "") -> None:
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
    ax.set_xlabel("fraction of the last-K-layer heads ablated")
    ax.set_ylabel("change vs unablated" + (" (ppl)" if metric.startswith("perplexity") else " (points)"))
    ax.set_title(title or metric)


# --------------------------------------------------------------------------- display tables of chapter 5
# (what the chapter shows; the statistics and saved results keep the full frames)

#: words shortened in displayed task names (explained in the legends)
TASK_ABBREVIATIONS = {"instructions": "instr.", "knowledge": "knowl.", "perplexity": "ppl", "diamond": "diam."}


def task_label(task: str) -> str:
    """A task column for display: 'delta_instructions_strict' -> 'instr. strict'."""
    name = task[len(TASK_PREFIX):] if task.startswith(TASK_PREFIX) else task
    return short_label(name, TASK_ABBREVIATIONS).replace("ppl ppl", "ppl")


def panel_tables(df: pd.DataFrame) -> list:
    """A panel for display: the numbers (index pair; QK-norm, S to 3 decimals, each task's change to 1
    decimal, split to fit the book's column), then the text columns (vlm, llm, note; a `source` shared by
    every row goes into the legend)."""
    d = df.set_index("pair")
    tasks = task_columns(df)
    nums = pd.DataFrame({"QK-norm": d["qk_norm"].str.replace("_", " "),
                         "S": ["" if pd.isna(v) else f"{v:.3f}" for v in d["S"]]}, index=d.index)
    for t in tasks:
        nums[task_label(t)] = ["" if pd.isna(v) else f"{v:+.1f}" for v in d[t]]
    ppl = " (ppl: change in perplexity, a rise is a loss)" if any("ppl" in t or "perplexity" in t for t in tasks) else ""
    out = tables(nums, "Task columns: change after VL adaptation in points" + ppl + "; empty: not reported or "
                       "not measured. instr. = instructions, knowl. = knowledge.")
    text_cols = [c for c in ("vlm", "llm", "note") if c in d and d[c].fillna("").astype(str).str.strip().any()]
    sources = list(dict.fromkeys(d["source"].astype(str))) if "source" in d else []
    if len(sources) > 1:
        text_cols.append("source")
    if text_cols:
        out.append(Table(d[text_cols].fillna(""), f"Source of every row: {sources[0]}." if len(sources) == 1 else ""))
    return out


def availability_table(av: pd.DataFrame):
    """`availability` for display: short task names and headers, explained in the legend."""
    names = {"pairs_with_change": "n change", "pairs_with_S_and_change": "n with S", "spearman": "Spearman rho",
             "lopo": "LOPO", "architecture": "S beyond QK-norm"}
    d = av.set_index("task").rename(columns=names)
    d.index = [task_label(t) for t in d.index]
    d.index.name = "task"
    return Table(d, "n change: pairs with the task's change; n with S: of those, pairs that also have S; the last "
                    "three columns say whether Spearman rho, the leave-one-pair-out error (LOPO) and the test of "
                    "whether S adds to the QK-norm type can be computed, or why not.")


def summary_tables(summary: dict[str, pd.DataFrame], tasks: Sequence[str] | None = None) -> list[tuple[str, list]]:
    """`panel_summary`'s rho, LOPO and architecture tables for display (rows of `tasks`, default all):
    [(title, Tables)], intervals as 'lo to hi', numbers rounded, split to fit the book's column."""
    def num(v, k=3):
        return "" if v is None or pd.isna(v) else f"{v:.{k}g}" if abs(v) < 1e-3 and v != 0 else f"{v:.{k}f}"

    def ci(lo, hi):
        return "" if pd.isna(lo) else f"{lo:.2f} to {hi:.2f}"

    def rows(key):
        d = summary[key]
        d = d[d["task"].isin(tasks)] if tasks is not None else d
        return d.assign(task=[task_label(t) for t in d["task"]]).set_index("task")

    r = rows("rho")
    rho = pd.DataFrame({"n": r["n"], "rho": [num(v) for v in r["rho"]], "p": [num(v) for v in r["p_value"]],
                        "p method": r["p_method"], "Fisher CI": [ci(a, b) for a, b in zip(r.ci_fisher_lo, r.ci_fisher_hi)],
                        "bootstrap CI": [ci(a, b) for a, b in zip(r.ci_boot_lo, r.ci_boot_hi)], "note": r["note"]})
    lo = rows("lopo")
    lopo = pd.DataFrame({"n": lo["n"], "MAE, S": [num(v, 2) for v in lo.mae_model],
                         "MAE, constant": [num(v, 2) for v in lo.mae_constant], "note": lo["note"]})
    a = rows("architecture")
    arch = pd.DataFrame({"n": a["n"], "groups": a["groups"].fillna(""),
                         "R2 arch": [num(v) for v in a.r2_arch], "R2 arch + S": [num(v) for v in a.r2_arch_plus_S],
                         "R2 S on arch": [num(v) for v in a.r2_S_on_arch], "df": a["df_resid"].fillna(""),
                         "F p": [num(v) for v in a.F_p], "LR p": [num(v) for v in a.LR_p],
                         "partial rho": [num(v) for v in a.partial_rho], "partial p": [num(v) for v in a.partial_p],
                         "min p": [num(v) for v in a.min_attainable_p], "note": a["note"].fillna("")})
    return [("Spearman rho, permutation p-value and intervals", tables(rho, "p: permutation p-value; p method: how it was computed; CI: intervals for rho")),
            ("Leave-one-pair-out mean absolute error (points)",
             tables(lopo, "MAE, S: predicting each pair's change from S fitted on the others; constant: the mean of the others")),
            ("Does S add to the QK-norm type?",
             tables(arch, "R2: of the change on the QK-norm type (arch), on type + S, and of S on the type; df: residual "
                          "degrees of freedom; F p, LR p: nested F and likelihood-ratio tests of adding S; partial rho: "
                          "S against the change within types; min p: the smallest p the within-type permutation can reach"))]
