"""Chapter 8's dose-response figures: `sinklib.plots.dose_grid` with one legend gathered from every panel (a
control left out of the first panel, such as a matched control not tested there, is still named), titled
"condition" (the matched control is not a set of heads), and x ticks at the doses that ran."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sinklib import plots
from sinklib.core.words import qk_norm_words  # noqa: F401  (the panel titles of chapter 8's tiny models)


def legend_entries(axes) -> tuple[list, list[str]]:
    """Every labelled line of the visible `axes`, once per label, in the order first drawn."""
    seen: dict[str, Any] = {}
    for ax in axes:
        if not ax.get_visible():
            continue
        for h, label in zip(*ax.get_legend_handles_labels()):
            seen.setdefault(label, h)
    return list(seen.values()), list(seen)


def dose_figure(blocks: Sequence[tuple[str, Any]], metrics: Sequence[str], *, xlabel: str,
                doses: Sequence[float]):
    """`plots.dose_grid` over `blocks` [(panel name, dose-response rows)], its legend rebuilt from every panel and
    its x ticks at the ablated `doses` (dose 0, the unablated model, is every change's zero, not a point), labelled
    as short as they go ('.3'), at the y ticks' size. Returns the Figure."""
    fig = plots.dose_grid(blocks, metrics, xlabel=xlabel)
    axes = [ax for ax in fig.axes if ax.get_visible()]
    ticks = sorted({float(d) for d in doses if float(d) > 0})
    for ax in axes:
        ax.set_xticks(ticks, [f"{d:g}".removeprefix("0") if d < 1 else f"{d:g}" for d in ticks])
    for old in list(fig.legends):
        old.remove()
    handles, labels = legend_entries(axes)
    fig.legend(handles, labels, title="condition", loc="lower center", ncol=max(len(labels), 1), frameon=False,
               bbox_to_anchor=(0.5, 0), borderaxespad=0.1)
    return fig
