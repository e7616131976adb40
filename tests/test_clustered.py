"""The instruction-type (cluster) bootstrap of `sinklib.evals.clustered` against the item-level one."""
import numpy as np
import pytest

from sinklib.errors import ParameterError
from sinklib.evals import clustered, paired


def _outs(strict):
    return {"instructions strict": [bool(x) for x in strict]}


def test_point_value_is_the_item_level_one_and_draws_are_deterministic():
    rng = np.random.default_rng(1)
    b, o = rng.random(120) < 0.5, rng.random(120) < 0.4
    labels = [i // 12 for i in range(120)]
    pt, draws = clustered.change(_outs(b), _outs(o), labels)
    assert pt == pytest.approx(paired.change(_outs(b), _outs(o), "instructions strict")[0])
    assert np.array_equal(draws, clustered.change(_outs(b), _outs(o), labels)[1])


def test_one_item_per_group_matches_the_item_bootstrap_spread():
    rng = np.random.default_rng(2)
    b, o = rng.random(300) < 0.5, rng.random(300) < 0.45
    _, item = paired.change(_outs(b), _outs(o), "instructions strict")
    _, typed = clustered.change(_outs(b), _outs(o), list(range(300)))
    assert 0.85 < typed.std() / item.std() < 1.15


def test_items_that_fail_together_give_a_design_effect_near_the_group_size():
    # 20 groups of 10 items; the other condition loses whole groups at once
    rng = np.random.default_rng(3)
    labels = [i // 10 for i in range(200)]
    base = np.ones(200, bool)
    lost = rng.random(20) < 0.3
    other = ~lost[np.asarray(labels)]
    _, item = paired.change(_outs(base), _outs(other), "instructions strict")
    _, typed = clustered.change(_outs(base), _outs(other), labels)
    assert 6 < typed.var() / item.var() < 14


def test_a_label_count_that_does_not_match_the_items_is_a_clear_error():
    with pytest.raises(ParameterError, match="one label per item"):
        clustered.change(_outs([1, 0, 1]), _outs([1, 1, 1]), ["a", "b"])
    with pytest.raises(ParameterError, match="at least 2 groups"):
        clustered.cluster_index(1)


def test_one_type_has_no_interval_and_says_so():
    pt, draws = clustered.change(_outs([1, 0, 1]), _outs([1, 1, 1]), ["a", "a", "a"])
    e = paired.estimate(pt, draws)
    assert pt == pytest.approx(100 / 3) and np.isnan(draws).all()
    assert clustered.cell(e) == "+33.3 [no interval]"


def test_the_calibration_sweep_reads_its_points_by_type():
    from sinklib.adapt import calibrate

    rng = np.random.default_rng(5)
    labels = [i // 5 for i in range(50)]
    base = _outs(np.ones(50, bool))
    res = {"base": {"outcomes": base},
           "points": [{"lr_lm": 5e-5, "steps": 60, "eval": {"outcomes": _outs(rng.random(50) < 0.95)}},
                      {"lr_lm": 5e-4, "steps": 60, "eval": {"outcomes": _outs(np.arange(50) >= 25)}}]}
    t = calibrate.by_type(res, labels)
    assert list(t.steps) == [60, 60] and list(t.lr_lm) == [5e-5, 5e-4]
    assert t["change, items resampled"][1].v == pytest.approx(-50.0)
    frozen = {"lr_lm": 5e-4, "stage2_steps": 60}
    text = calibrate.by_type_sentence(t, "m, full", frozen)
    assert text.startswith("m, full: ") and "the frozen point (rate 5e-4 for 60 steps) -50.0 [" in text
    assert "by type (design effect" in text and "smallest detectable fall" in text
    assert calibrate.by_type_display(t, "m").frame.shape == (2, 4)
    found = calibrate.by_type_finding({"m, full": (t, frozen), "m, other": (t, None)})
    e = t["change, types resampled"][1]
    assert found.startswith(f"m, full: the frozen point's loss {'stays' if e.hi < 0 else 'does not stay'} outside")
    assert "m, other: no recipe was frozen" in found
    rec = calibrate.outcomes_record(res)
    assert list(rec) == ["base", "5e-5/60", "5e-4/60"] and rec["5e-4/60"]["instructions strict"] == "0" * 25 + "1" * 25


def test_instruction_types_label_the_suite_in_the_runners_item_order():
    from sinklib.evals import items

    labels = clustered.instruction_types(360)
    rows = items.sample(items.load_instruction_suite(360), 360, 0)
    assert len(labels) == 360 and len(set(labels)) == 30
    assert [tuple(r["instruction_id_list"]) for r in rows] == labels
    assert len(clustered.instruction_types(72)) == 72
    sizes = np.bincount(clustered.groups(labels))
    multi = sum(len(t) > 1 for t in set(labels))
    assert clustered.composition(labels) == (f"360 items in 30 instruction types of {sizes.min()} to {sizes.max()} "
                                             f"items ({multi} of them combine two or more checkers)")
    assert clustered.composition(["a", "a", "b", "b"]) == "4 items in 2 instruction types of 2 items"


def test_the_design_effect_is_the_cluster_robust_over_the_independent_variance():
    labels = [i // 10 for i in range(200)]
    whole = np.repeat(np.random.default_rng(6).choice([0.0, -1.0], 20), 10)     # groups change as a whole
    assert 8 < clustered.design_effect(whole, labels) < 11                      # about the group size
    mixed = np.random.default_rng(7).choice([0.0, -1.0, 1.0], 200)               # independent items
    assert 0.5 < clustered.design_effect(mixed, labels) < 1.6
    assert np.isnan(clustered.design_effect(np.zeros(200), labels))             # no spread at all
    assert np.isnan(clustered.design_effect([1.0, 0.0], ["a", "a"]))            # one group


def _doc(seeds):
    rng = np.random.default_rng(4)
    labels = [i // 6 for i in range(60)]
    outs = {"base": paired.pack(_outs(rng.random(60) < 0.6))}
    for s in seeds:
        name = "vl" if s == 0 else f"vl seed {s}"
        outs[name] = paired.pack(_outs(rng.random(60) < 0.5))
    return {"results": {"outcomes": {"m": outs}}}, labels


def test_the_table_pools_seeds_and_keeps_the_item_level_point():
    from sinklib.evals.pooling import pooled

    doc, labels = _doc([0, 1, 2])
    rows = clustered.table(doc, ["m", "absent"], labels)
    assert list(rows.model) == ["m"]
    r = rows.iloc[0]
    assert r.seeds == 3 and r.types == 10 and r["items"] == 60
    assert r["change, types resampled"].v == pytest.approx(pooled(doc, "m", "vl", "base",
                                                                   ["instructions strict"])[0].v)
    assert r["effective items"] <= 60
    assert r["smallest detectable fall, types"] >= r["smallest detectable fall, items"] or r["design effect"] < 1


def test_the_sentence_counts_changes_outside_each_noise():
    from sinklib.stats.verdicts import Est
    import pandas as pd

    rows = pd.DataFrame([
        {"model": "a", "items": 360, "types": 30, "change, items resampled": Est(-5, -9, -1),
         "change, types resampled": Est(-5, -11, 1), "design effect": 2.5,
         "smallest detectable fall, items": 6.5, "smallest detectable fall, types": 11.5},
        {"model": "b", "items": 360, "types": 30, "change, items resampled": Est(-9, -14, -4),
         "change, types resampled": Est(-9, -15, -3), "design effect": 1.4,
         "smallest detectable fall, items": 6.5, "smallest detectable fall, types": 8.0}])
    text = clustered.sentence(rows, {"a": "A"})
    assert "2 of 2 changes lie outside the item-level" in text and "1 of them outside the type-level one (b)" in text
    assert "is 6.5 points with the items taken as independent and 8.0-11.5 at the effective numbers" in text
    assert "A -5.0 [-9.0, -1.0] by item, -5.0 [-11.0, +1.0] by type (design effect 2.5)" in text
    assert "So 1 of the changes that the item-level intervals put outside the noise is inside it" in text
    nan = float("nan")
    rows.loc[0, "change, types resampled"] = Est(-5, nan, nan)
    rows.loc[0, "design effect"] = nan
    rows.loc[0, "smallest detectable fall, types"] = nan
    text = clustered.sentence(rows)
    assert "-5.0 [no interval] by type (design effect -)" in text
    assert "and 1 of them outside the type-level one (b) (1 without a type-level interval: one type only)" in text
    assert "Every change outside the item-level noise stays outside it" in text and "inside it" not in text
    assert "and 8.0 at the effective numbers" in text


def test_no_loss_anywhere_reads_as_none_instead_of_failing():
    """A sweep or panel where no point loses beyond the item-level noise (every quick run): the selections are
    empty frames, not a selection of no columns."""
    from sinklib.adapt import calibrate

    labels = [i // 2 for i in range(8)]
    same = _outs([1, 0] * 4)
    res = {"base": {"outcomes": same}, "points": [{"lr_lm": 5e-5, "steps": 2, "eval": {"outcomes": same}}]}
    t = calibrate.by_type(res, labels)
    assert calibrate.by_type_sentence(t, "m", None).startswith("m: 0 of 1 points lose strict instruction format")
    assert calibrate.by_type_finding({"m": (t, {"lr_lm": 5e-5, "stage2_steps": 2})}).startswith(
        "m: the frozen point's loss does not stay outside the noise")
    doc = {"results": {"outcomes": {"m": {"base": paired.pack(same), "vl": paired.pack(same)}}}}
    assert "0 of 1 changes lie outside the item-level" in clustered.sentence(clustered.table(doc, ["m"], labels))


def test_seed_pairs_pair_each_seed_with_its_own_reference():
    """'base' pairs with every seed of the condition; another reference pairs seed by seed, and a seed whose
    reference has no outcomes is left out (never paired with another seed's reference)."""
    from sinklib.evals.pooling import seed_pairs

    outs = {c: {"name": c} for c in ("base", "vl", "vl seed 1", "vl seed 2", "text_only", "text_only seed 2")}
    doc = {"results": {"outcomes": {"m": outs}}}
    named = [(c["name"], r["name"]) for c, r in seed_pairs(doc, "m", "vl", "base")]
    assert named == [("vl", "base"), ("vl seed 1", "base"), ("vl seed 2", "base")]
    named = [(c["name"], r["name"]) for c, r in seed_pairs(doc, "m", "vl", "text_only")]
    assert named == [("vl", "text_only"), ("vl seed 2", "text_only seed 2")]
    assert seed_pairs(doc, "m", "vl", "random") == [] and seed_pairs(doc, "other", "vl", "base") == []


def test_intraclass_inverts_the_design_effect_of_equal_groups():
    labels = [g for g in range(10) for _ in range(5)]  # 10 types of 5 items
    assert clustered.intraclass(1 + 4 * 0.25, labels) == pytest.approx(0.25)
    assert clustered.intraclass(0.8, labels) == 0.0  # at or below 1: no positive correlation
    assert np.isnan(clustered.intraclass(float("nan"), labels)) and np.isnan(clustered.intraclass(2.0, list(range(7))))


def test_types_needed_is_the_fewest_types_that_detect_the_target():
    """With no correlation and one item per type it is the fewest items whose paired test detects the fall (found
    here by a plain scan); a correlation within types asks for more types, never fewer."""
    from sinklib.evals.power import mcnemar_power

    scan = next(n for n in range(1, 400) if mcnemar_power(n, 0.30, 0.05) >= 0.8)
    assert clustered.types_needed(30.0, 0.5, 0.0, 1) == scan
    k0, k1 = clustered.types_needed(30.0, 0.5, 0.0, 6), clustered.types_needed(30.0, 0.5, 0.3, 6)
    assert k0 * 6 >= scan > (k0 - 1) * 6 and k1 > k0
    assert clustered.types_needed(30.0, 0.5, 0.3, 6, most=2) is None
    with pytest.raises(ParameterError):
        clustered.types_needed(20.0, 0.5, float("nan"), 6)


def test_plan_sentence_gives_types_per_model_and_says_where_more_items_cannot_do():
    import pandas as pd

    labels = [g for g in range(10) for _ in range(6)]  # 10 types of 6 items
    n = clustered.items_needed(20.0)
    rows = pd.DataFrame([{"model": "a", "within-type correlation": 0.3, "within-type correlation, 10-90 %": (0.2, 0.4)},
                         {"model": "c", "within-type correlation": 0.0, "within-type correlation, 10-90 %": (0.0, 0.1)},
                         {"model": "b", "within-type correlation": float("nan")}])
    s = clustered.plan_sentence(rows, labels, 20.0, names={"a": "A"})
    need, lo, hi = (clustered.types_needed(20.0, None, r, 6) for r in (0.3, 0.2, 0.4))
    assert lo < need < hi and f"about {n} independent items would do" in s
    assert f"of 6 items would need about: A {need} (within-type correlation 0.30; {lo}-{hi} over its 10-90 %" in s
    assert 10 / 0.3 < n and f"stays below {n} for A (33): no number of items" in s
    assert f"(now 6 on average) would also do: about {clustered.items_per_type(n, 10, 0.0)} for c" in s and "b " not in s
    assert clustered.plan_sentence(rows.iloc[2:], labels, 20.0) == "no model has a design effect to plan from"


def test_items_per_type_and_the_span_of_the_correlation():
    assert clustered.items_per_type(100, 10, 0.0) == 10 and clustered.items_per_type(100, 10, 0.1) is None
    m = clustered.items_per_type(50, 10, 0.1)  # 10 m / (1 + (m - 1) 0.1) >= 50 from m = 9
    assert m == 9 and 10 * 8 / (1 + 7 * 0.1) < 50
    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(30), 10)
    diffs = (rng.normal(size=30)[labels] + rng.normal(size=300) > 1).astype(float)  # correlated within types
    lo, hi = clustered.intraclass_span(diffs, labels)
    rho = clustered.intraclass(clustered.design_effect(diffs, labels), labels)
    assert 0 <= lo < rho < hi
