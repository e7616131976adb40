"""One seaborn theme for the whole book, and the figures more than one chapter draws."""
from __future__ import annotations

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
