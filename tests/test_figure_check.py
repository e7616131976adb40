"""The measurement of overlapping figure text (`sinklib.plots.overlap`): flagged where texts overlap, silent where
they do not, stored with a displayed figure, and the book's figure code that had overlaps (Figures 6.1, 8.1) free
of them."""
import io
from contextlib import redirect_stdout

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import pytest  # noqa: E402

from sinklib import plots  # noqa: E402


@pytest.fixture(autouse=True)
def _theme():
    plots.set_theme()
    yield
    plt.close("all")


def _clean_figure():
    fig, (ax,) = plots.subplots(1, 1)
    ax.plot([0, 1], [0, 1], label="a line")
    ax.set_title("A title")
    ax.set_xlabel("x (units)")
    ax.set_ylabel("y (units)")
    ax.legend()
    fig.tight_layout()
    return fig


def test_a_clean_figure_has_no_overlaps():
    fig = _clean_figure()
    assert plots.text_overlaps(fig) == []
    check = plots.figure_check(fig)
    assert check["texts"] >= 4 and check["overlaps"] == []  # title, labels, legend, ticks were measured


def test_overlapping_annotations_and_crowded_ticks_are_flagged():
    fig, (ax,) = plots.subplots(1, 1)
    ax.annotate("label one", (0.5, 0.5))
    ax.annotate("label two", (0.52, 0.51))
    ax.set_xticks([0, 0.01, 0.02], ["a long tick label", "another long one", "third"])
    found = {frozenset((o.first, o.second)) for o in plots.text_overlaps(fig)}
    assert frozenset(("label one", "label two")) in found
    assert frozenset(("a long tick label", "another long one")) in found
    assert all(o.depth_px > plots.overlap.TOLERANCE_PX for o in plots.text_overlaps(fig))


def test_texts_in_different_axes_are_compared():
    fig, axes = plots.subplots(1, 2, width=4)
    for ax in axes:
        ax.set_xlabel("a very long x label that is wider than its half of the figure")
    assert any(o.first == o.second for o in plots.text_overlaps(fig))


def test_rotated_labels_are_measured_as_turned_boxes():
    fig, (ax,) = plots.subplots(1, 1)
    ax.set_xticks([0, 0.5, 1], ["rotated label a", "rotated label b", "rotated label c"], rotation=45)
    fig.tight_layout()
    assert plots.text_overlaps(fig) == []  # their axis-aligned bounds would overlap; the texts do not
    ax.set_xticks([0, 0.02, 0.04], ["rotated label a", "rotated label b", "rotated label c"], rotation=45)
    assert len(plots.text_overlaps(fig)) >= 2


def test_invisible_and_empty_texts_are_ignored():
    fig, (ax,) = plots.subplots(1, 1)
    ax.annotate("shown", (0.5, 0.5))
    ax.annotate("hidden", (0.5, 0.5)).set_visible(False)
    ax.annotate("", (0.5, 0.5))
    assert plots.text_overlaps(fig) == []


def test_the_display_check_stores_the_result_and_warns():
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    assert plots.install_display_check(shell) and plots.install_display_check(shell)  # twice is harmless
    from IPython.core.pylabtools import select_figure_formats

    select_figure_formats(shell, {"png"})  # what the inline backend does when it starts, after set_theme
    fig = _clean_figure()
    data, _ = shell.display_formatter.format(fig)
    assert data[plots.FIGURE_CHECK_MIME]["overlaps"] == []
    bad, (ax,) = plots.subplots(1, 1)
    ax.annotate("same place", (0.5, 0.5))
    ax.annotate("same place", (0.5, 0.5))
    out = io.StringIO()
    with redirect_stdout(out):
        data, _ = shell.display_formatter.format(bad)
    assert len(data[plots.FIGURE_CHECK_MIME]["overlaps"]) == 1
    assert out.getvalue().startswith(plots.OVERLAP_MARK) and "'same place'" in out.getvalue()
    data, _ = shell.display_formatter.format("not a figure")
    assert plots.FIGURE_CHECK_MIME not in data
    nb = {"cells": [{"outputs": [{"data": {"image/png": "x", plots.FIGURE_CHECK_MIME: {"overlaps": []}}}]},
                    {"outputs": [{"data": {"image/png": "x"}}, {"text": "no figure"}]}]}
    assert plots.figure_checks_in_notebook(nb) == [(0, {"overlaps": []}), (1, None)]


def test_label_points_joins_coincident_points_and_overlaps_nothing():
    fig, (ax,) = plots.subplots(1, 1)
    x = np.array([63.0, 63.5, 63.5, 63.5, 64.0, 64.0, 55.0, 72.0])
    y = np.array([0.0, 0.0, 0.0, 0.4, 2.5, 2.1, -12.5, 2.1])
    labels = ["vl", "tsv", "dare", "mix", "uniform", "ties", "star", "task_arithmetic"]
    ax.scatter(x, y)
    ax.legend(["points"], loc="lower right")
    fig.tight_layout()
    anns = plots.label_points(ax, x, y, labels)
    texts = [a.get_text() for a in anns]
    assert any(t.startswith("tsv, dare") for t in texts) and len(anns) < len(labels)  # coincident: one label
    assert sorted(", ".join(texts).split(", ")) == sorted(labels)
    assert plots.text_overlaps(fig) == []


def _merged() -> pd.DataFrame:
    """condition rows of two models shaped like chapter 6's, with merges that coincide."""
    rows = []
    for model, vqa in (("m1", [None, 63, 65.5, 64, 64.5, 64, 47, 65.5, 63.5]), ("m2", [None, 63.5, 66.5, 71, 63, 63.5, 55, 72, 63.5])):
        conds = ["base", "vl", "merge:task_arithmetic", "merge:uniform", "merge:mix_95_5", "merge:tsv", "merge:star",
                 "merge:ties", "merge:dare"]
        strict = [40, 36, 40.2, 38.5, 36, 38.1, 22, 40.2, 36.4]
        rows += [{"model": model, "condition": c, "VQA (%)": v, "instructions strict": s, "math strict": s}
                 for c, v, s in zip(conds, vqa, strict)]
    return pd.DataFrame(rows)


def test_figure_6_1_code_labels_its_merges_without_overlaps():
    from sinklib.controls import merge

    fig = merge.recovery_figure(_merged(), ["m1", "m2"])
    assert plots.text_overlaps(fig) == []
    labels = {t.get_text() for ax in fig.axes for t in ax.texts}
    assert "star" in labels and any("tsv" in t for t in labels)


def test_figure_8_1_code_has_no_overlapping_labels():
    rows = []
    for model in ("smollm2-135m", "gemma3-270m"):
        for metric in ("instructions strict", "math strict", "knowledge acc", "perplexity ppl"):
            for j, control in enumerate(("sink", "random", "matched")):
                for dose in (0.1, 0.3, 1.0):
                    c = (j - 1) * 10 * dose
                    rows.append({"model": model, "metric": metric, "control": control, "dose": dose, "change": c,
                                 "lo": c - 15, "hi": c + 15})
    dose = pd.DataFrame(rows)
    fig = plots.dose_grid([(m, dose[dose.model == m]) for m in ("smollm2-135m", "gemma3-270m")],
                          ["instructions strict", "math strict", "knowledge acc", "perplexity ppl"],
                          xlabel="fraction of the last-K-layer heads ablated")
    assert plots.text_overlaps(fig) == []
    assert plots.rendered_font_px(fig) >= 15.5


def test_the_panel_scatter_labels_its_pairs_without_overlaps():
    """Figure 5.4's code: long pair labels at the panel's edge ran into the next panel's axis label."""
    from sinklib.adapt.pairs import panel_row
    from sinklib.stats import panel as P

    changes = {"instructions strict": -4.2, "math strict": -1.7, "knowledge acc": 4.3, "perplexity ppl": 0.2}
    df = P.validate_panel(pd.DataFrame([panel_row("smollm2-135m", 0.725, "none", changes),
                                        panel_row("gemma3-270m", 0.001, "per_head", {k: 0.0 for k in changes})]))
    fig = plots.scatter_panel(df, title="Measured panel: S against change")
    assert plots.text_overlaps(fig) == []
    assert sum(len(ax.texts) for ax in fig.axes) == 2 * 4  # every pair labelled in every panel


def test_the_theme_keeps_a_long_table_cell_whole():
    """The browser check refuses a table cell cut short with '...': the theme lets pandas show every cell whole."""
    long = "AWQ (4-bit), then GGUF Q4_K_M (4-bit) from the AWQ checkpoint, and more words"
    html = pd.DataFrame([{"weights": long}])._repr_html_()
    assert long in html and "..." not in html
