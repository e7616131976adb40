"""Controls that isolate one thing each: the decomposition of the VL loss into paired steps, and the random
control at several sizes (sinklib.adapt.isolate)."""
import numpy as np
import pandas as pd
import pytest
import torch

from sinklib.adapt import isolate
from sinklib import vl
from sinklib.errors import ParameterError
from sinklib.evals.paired import pack


def _ev(seed, p_instr, p_math, p_know, nll_shift=0.0, n=60):
    rng = np.random.default_rng(seed)
    return {"outcomes": pack({"instructions strict": list(rng.random(n) < p_instr),
                              "math strict": list(rng.random(n) < p_math),
                              "math lenient": list(rng.random(n) < min(1.0, p_math + 0.2)),
                              "knowledge acc": list(rng.random(n) < p_know),
                              "perplexity": {"nll": list(2.0 + nll_shift + rng.random(6)), "n_tokens": [3] * 6}})}


@pytest.fixture()
def evaluations():
    return {("m", "base"): _ev(0, 0.6, 0.6, 0.5), ("m", "text_sentence"): _ev(1, 0.55, 0.55, 0.5),
            ("m", "text_only"): _ev(2, 0.3, 0.1, 0.5, 0.3), ("m", "vl"): _ev(3, 0.5, 0.5, 0.45, 0.1),
            ("other", "base"): _ev(4, 0.5, 0.5, 0.5)}  # a model without the control is skipped


def test_steps_add_up_to_vl_minus_base(evaluations):
    t = isolate.decomposition(evaluations, seed=0)
    assert set(t.model) == {"m"}
    assert list(dict.fromkeys(t.step)) == [s for s, _, _ in isolate.STEPS] + [isolate.TOTAL]
    for metric, g in t.groupby("metric"):
        g = g.set_index("step")
        steps = sum(g.loc[s, "change"] for s, _, _ in isolate.STEPS)
        assert steps == pytest.approx(g.loc[isolate.TOTAL, "change"], abs=1e-9), metric
        assert (g.lo <= g.change + 1e-9).all() and (g.change <= g.hi + 1e-9).all()
    fmt = t[(t.metric == "math strict") & (t.step == "one-word answer format")].iloc[0]
    assert fmt["from"] == "text_sentence" and fmt["to"] == "text_only" and fmt.change < -20 and fmt.hi < 0
    s = isolate.step_sentence(t)
    assert s.startswith("m: fine-tuning as such ") and "outside the noise: " in s and "one-word answer format" in s


def test_decomposition_needs_the_control(evaluations):
    with pytest.raises(ParameterError, match="text_sentence"):
        isolate.decomposition({k: v for k, v in evaluations.items() if k[1] != "text_sentence"})
    with pytest.raises(ParameterError, match="text_only"):
        isolate.decomposition({k: v for k, v in evaluations.items() if k[1] != "text_only"})


def test_display_is_one_column_per_step(evaluations):
    shown = isolate.display(isolate.decomposition(evaluations), order=[s for s, _, _ in isolate.STEPS])
    frame = shown[0].frame if len(shown) == 1 else None
    assert frame is not None and list(frame.columns) == [s for s, _, _ in isolate.STEPS]
    assert frame.loc[("m", "math strict"), "one-word answer format"].startswith("-")


def test_scaled_names_and_states():
    assert isolate.scaled_name(1) == "random" and isolate.scaled_name(0.5) == "random x0.5"
    assert isolate.scaled_name(8.0) == "random x8"
    with pytest.raises(ParameterError, match="scale"):
        isolate.scaled_name(0)



def test_evaluate_random_scaled_holds_one_state_at_a_time(monkeypatch):
    from sinklib.adapt import pairs

    class P:
        states = {"base": {"w": torch.zeros(2, 2)}, "random": {"w": torch.ones(2, 2)}}
    seen = []

    def fake(lm, pair, condition, **kw):
        seen.append((condition, float(pair.states[condition]["w"][0, 0]), sorted(pair.states), kw))
        return {"condition": condition}
    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    out = isolate.evaluate_random_scaled(None, P, [4, 1, 0.5], eval_n={"math": 3})
    assert out == {4.0: {"condition": "random x4"}, 1.0: {"condition": "random"}, 0.5: {"condition": "random x0.5"}}
    assert [(c, w) for c, w, _, _ in seen] == [("random x4", 4.0), ("random", 1.0), ("random x0.5", 0.5)]
    assert seen[0][2] == ["base", "random", "random x4"] and seen[0][3] == {"eval_n": {"math": 3}}
    assert sorted(P.states) == ["base", "random"]  # the scaled states are dropped again


def test_random_curve_and_first_harm():
    evs = {("m", "base"): _ev(0, 0.6, 0.6, 0.6), ("m", "random"): _ev(0, 0.6, 0.6, 0.6),
           ("m", "random x4"): _ev(5, 0.6, 0.55, 0.6), ("m", "random x8"): _ev(6, 0.1, 0.1, 0.2, 2.0)}
    curve = isolate.random_curve(evs, [8, 1, 4, 2], vl_change={"m": 1e-3})  # x2 not evaluated: skipped
    assert sorted(set(curve.scale)) == [1.0, 4.0, 8.0]
    assert curve[curve.scale == 8].iloc[0]["relative change"] == pytest.approx(8e-3)
    same = curve[(curve.scale == 1) & (curve.metric == "strict-format mean")].iloc[0]
    assert same.change == 0 and same.lo == 0 and same.hi == 0  # identical outcomes: no change
    assert isolate.first_harm(curve) == {"m": 8.0}
    assert isolate.first_harm(curve, "perplexity ppl") == {"m": 8.0}
    s = isolate.harm_sentence(curve)
    assert s.startswith("m (sizes 1x, 4x, 8x): strict-format mean: from 8x") and "perplexity (a rise): from 8x" in s
    with pytest.raises(ParameterError, match="no evaluation"):
        isolate.random_curve(evs, [16])


def test_whole_model_relative_change_counts_tied_tensors_once():
    w = torch.ones(2, 2)
    base = {"embed.weight": w, "lm_head.weight": w, "mlp.weight": torch.ones(2)}
    other = {"embed.weight": w * 2, "lm_head.weight": w * 2, "mlp.weight": torch.ones(2)}
    other["lm_head.weight"] = other["embed.weight"]
    (row,) = vl.relative_change_by_group(base, other, whole=True)
    assert row["group"] == "whole model" and row["tensors"] == 2
    assert row["relative change"] == pytest.approx((4 / 6) ** 0.5)


def test_chapter4_checks_the_new_parameters():
    from sinklib.adapt import pairs

    check = pairs.CHAPTER4_PARAMS["random_scales"]
    assert check("random_scales", [0.5, 2]) == [0.5, 2.0] and check("random_scales", []) == []
    with pytest.raises(ParameterError, match=r"random_scales\[1\]"):
        check("random_scales", [2, 0])
    fm = pairs.CHAPTER4_PARAMS["format_models"].fn
    ok = {"models": ["a", "b"]}
    assert fm("format_models", None, ok) is None and fm("format_models", [], ok) == []
    assert fm("format_models", "a", ok) == ["a"]
    with pytest.raises(ParameterError, match=r"format_models\[0\]"):
        fm("format_models", [""], ok)
    for name in ("format_models", "random_models", "dose_models", "seed_models", "sweep_models"):
        with pytest.raises(ParameterError, match=rf"'{name}' names \['A'\], which are not in 'models'"):
            pairs.CHAPTER4_PARAMS[name].fn(name, ["a", "A"], ok)  # a misspelt name is never skipped silently
    sm_ = pairs.CHAPTER4_PARAMS["sweep_models"].fn
    assert sm_("sweep_models", [], ok) == []
    with pytest.raises(ParameterError, match="sweep_models"):
        sm_("sweep_models", None, ok)
    with pytest.raises(ParameterError, match=r"sweep_lrs\[0\]"):
        pairs.CHAPTER4_PARAMS["sweep_lrs"]("sweep_lrs", [0.0])


def test_sink_text_rows_and_correlation():
    def ev(seed, p, mass_last, S):
        e = _ev(seed, p, p, 0.5)
        e["mass"] = [[0.9, 0.9], [mass_last, mass_last]]  # two layers, two heads; K = 1 reads the last
        e["S"] = S
        return e
    evs = {("m", "base"): ev(0, 0.6, 0.8, 1.0)}
    for i, (p, mass) in enumerate([(0.55, 0.75), (0.4, 0.6), (0.2, 0.4), (0.6, 0.8)]):
        evs[("m", f"c{i}")] = ev(10 + i, p, mass, 1.0 - i / 10)
    rows = isolate.sink_text_rows(evs, last_k=1)
    assert list(rows.condition) == ["c0", "c1", "c2", "c3"]
    assert rows.loc[rows.condition == "c2", "sink mass change"].iloc[0] == pytest.approx(-0.4)
    assert rows.loc[rows.condition == "c1", "S change"].iloc[0] == pytest.approx(-0.1)
    corr = isolate.sink_text_correlation(rows).set_index("metric")
    assert corr.loc["strict-format mean", "n"] == 4 and corr.loc["strict-format mean", "rho"] > 0.7
    assert 0 < corr.loc["strict-format mean", "p"] <= 1
    both = isolate.sink_text_correlation(pd.concat([rows, rows.assign(model="n")]))
    assert set(both.model) == {"m", "n", "all models"} and both[both.model == "all models"].n.iloc[0] == 8
    assert isolate.correlation_sentence(corr.reset_index()).startswith("m: strict-format mean rho +")
    # each rho is read against 5 %: the predicted sign for the strict format, only "outside chance" for knowledge
    fake = pd.DataFrame({"model": ["m", "m", "k", "k"], "metric": ["strict-format mean", "knowledge acc"] * 2,
                         "n": [10] * 4, "rho": [-0.83, 0.7, 0.8, 0.1], "p": [0.005, 0.02, 0.01, 0.6]})
    text = isolate.correlation_sentence(fake)
    assert "rho -0.83 (p 0.005, n 10; negative, the opposite of the sign the mechanism predicts)" in text
    assert "knowledge rho +0.70 (p 0.020, n 10; positive, outside chance)" in text
    assert "rho +0.80 (p 0.010, n 10; positive, the sign the mechanism predicts)" in text
    assert "knowledge rho +0.10 (p 0.600, n 10; within chance)" in text
    crit = isolate.critical_sentence(pd.concat([rows, rows.assign(model="n").iloc[:3]]))
    assert crit.startswith("4 conditions (m) no rho reaches p < 0.05") and "3 conditions (n)" in crit
    with pytest.raises(ParameterError, match="base"):
        isolate.sink_text_rows({("m", "vl"): evs[("m", "c0")]}, last_k=1)


def test_critical_rho_matches_the_exact_table():
    # two-sided 5 % critical values of Spearman's rho (exact null): n = 8 -> 0.738, n = 6 -> 0.886
    assert isolate.critical_rho(8) == pytest.approx(0.738, abs=1e-3)
    assert isolate.critical_rho(6) == pytest.approx(0.886, abs=1e-3)
    assert isolate.critical_rho(4) != isolate.critical_rho(4)  # n = 4 cannot reach 5 % two-sided: NaN
    # beyond n = 9 from 9999 random orderings: near the table's 0.587 (n = 12) and 0.538 (n = 14)
    assert 0.56 < isolate.critical_rho(12) < 0.62 and 0.51 < isolate.critical_rho(14) < 0.57
    with pytest.raises(ParameterError, match="'n'"):
        isolate.critical_rho(2)


def test_step_reading_says_which_way_each_step_moves(evaluations):
    t = isolate.decomposition(evaluations, seed=0)
    s = isolate.step_reading(t)
    assert s.startswith("m: fine-tuning as such ")
    fmt = t[(t.step == "one-word answer format") & (t.metric == "strict-format mean")].iloc[0]
    assert fmt.hi < 0 and "one-word answer format lowers the strict-format mean (" in s
    assert s.count(", and the lenient math score ") == 3


def test_random_sizes_evaluates_each_size_per_model_and_plots(monkeypatch):
    from sinklib.adapt import pairs

    calls = []

    def fake(lm, pair, condition, **kw):
        calls.append((condition, kw["sink_kwargs"]["last_k_layers"]))
        return _ev(0, 0.6, 0.6, 0.6)
    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    monkeypatch.setattr(pairs, "sink_settings", lambda model, k, t: {"last_k_layers": k, "max_tokens": t})

    class P:
        params = {"model": "m", "seed": 0}  # no cached checkpoint: the weight change is computed
        states = {"base": {"w": torch.ones(2, 2)}, "vl": {"w": torch.ones(2, 2) * 1.1},
                  "random": {"w": torch.ones(2, 2) * 0.9}}
    evs = {("m", "base"): _ev(0, 0.6, 0.6, 0.6), ("m", "random"): _ev(0, 0.6, 0.6, 0.6)}
    curve = isolate.random_sizes({"m": type("LM", (), {"model": None})()}, {"m": P}, evs, [2, 8], seed=0,
                                 eval_n={"math": 60}, last_k_layers=3, max_tokens=16)
    assert calls == [("random x8", 3), ("random x2", 3)] and ("m", "random x2") in evs
    assert sorted(set(curve.scale)) == [1.0, 2.0, 8.0]
    assert curve[curve.scale == 8]["relative change"].iloc[0] == pytest.approx(8 * 0.1)
    fig = isolate.plot_random_curve(curve, {"m": -3.0})
    assert fig.axes[0].get_title() == "m"
    top = fig.axes[0].child_axes[0]  # the multiples of VL's norm, marked on a top axis
    assert [t.get_text() for t in top.get_xticklabels()] == ["1x", "2x", "8x"]


def test_plot_sink_text_labels_every_condition():
    rows = pd.DataFrame({"model": ["m", "m", "n"], "condition": ["vl", "vl seed 2", "random x4"],
                         "sink mass change": [0.1, -0.2, 0.0], "strict-format mean change": [1.0, -3.0, 0.5],
                         "knowledge acc change": [0.0, 1.0, -1.0]})
    fig = isolate.plot_sink_text(rows)
    assert [ax.get_title() for ax in fig.axes] == ["m", "n"]
    assert [t.get_text() for t in fig.axes[0].texts] == ["VL (2 seeds)"]  # one label per condition
    assert fig.axes[0].texts[0].xy == (pytest.approx(-0.05), pytest.approx(-1.0))  # at the seeds' mean
    assert [t.get_text() for t in fig.axes[1].texts] == []  # random controls are hollow and unlabelled
    assert len(fig.axes[1].collections) == 2 and len(fig.axes[0].collections) == 2


def test_condition_means_pool_seed_replicates_before_correlating():
    import pandas as pd

    from sinklib.adapt.isolate import condition_means, sink_text_correlation

    rows = pd.DataFrame({
        "model": ["m"] * 7,
        "condition": ["vl", "vl seed 1", "vl seed 2", "text_only", "text_only seed 1", "random", "isolate"],
        "sink mass change": [0.1, 0.3, 0.2, -0.5, -0.3, 0.0, 0.4],
        "S change": [0.0] * 7,
        "strict-format mean change": [1.0, 3.0, 2.0, -5.0, -3.0, 0.0, 4.0],
        "knowledge acc change": [0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0]})
    means = condition_means(rows)
    assert list(means["condition"]) == ["vl", "text_only", "random", "isolate"]
    assert list(means["replicates"]) == [3, 2, 1, 1]
    assert means.loc[means.condition == "vl", "sink mass change"].item() == pytest.approx(0.2)
    assert means.loc[means.condition == "text_only", "strict-format mean change"].item() == pytest.approx(-4.0)
    corr = sink_text_correlation(means)
    strict = corr[corr.metric == "strict-format mean"].iloc[0]
    assert strict["n"] == 4 and strict["rho"] == pytest.approx(1.0)
    assert strict["p"] >= 2 / 24 - 1e-12       # n = 4: the smallest exact two-sided p is 2/24


def _means(rows):
    return pd.DataFrame([{"model": m, "condition": c, "sink mass change": s, "strict-format mean change": f,
                          "knowledge acc change": 0.0, "replicates": r} for m, c, s, f, r in rows])


def test_sink_caveat_counts_sizes_and_names_the_opposite_sign():
    rows = [("m", "vl", 0.01, 1.0, 3), ("m", "text_only", -0.02, -19.0, 3), ("m", "random", 0.0001, 0.5, 3),
            ("m", "text_sentence", 0.005, -8.0, 1)] + [("m", f"random x{k:g}", -0.001 * k, -k, 1) for k in (2, 4, 8, 16, 32)]
    s = isolate.sink_caveat(_means(rows), {("m", "text_sentence"): True, ("m", "text_only"): True})
    assert s.startswith("m: 5 of its 9 conditions are the 1x random direction at other sizes, so its rho largely")
    assert "over its other 4 conditions, strict-format mean rho" in s
    assert "text-only, sentences (sink mass +0.0050, strict-format mean -8.0)" in s and "text-only (sink" not in s
    assert "VL, text-only and random are means over 3 training seeds, the other conditions training seed 0 alone" in s
    few = isolate.sink_caveat(_means(rows[:4] + rows[4:5]), {})
    assert "so its rho largely" not in few and "against the predicted sign" not in few


def test_strict_lenient_sentence_follows_the_first_harms():
    def curve(strict_from, lenient_from):
        rows = []
        for k in (1.0, 4.0, 16.0):
            for metric, f in (("math strict", strict_from), ("math lenient", lenient_from)):
                hurt = f is not None and k >= f
                rows.append({"model": "m", "scale": k, "metric": metric, "change": -5.0 if hurt else 0.0,
                             "lo": -9.0 if hurt else -3.0, "hi": -1.0 if hurt else 3.0})
        return pd.DataFrame(rows)

    assert "at the same size (16x), so what the random change takes there is arithmetic" in \
        isolate.strict_lenient_sentence(curve(16.0, 16.0))
    assert "strict math falls first (4x; lenient from 16x), so the answer format goes first" in \
        isolate.strict_lenient_sentence(curve(4.0, 16.0))
    assert "lenient math falls first (4x; strict at no size)" in isolate.strict_lenient_sentence(curve(None, 4.0))
    assert "neither strict nor lenient" in isolate.strict_lenient_sentence(curve(None, None))
