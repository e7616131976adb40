"""Tests of sinklib.stats.panel: rank statistics on known cases, LOPO, the architecture test, the CSV schema."""
from __future__ import annotations

import itertools
import json
import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hst
from scipy import stats

from sinklib import plots
from sinklib.stats import panel as P, rank
from sinklib.errors import PanelError

N6 = [1, 2, 3, 4, 5, 6]


def make_panel(**over) -> pd.DataFrame:
    """A six-pair panel in the schema (3 none, 2 per_head, 1 layerwise)."""
    d = {
        "pair": list("abcdef"), "vlm": "v", "llm": "l",
        "S": [0.1, 0.2, 0.5, 0.6, 0.9, 1.0],
        "qk_norm": ["none", "none", "none", "per_head", "per_head", "layerwise"],
        "delta_ifeval": [-9.6, -7.9, -8.5, -5.4, -1.8, -18.7],
        "delta_math": [-14.3, None, None, None, None, None],
        "source": "test",
    }
    d.update(over)
    return pd.DataFrame(d)


# --------------------------------------------------------------------------- Spearman, known cases


def test_perfect_ranking_exact_null_of_720():
    r = P.spearman(N6, [10, 20, 30, 40, 50, 60], alternative="greater", n_boot=200)
    assert r.rho == 1.0 and r.p_method == "exact" and r.n_null == math.factorial(6)
    assert r.p_value == pytest.approx(1 / 720)
    assert r.ci_bootstrap == (1.0, 1.0)  # every resample is perfectly ranked too: the bootstrap collapses
    assert all(math.isnan(v) for v in r.ci_fisher)  # atanh(1) is infinite
    two = P.spearman(N6, N6, n_boot=200)
    assert two.p_value == pytest.approx(2 / 720)


def test_reversed_order():
    r = P.spearman(N6, N6[::-1], alternative="less", n_boot=200)
    assert r.rho == -1.0
    assert r.p_value == pytest.approx(1 / 720)
    assert P.spearman(N6, N6[::-1], alternative="greater", n_boot=200).p_value == pytest.approx(1.0)


def test_two_ties_give_0971_with_closed_form_and_four_best_orderings():
    # x untied, y with two tied pairs: sum d^2 = 1. With ties the tie-corrected rho is
    # (Sx + Sy - sum d^2) / (2 sqrt(Sx Sy)), Sx = 17.5, Sy = 17.5 - 2 * (2^3 - 2) / 12 = 16.5.
    y = [1, 2, 3.5, 3.5, 5.5, 5.5]
    r = P.spearman(N6, y, alternative="greater", n_boot=200)
    assert r.rho == pytest.approx(33 / (2 * math.sqrt(17.5 * 16.5)), abs=1e-12)
    assert round(r.rho, 3) == 0.971
    # 2 x 2 orderings inside the ties reach the maximum: p = 4 / 720, not 1 / 720
    assert r.p_value == pytest.approx(4 / 720)


def test_one_adjacent_swap():
    assert P.rho_from_d2(2, 6) == pytest.approx(1 - 12 / 210)  # 0.943
    assert P.rho_from_d2(1, 6) == pytest.approx(1 - 6 / 210)  # 0.971: an odd sum d^2 needs ties
    assert P.d2_from_rho(P.rho_from_d2(7.0, 9), 9) == pytest.approx(7.0)
    r = P.spearman(N6, [1, 2, 3, 5, 4, 6], n_boot=200)
    assert r.rho == pytest.approx(1 - 12 / 210)


def test_exact_pvalue_matches_brute_force_enumeration():
    rng = np.random.default_rng(3)
    x = rng.normal(size=6)
    y = np.round(rng.normal(size=6))  # ties in y
    obs = stats.spearmanr(x, y).statistic
    null = np.array([stats.spearmanr(np.array(p), y).statistic for p in itertools.permutations(x)])
    for alt, ref in (("greater", np.mean(null >= obs - 1e-12)), ("less", np.mean(null <= obs + 1e-12))):
        res = P.spearman_permutation(x, y, alternative=alt)
        assert res.rho == pytest.approx(obs)
        assert res.p_value == pytest.approx(ref)


def test_monte_carlo_beyond_exact_limit():
    x = np.arange(12.0)
    r = P.spearman_permutation(x, x, exact_max_n=10, n_perm=499, seed=1, alternative="greater")
    assert r.method == "monte carlo" and r.n_null == 499
    assert r.p_value == pytest.approx(1 / 500)  # (0 + 1) / (499 + 1): no random ordering is perfect


def test_pvalue_from_null_and_rho_null():
    null = P.rho_null(6)
    assert len(null) == 720 and null.max() == pytest.approx(1.0)
    assert P.pvalue_from_null(0.971, null) == pytest.approx(1 / 720)  # untied: only rho = 1 reaches 0.971
    assert P.pvalue_from_null(-1.0, null, alternative="less") == pytest.approx(1 / 720)
    assert P.pvalue_from_null(0.0, null, alternative="two-sided") == pytest.approx(1.0)
    assert P.pvalue_from_null(1.0, np.zeros(9), monte_carlo=True) == pytest.approx(1 / 10)  # (0 + 1) / (9 + 1)


def test_fisher_ci_known_values_and_errors():
    lo, hi = P.fisher_ci(0.5, 28, se="pearson")  # SE = 1 / sqrt(25) = 0.2
    z = stats.norm.ppf(0.975)
    assert (lo, hi) == pytest.approx((math.tanh(math.atanh(0.5) - 0.2 * z), math.tanh(math.atanh(0.5) + 0.2 * z)))
    bw = P.fisher_ci(0.5, 28)  # Bonett-Wright is wider than 1/sqrt(n-3)
    assert bw[0] < lo and bw[1] > hi
    assert P.fisher_ci(0.8, 100)[1] - P.fisher_ci(0.8, 100)[0] < P.fisher_ci(0.8, 10)[1] - P.fisher_ci(0.8, 10)[0]
    with pytest.raises(PanelError, match="n >= 4"):
        P.fisher_ci(0.9, 3)
    with pytest.raises(PanelError, match="se must be one of"):
        P.fisher_ci(0.9, 10, se="wrong")


def test_spearman_input_errors():
    with pytest.raises(PanelError, match="at least 3 pairs, got 2"):
        P.spearman([1, 2], [2, 1])
    with pytest.raises(PanelError, match="x is constant"):
        P.spearman([1, 1, 1, 1], [1, 2, 3, 4])
    with pytest.raises(PanelError, match="finite"):
        P.spearman([1, 2, np.nan, 4], [1, 2, 3, 4])
    with pytest.raises(PanelError, match="alternative"):
        P.spearman(N6, N6, alternative="bigger")


@settings(max_examples=25, deadline=None)
@given(hst.lists(hst.tuples(hst.integers(-5, 5), hst.integers(-5, 5)), min_size=4, max_size=7))
def test_spearman_agrees_with_scipy_and_p_in_range(pairs):
    x, y = map(np.array, zip(*pairs))
    if np.ptp(x) == 0 or np.ptp(y) == 0:
        with pytest.raises(PanelError):
            P.spearman(x, y, n_boot=50)
        return
    r = P.spearman(x, y, n_boot=50)
    assert r.rho == pytest.approx(stats.spearmanr(x, y).statistic)
    assert 0 < r.p_value <= 1
    assert r.ci_bootstrap[0] <= r.ci_bootstrap[1]


def test_bootstrap_ci_brackets_a_strong_correlation():
    rng = np.random.default_rng(0)
    x = rng.normal(size=40)
    y = x + 0.5 * rng.normal(size=40)
    lo, hi, undef = P.bootstrap_ci(x, y, n_boot=999)
    rho = stats.spearmanr(x, y).statistic
    assert lo < rho < hi and undef == 0 and hi - lo < 0.5


# --------------------------------------------------------------------------- ties and simulation


def test_tie_configurations_for_0971_all_need_two_tied_pairs():
    t = P.tie_configurations(6, 0.971)
    assert len(t) > 0
    assert (t["sum_d2"] == 1).all()
    assert ((t["ties_x"] + t["ties_y"]) == 2).all()
    assert t["rho"].between(0.9705, 0.9715).all()
    # rho = 1 only when y repeats x's weak ordering: one per composition of 4 except 'all tied' (2^3 - 1)
    ones = P.tie_configurations(4, 1.0)
    assert len(ones) == 7 and (ones["x_ranks"] == ones["y_ranks"]).all()
    with pytest.raises(PanelError):
        P.tie_configurations(9, 0.5)


def test_simulate_rho():
    s = P.simulate_rho(0.8, 6, 500, seed=1)
    assert s.shape == (500,)
    assert np.array_equal(s, P.simulate_rho(0.8, 6, 500, seed=1))
    assert np.all(P.simulate_rho(1.0, 6, 50, scale="pearson") == pytest.approx(1.0))
    big = P.simulate_rho(0.5, 200, 300, seed=2)
    assert abs(big.mean() - 0.5) < 0.03  # the 'spearman' scale targets the population Spearman rho
    with pytest.raises(PanelError):
        P.simulate_rho(0.5, 6, 10, scale="kendall")


def test_rank_corr_matches_scipy_row_by_row():
    rng = np.random.default_rng(5)
    x, y = rng.normal(size=(2, 20, 7))
    y[:, 0] = y[:, 1]  # a tie in every row
    got = rank._rank_corr(x, y)
    ref = [stats.spearmanr(a, b).statistic for a, b in zip(x, y)]
    assert got == pytest.approx(ref)


# --------------------------------------------------------------------------- LOPO, per task


def test_lopo_exact_line_and_constant_identity():
    df = P.validate_panel(make_panel(delta_ifeval=[2 * s - 3 for s in [0.1, 0.2, 0.5, 0.6, 0.9, 1.0]]))
    r = P.lopo(df, "delta_ifeval")
    assert r.mae_model == pytest.approx(0.0, abs=1e-9)
    assert r.mae_constant == pytest.approx(P.constant_lopo_mae(df["delta_ifeval"]))
    y = np.array([-9.6, -7.9, -8.5, -5.4, -1.8, -18.7])
    assert P.constant_lopo_mae(y) == pytest.approx(6 / 5 * np.mean(np.abs(y - y.mean())))
    assert list(r.table.columns[:2]) == ["pair", "qk_norm"]


def test_lopo_errors():
    df = P.validate_panel(make_panel())
    with pytest.raises(PanelError, match="at least 3 pairs"):
        P.lopo(df, "delta_math")
    df2 = P.validate_panel(make_panel(S=[0.5] * 5 + [0.7]))
    with pytest.raises(PanelError, match="slope is undefined"):
        P.lopo(df2, "delta_ifeval")


def test_per_task_never_raises_on_small_n():
    t = P.per_task(P.validate_panel(make_panel()), n_boot=100).set_index("task")
    assert t.loc["delta_ifeval", "n"] == 6 and np.isfinite(t.loc["delta_ifeval", "rho"])
    assert t.loc["delta_math", "n"] == 1 and np.isnan(t.loc["delta_math", "rho"])
    assert "at least 3 pairs" in t.loc["delta_math", "note"]
    a = P.availability(P.validate_panel(make_panel())).set_index("task")
    assert a.loc["delta_ifeval", "spearman"] == "yes"
    assert "have 1" in a.loc["delta_math", "spearman"]


def test_panel_summary_on_a_two_pair_panel_explains_instead_of_raising():
    out = P.panel_summary(P.validate_panel(make_panel().iloc[:2]), n_boot=50)
    assert set(out) == {"availability", "rho", "lopo", "architecture", "caveats"}
    assert out["lopo"]["mae_model"].isna().all() and "got 2" in out["lopo"]["note"][0]
    assert "got 2" in out["architecture"]["note"][0] and out["caveats"].empty
    full = P.panel_summary(P.validate_panel(make_panel()), n_boot=50)
    ifeval = full["lopo"].set_index("task").loc["delta_ifeval"]
    assert ifeval["mae_constant"] == pytest.approx(P.constant_lopo_mae(make_panel()["delta_ifeval"]))
    assert len(full["caveats"]) >= 3


# --------------------------------------------------------------------------- architecture


def test_architecture_test_counts_within_group_orderings():
    a = P.architecture_test(P.validate_panel(make_panel()), "delta_ifeval")
    assert a.group_sizes == {"none": 3, "per_head": 2, "layerwise": 1}
    assert a.n_within_orderings == 3 * 2 * 1 * 2 * 1 * 1
    assert a.min_attainable_p == pytest.approx(2 / 12)  # two-sided: no panel of this shape reaches 0.05
    assert a.df_resid_full == 6 - 4
    assert 0 <= a.f_pvalue <= 1 and 0 < a.partial_p <= 1
    assert math.isnan(a.lr_pvalue) and any("likelihood-ratio test is not reported" in c for c in a.caveats)
    assert any("cannot show" in c for c in a.caveats)


def test_architecture_test_reports_lr_with_enough_residual_df():
    n = 4 + P.LR_MIN_DF  # none / per_head / layerwise intercepts + S leave n - 4 residual degrees of freedom
    rng = np.random.default_rng(0)
    qk = (["none", "per_head", "layerwise"] * n)[:n]
    df = P.validate_panel(pd.DataFrame({"pair": [f"p{i}" for i in range(n)], "vlm": "", "llm": "",
                                        "S": rng.normal(size=n), "qk_norm": qk, "delta_ifeval": rng.normal(size=n),
                                        "source": "toy"}))
    a = P.architecture_test(df, "delta_ifeval")
    assert a.df_resid_full == P.LR_MIN_DF and 0 <= a.lr_pvalue <= 1


def test_architecture_test_collinear_and_single_group():
    # S constant within each architecture: S carries nothing beyond the flag
    df = P.validate_panel(make_panel(S=[0.1, 0.1, 0.1, 0.8, 0.8, 1.2]))
    a = P.architecture_test(df, "delta_ifeval")
    assert math.isnan(a.f_pvalue) and math.isnan(a.partial_rho)
    assert any("collinear" in c for c in a.caveats)
    one = P.validate_panel(make_panel(qk_norm=["none"] * 6))
    b = P.architecture_test(one, "delta_ifeval")
    assert any("cannot be asked" in c for c in b.caveats)
    x, y = one["S"], one["delta_ifeval"]
    assert b.partial_rho == pytest.approx(stats.spearmanr(x, y).statistic)  # no groups: partial = plain rho
    assert b.n_within_orderings == 720


def test_partial_spearman_removes_a_group_effect():
    # within each group S and the change are perfectly concordant; between groups reversed
    x = [1, 2, 3, 10, 11, 12]
    y = [10, 11, 12, 1, 2, 3]
    g = ["none"] * 3 + ["per_head"] * 3
    assert stats.spearmanr(x, y).statistic < 0
    assert P.partial_spearman(x, y, g) == pytest.approx(1.0)


# --------------------------------------------------------------------------- CSV schema


def test_validate_missing_columns_named():
    with pytest.raises(PanelError, match=r"missing column\(s\) \['S', 'qk_norm'\]"):
        P.validate_panel(make_panel().drop(columns=["S", "qk_norm"]))
    with pytest.raises(PanelError, match="no task-change column"):
        P.validate_panel(make_panel().drop(columns=["delta_ifeval", "delta_math"]))


def test_validate_duplicate_pairs_named():
    with pytest.raises(PanelError, match=r"duplicate pair id\(s\): 'a' in rows \[1, 3\]"):
        P.validate_panel(make_panel(pair=["a", "b", "a", "d", "e", "f"]))
    with pytest.raises(PanelError, match="empty pair id in row 2"):
        P.validate_panel(make_panel(pair=["a", " ", "c", "d", "e", "f"]))


def test_validate_non_numeric_named():
    with pytest.raises(PanelError, match=r"column 'S' must hold numbers.*pair 'c'.*'n/a'"):
        P.validate_panel(make_panel(S=[0.1, 0.2, "n/a", 0.6, 0.9, 1.0]))
    with pytest.raises(PanelError, match=r"'delta_ifeval'.*not finite"):
        P.validate_panel(make_panel(delta_ifeval=[1, 2, 3, 4, 5, float("inf")]))
    ok = P.validate_panel(make_panel(S=["0.1", "", None, " 0.6 ", 0.9, 1.0]))
    assert ok["S"].isna().tolist() == [False, True, True, False, False, False]
    assert ok["S"].dtype == float


def test_validate_qk_norm_source_and_min_rows():
    with pytest.raises(PanelError, match=r"qk_norm must be one of.*'per-head'"):
        P.validate_panel(make_panel(qk_norm=["none"] * 5 + ["per-head"]))
    with pytest.raises(PanelError, match="empty source in row 1"):
        P.validate_panel(make_panel(source=[""] + ["x"] * 5))
    with pytest.raises(PanelError, match="2 pair\\(s\\) \\(a, b\\); at least 3 are needed"):
        P.validate_panel(make_panel().iloc[:2], min_rows=3)


def test_read_panel_files(tmp_path):
    paper = P.read_panel("")
    assert list(paper["pair"]) == ["qwen2.5-vl", "internvl3.5", "molmo2-o"]
    assert paper.set_index("pair").loc["molmo2-o", "delta_ifeval"] == -18.7
    assert paper["S"].isna().all()  # the paper's S values are not in paper-facts.md: never invented
    with pytest.raises(PanelError, match="does not exist"):
        P.read_panel(tmp_path / "nope.csv")
    bad = tmp_path / "bad.csv"
    bad.write_text("pair,vlm,llm,S,qk_norm,delta_a,source\na,v,l,1,none,2,x,extra\n")
    with pytest.raises(PanelError, match="line 2 has 8 fields"):
        P.read_panel(bad)
    dup = tmp_path / "dup.csv"
    dup.write_text("pair,vlm,llm,S,qk_norm,delta_a,source\na,v,l,1,none,2,x\na,v,l,2,none,3,x\n")
    with pytest.raises(PanelError, match="duplicate pair"):
        P.read_panel(dup)


def test_collect_panel_rows(tmp_path, monkeypatch):
    empty = P.collect_panel_rows(tmp_path)
    assert len(empty) == 0 and set(P.REQUIRED_COLUMNS) <= set(empty.columns)
    row = {"pair": "smol-vl", "vlm": "smol+vision", "llm": "smollm2-135m", "S": 1.5, "qk_norm": "none",
           "source": "chapter 4", "delta_instr_strict": -3.0, "delta_ppl": None}
    (tmp_path / "04_vl.json").write_text(json.dumps({"notebook": "04", "results": {"panel_rows": [row]},
                                                     "parameters": {}, "provenance": {}}))
    (tmp_path / "03_other.json").write_text(json.dumps({"notebook": "03", "results": {"S": 1.0}}))
    monkeypatch.setenv("SINKBOOK_RESULTS", str(tmp_path))
    got = P.collect_panel_rows()
    assert list(got["pair"]) == ["smol-vl"] and got["results_file"][0] == "04_vl.json"
    assert got["delta_instr_strict"][0] == -3.0 and math.isnan(got["delta_ppl"][0])
    (tmp_path / "06_more.json").write_text(json.dumps({"results": {"panel_rows": [row]}}))
    with pytest.raises(PanelError, match="duplicate pair"):
        P.collect_panel_rows()
    (tmp_path / "06_more.json").write_text("{not json")
    with pytest.raises(PanelError, match="06_more.json.*not valid JSON"):
        P.collect_panel_rows()


def test_scatter_panel_draws_labelled_axes():
    import matplotlib

    matplotlib.use("Agg")
    fig = plots.scatter_panel(P.validate_panel(make_panel()))
    axes = [a for a in fig.axes if a.get_visible()]
    assert len(axes) == 2
    assert axes[0].get_xlabel().startswith("Sink Strength") and "points" in axes[0].get_ylabel()
    assert "rho" in axes[0].get_title() and "n = 1" in axes[1].get_title()
    with pytest.raises(PanelError, match="nothing to plot"):
        plots.scatter_panel(P.validate_panel(make_panel(S=[None] * 6)))
    labelled = sum(len(a.texts) for a in fig.axes)
    bare = plots.scatter_panel(P.validate_panel(make_panel()), label_points=False)
    assert labelled > 0 and sum(len(a.texts) for a in bare.axes) == 0  # a panel of many models: no labels


# --------------------------------------------------------------------------- display tables (chapter 5)


def _measured_two_models() -> pd.DataFrame:
    from sinklib.adapt.pairs import panel_row

    changes = {"instructions strict": -4.17, "instructions lenient": -4.2, "math strict": -26.7,
               "math lenient": -33.3, "knowledge acc": 5.0, "perplexity ppl": 26.8}
    return P.validate_panel(pd.DataFrame([panel_row("smollm2-135m", 0.725, "none", changes),
                                          panel_row("gemma3-270m", 0.001, "per_head", changes)]))


def test_panel_tables_fit_the_column_and_move_text_out():
    from sinklib import plots

    for df in (_measured_two_models(), P.read_panel(None), P.validate_panel(make_panel())):
        tables = plots.panel_tables(df)
        assert all(t.width_px() <= plots.COLUMN_PX for t in tables), [t.width_px() for t in tables]
        shown = [c for t in tables for c in t.frame.columns]
        assert [c for c in shown if c not in ("QK-norm", "S", "vlm", "llm", "note", "source")] == \
            [plots.task_label(t) for t in P.task_columns(df)]
    tables = plots.panel_tables(_measured_two_models())
    assert "measured: notebook 04" in tables[-1].legend  # one shared source: a legend line, not a column
    assert tables[0].frame.iloc[0]["instr. strict"] == "-4.2"
    assert plots.task_label("delta_perplexity_ppl") == "ppl" and plots.task_label("delta_gsm8k_cot") == "gsm8k cot"


def test_availability_and_summary_tables_fit():
    from sinklib import plots

    av = plots.availability_table(P.availability(_measured_two_models()))
    assert av.width_px() <= plots.COLUMN_PX and "n with S" in av.frame.columns
    summary = P.panel_summary(P.validate_panel(make_panel()), n_boot=99, n_perm=99)
    out = plots.summary_tables(summary)
    assert [title for title, _ in out][0].startswith("Spearman")
    for _, tables in out:
        assert all(t.width_px() <= plots.COLUMN_PX for t in tables)
    arch = [c for t in out[2][1] for c in t.frame.columns]
    assert "partial rho" in arch and "smallest possible p" in arch
    assert not any("_" in str(c) for _, tables in out for t in tables for c in t.frame.columns)  # words, not code


def test_a_fact_shared_by_tasks_is_shown_once():
    """#31: a panel too small for every statistic shows no 18 identical cells, and one line per reason."""
    from sinklib import plots

    av = plots.availability_table(P.availability(_measured_two_models()))
    assert list(av.frame.columns) == ["n change", "n with S"]  # nothing computable: the three columns go
    assert av.legend.count("at least 3 pairs") == 1 and "none of the three" in av.legend
    df = P.validate_panel(make_panel())
    av = plots.availability_table(P.availability(df))  # ifeval: six pairs; math: one
    assert (av.frame.loc["math", ["Spearman rho", "LOPO", "S beyond QK-norm"]] == "").all()
    assert "too few for math" in av.legend and av.frame.loc["ifeval", "Spearman rho"] == "yes"
    summary = P.panel_summary(_measured_two_models(), n_boot=99, n_perm=99)
    lines = plots.not_computed_lines(summary)
    assert len(lines) == 1 and "instr. strict, instr. lenient" in lines[0] and "delta_" not in lines[0]
    summary = P.panel_summary(df, n_boot=99, n_perm=99)
    items = plots.caveat_lines(summary)
    assert len(items) == len(set(items)) and len(items) <= len(summary["caveats"])


def test_number_text_never_shows_a_small_value_as_zero():
    from sinklib.plots import number_text

    assert number_text(0.000145) == "0.000145" and number_text(1.4e-4, 2) == "0.00014"
    assert number_text(-1.97e-17, 4) == "0.0000" and number_text(-0.00001, 4) == "-1e-05"
    assert number_text(0.5) == "0.500" and number_text(float("nan")) == "" and number_text(None) == ""
    assert number_text(0.0) == "0.000"


def test_figure_text_reads_at_body_size():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sinklib import plots

    plots.set_theme()
    df = P.validate_panel(make_panel(delta_ppl=[1.0, 2.0, 3.0, 4.0, 5.0, 6.0]))
    fig = plots.scatter_panel(df)
    assert plots.rendered_font_px(fig) >= 15.5
    assert any(a.get_ylabel() == "change in perplexity" for a in fig.axes if a.get_visible())
    fig2, axes = plots.subplots(1, 2, height=5.5)
    for ax in axes:
        plots.head_map(ax, np.random.default_rng(0).random((30, 9)), "smollm2-135m", "change of mean sink probability")
    fig2.tight_layout()
    assert plots.rendered_font_px(fig2) >= 15.5
    plt.close("all")


@pytest.mark.parametrize("n,shape", [(1, (1, 1)), (2, (1, 2)), (3, (2, 2)), (4, (2, 2)), (5, (3, 2))])
def test_panel_grid_one_panel_per_model(n, shape):
    """#29: chapters 1 and 2 draw one panel per model in rows of two at the book's width, so four models read as
    well as two did (the head maps keep the body font size)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sinklib import plots

    plots.set_theme()
    fig, axes = plots.panel_grid(n, height=5.5)
    assert len(axes) == n and all(ax.get_visible() for ax in axes)
    assert len(fig.axes) == shape[0] * shape[1] and sum(not a.get_visible() for a in fig.axes) == shape[0] * shape[1] - n
    assert fig.get_size_inches()[0] == pytest.approx(plots.FIG_WIDTH)
    for ax in axes:
        plots.head_map(ax, np.random.default_rng(0).random((28, 14)), "qwen2.5-coder-1.5b", "mean attention on first token")
    fig.tight_layout()
    assert plots.rendered_font_px(fig) >= 15.5
    plt.close("all")
    with pytest.raises(ValueError, match="n >= 1"):
        plots.panel_grid(0)


def test_chapter_11s_lora_panel_is_read_apart_from_chapter_4s_pairs(tmp_path):
    """Chapter 11's rows (LoRA) live under their own key: chapter 5's 'pairs' never pools them with chapter 4's."""
    import json

    from sinklib.stats.schema import PANEL_KEYS, collect_panel_rows

    row = {"pair": "p", "vlm": "v", "llm": "m", "qk_norm": "none", "S": 0.5, "delta_instructions_strict": -3.0,
           "source": "measured"}
    (tmp_path / "04.json").write_text(json.dumps({"results": {PANEL_KEYS["pairs"]: [row]}}))
    (tmp_path / "11.json").write_text(json.dumps({"results": {PANEL_KEYS["lora"]: [dict(row, llm="n")]}}))
    assert collect_panel_rows(tmp_path).llm.tolist() == ["m"]
    assert collect_panel_rows(tmp_path, panel="lora").llm.tolist() == ["n"]
