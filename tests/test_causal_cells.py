import pandas as pd

from sinklib.causal import cells


def _t(rows):
    return pd.DataFrame(rows, columns=["change", "lo", "hi", "p"])


def test_a_cell_is_marked_where_the_interval_and_mcnemar_disagree():
    t = _t([(-10.0, -20.0, -1.0, 0.07),     # interval outside zero, p above 0.05: disagree
            (-10.0, -20.0, +1.0, 0.03),     # interval contains zero, p below: disagree
            (-10.0, -20.0, -1.0, 0.01),     # both say a fall
            (+1.0, -5.0, +6.0, 0.8),        # both say noise
            (+0.2, -0.1, +0.5, float("nan"))])  # perplexity: no McNemar test, never marked
    shown = cells.change_cells(t)
    assert shown == ["-10.0 [-20.0, -1.0]†", "-10.0 [-20.0, +1.0]†", "-10.0 [-20.0, -1.0]", "+1.0 [-5.0, +6.0]",
                     "+0.2 [-0.1, +0.5]"]
    assert cells.change_cells(t, tested=[False, True, True, True, True])[0] == cells.NOT_TESTED_CELL


def test_the_sentence_counts_only_tested_pass_fail_cells():
    t = _t([(-10.0, -20.0, -1.0, 0.07), (-10.0, -20.0, -1.0, 0.01), (0.2, -0.1, 0.5, float("nan"))])
    s = cells.disagreement_sentence(t)
    assert "1 of 2 pass/fail cells" in s and "p = 0.070" in s and "the interval decides" in s
    assert "agree at the 5 % level in the one pass/fail cell" in cells.disagreement_sentence(t, tested=[False, True, True])
    assert cells.disagreement_sentence(t.iloc[2:]) == "no pass/fail cells to test"


def test_cells_read_a_named_value_column():
    t = pd.DataFrame({"sink minus control": [-10.0], "lo": [-20.0], "hi": [-1.0], "p": [0.07]})
    assert cells.change_cells(t, value="sink minus control") == ["-10.0 [-20.0, -1.0]†"]


def test_perplexity_cells_have_two_decimals_and_unchanged_inputs_are_no_measurement():
    t = pd.DataFrame({"metric": ["perplexity ppl", "knowledge acc", "math strict"], "change": [-0.0335, 0.0, -2.0],
                      "lo": [-0.0604, 0.0, -5.0], "hi": [-0.007, 0.0, 0.04], "p": [float("nan"), 1.0, 0.02]})
    shown = cells.change_cells(t, unchanged=[False, True, False])
    assert shown == ["-0.03 [-0.06, -0.01]", cells.UNCHANGED_CELL, "-2.0 [-5.0, +0.04]†"]


def test_a_loss_read_from_other_columns_carries_no_mark():
    t = pd.DataFrame({"metric": ["math strict"], "loss": [-4.0], "loss_lo": [-11.0], "loss_hi": [3.0], "p": [0.01]})
    assert cells.change_cells(t, value="loss", lo="loss_lo", hi="loss_hi", marks=False) == ["-4.0 [-11.0, +3.0]"]
