"""Chapter 3's input-scale figure (Figure 3.4): the actual change of the sink gap and Theorem 1's bound against the
input scale, one line per source (random layers of each variant, one real layer per model), with one legend under
both panels in the book's smallest font (`sinklib.plots.MIN_FONT_PT`), the fitted slopes in it."""
from __future__ import annotations

import pandas as pd

from sinklib import plots

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def scale_sweep_figure(sweep: pd.DataFrame, slopes: pd.DataFrame, colors: dict[str, str], height: float = 3.3):
    """sweep: rows {source, variant, scale, change, bound} (several instances per source: the median over them per
    scale is drawn); slopes: indexed by source, columns slope_change and slope_bound; colors: variant -> colour.
    Random sources (names starting with "random") are solid lines, real layers dashed; each source has its own
    marker. -> the figure (two panels stacked at the book's width, the legend below them)."""
    fig, axes = plots.subplots(2, 1, height=height, sharex=True)
    for k, (src, d) in enumerate(sweep.groupby("source", sort=False)):
        m = d.groupby("scale")[["change", "bound"]].median()
        ls = "-" if str(src).startswith("random") else "--"
        label = f"{src}: slopes {slopes.loc[src, 'slope_change']:.2f} / {slopes.loc[src, 'slope_bound']:.2f}"
        for ax, col in zip(axes, ("change", "bound")):
            ax.plot(m.index, m[col], ls, marker=MARKERS[k % len(MARKERS)], ms=4, color=colors[d.variant.iloc[0]],
                    label=label)
    for ax, title, ylabel in zip(axes, ("Actual change of the sink gap", "Bound of Theorem 1"),
                                 ("median $|\\Delta\\gamma^{\\max}|$\n(logit units)", "median bound $G_i$\n(logit units)")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel(ylabel)
    axes[1].set_xlabel("input scale $\\lambda$ (every $x_j \\to \\lambda x_j$)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.tight_layout()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=1, fontsize=plots.MIN_FONT_PT,
               title="source: slope of the actual change / of the bound", title_fontsize=plots.MIN_FONT_PT)
    return fig
