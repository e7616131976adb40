"""Chapter 8's dose figures: one legend from every panel, titled 'condition', ticks at the doses."""
import matplotlib

matplotlib.use("Agg")

import pandas as pd  # noqa: E402

from sinklib.causal import figures  # noqa: E402


def _rows(controls, doses=(0.3, 0.5, 1.0)):
    return pd.DataFrame([{"dose": d, "control": c, "metric": m, "change": -1.0, "lo": -3.0, "hi": 1.0}
                         for d in doses for c in controls for m in ("math strict", "knowledge acc")])


def test_legend_names_a_control_missing_from_the_first_panel():
    fig = figures.dose_figure([("a", _rows(["sink", "random"])), ("b", _rows(["sink", "random", "matched"]))],
                              ["math strict", "knowledge acc"], xlabel="dose", doses=[0.0, 0.3, 0.5, 1.0])
    (legend,) = fig.legends
    assert [t.get_text() for t in legend.get_texts()] == ["sink", "random", "matched"]
    assert legend.get_title().get_text() == "condition"
    shown = [ax for ax in fig.axes if ax.get_visible()]
    assert all(list(ax.get_xticks()) == [0.3, 0.5, 1.0] for ax in shown)   # dose 0 is every change's zero
    assert [t.get_text() for t in shown[0].get_xticklabels()] == [".3", ".5", "1"]
    matplotlib.pyplot.close(fig)


def test_legend_entries_skip_hidden_panels():
    fig = figures.dose_figure([("a", _rows(["sink"]))], ["math strict", "knowledge acc", "perplexity ppl"],
                              xlabel="dose", doses=[0.5])
    hidden = [ax for ax in fig.axes if not ax.get_visible()]
    assert hidden and figures.legend_entries(fig.axes)[1] == ["sink"]
    matplotlib.pyplot.close(fig)
