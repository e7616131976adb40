"""sinklib.causal.reading: chapter 8's predictions judged, the matched control at dose 1, and the plain finding,
on made-up tables whose answer is known."""
import pandas as pd

from sinklib.causal import reading as R
from sinklib.evals.paired import pack


def _dose(math_sink=(-20, -30, -10), know_sink=(-1, -4, 2)):
    rows = []
    for m in ("a", "b"):
        for d in (0.5, 0.7):
            rows.append({"model": m, "dose": d, "control": "sink", "metric": "math strict", "change": math_sink[0],
                         "lo": math_sink[1], "hi": math_sink[2]})
            rows.append({"model": m, "dose": d, "control": "sink", "metric": "knowledge acc", "change": know_sink[0],
                         "lo": know_sink[1], "hi": know_sink[2]})
            rows.append({"model": m, "dose": d, "control": "matched", "metric": "math strict", "change": -40,
                         "lo": -50, "hi": -30, "mass_diff": 0.08 if m == "a" else 0.06, "matched_ok": False})
    return pd.DataFrame(rows)


def _spec(random_hi=5.0, matched_tested=False):
    rows = []
    for m in ("a", "b"):
        for d in (0.3, 0.5, 0.7):
            for c in ("random", "matched"):
                rows.append({"model": m, "dose": d, "against": c, "metric": "math strict",
                             "sink minus control": -3.0, "lo": -10.0, "hi": random_hi,
                             "tested": c == "random" or matched_tested})
    return pd.DataFrame(rows)


def test_prediction_1_holds_only_when_math_falls_and_knowledge_does_not():
    assert R.prediction_1(_dose(), ["a", "b"]).startswith("(1) held")
    assert R.prediction_1(_dose(know_sink=(-9, -15, -3)), ["a", "b"]).startswith("(1) did not hold (a at 0.5")
    assert R.prediction_1(_dose(math_sink=(-5, -12, 2)), ["a"]).startswith("(1) did not hold")
    assert "not tested" in R.prediction_1(_dose(), ["c"])


def test_prediction_2_needs_a_contrast_below_zero():
    assert R.prediction_2(_spec()).startswith("(2) did not hold: in none of the 4 strict-format contrasts")
    assert R.prediction_2(_spec(random_hi=-1.0)).startswith("(2) held")


def test_prediction_3_is_not_tested_when_the_mass_was_never_matched():
    s = R.prediction_3(_spec(), _dose())
    assert s.startswith("(3) not tested") and "+0.060 to +0.080" in s
    assert R.prediction_3(_spec(matched_tested=True), _dose()).startswith("(3) held")


def _res(sink, matched, n=40):
    return {(1.0, "sink"): {"outcomes": pack({"math strict": sink, "knowledge acc": [True] * n})},
            (1.0, "matched"): {"outcomes": pack({"math strict": matched, "knowledge acc": [True] * n})}}


def test_matched_at_full_compares_where_the_mass_is_matched_only():
    n = 40
    sink, matched = [i % 2 == 0 for i in range(n)], [False] * n  # matched loses every passed item, sink none
    table = pd.DataFrame([{"model": "a", "dose": 1.0, "control": "matched", "matched_ok": True},
                          {"model": "b", "dose": 1.0, "control": "matched", "matched_ok": False}])
    full = R.matched_at_full({"a": _res(sink, matched, n), "b": _res(sink, matched, n)}, table, ["a", "b"])
    assert set(full.model) == {"a"}
    m = full[full.metric == "math strict"].iloc[0]
    assert m["sink minus matched"] == 50.0 and m.lo > 0
    s = R.dose1_sentence(full)
    assert s.startswith("a: removing the sink cost less than taking the same mass from other keys")
    assert R.dose1_sentence(full.iloc[:0]).startswith("at dose 1 the matched control is outside its tolerance")


def test_plain_finding_follows_the_verdicts_and_contrasts():
    verdicts = pd.DataFrame([{"model": "a", "control": "sink", "format_dose": 0.3, "knowledge_dose": None},
                             {"model": "b", "control": "sink", "format_dose": None, "knowledge_dose": 0.5}])
    bos = pd.DataFrame([{"model": "b", "first token": "none", "metric": "knowledge acc", "change": -20, "lo": -30,
                         "hi": -10},
                        {"model": "b", "first token": "none", "metric": "instructions strict", "change": 2, "lo": -9,
                         "hi": 12}])
    s = R.plain_finding(verdicts, _spec(), pd.DataFrame(), bos, ["a", "b"])
    assert "strict format in a (from dose 0.3) and in no other model; knowledge did not fall at any dose" in s
    assert "As many random heads cost about as much" in s
    assert "Evaluating b without its BOS token cost knowledge acc, but not strict instruction format" in s
    assert "In none" not in R.plain_finding(verdicts, _spec(random_hi=-1.0), pd.DataFrame(), bos, ["a"])


def test_plain_finding_names_the_metric_that_fell_and_its_lenient_twin():
    verdicts = pd.DataFrame([{"model": "a", "control": "sink", "format_dose": 0.5, "knowledge_dose": None}])
    table = pd.DataFrame([
        {"model": "a", "dose": 0.5, "control": "sink", "metric": "math strict", "lo": -30, "hi": -10},
        {"model": "a", "dose": 0.5, "control": "sink", "metric": "math lenient", "lo": -30, "hi": -10},
        {"model": "a", "dose": 0.5, "control": "sink", "metric": "instructions strict", "lo": -9, "hi": 3}])
    spec = _spec()
    spec.loc[0, ["lo", "hi", "sink minus control"]] = [2.0, 20.0, 11.0]  # one contrast the other way
    s = R.plain_finding(verdicts, spec, pd.DataFrame(), pd.DataFrame(), ["a"], table=table)
    assert s.startswith("Removing the sink from the heads that use it most cost math strict in a")
    table2 = table.assign(change=[-20.0, -20.0, -3.0])
    assert "in a (from dose 0.5: math strict -20.0 [-30.0, -10.0])" in R.plain_finding(
        verdicts, spec, pd.DataFrame(), pd.DataFrame(), ["a"], table=table2)
    assert ("What fell was math strict; instructions strict never fell, and math lenient fell with it, so the loss "
            "is in the task itself") in s
    assert "Together, these tests do not show the role the paper's mechanism needs: the loss is not specific" in s
    assert "go the other way (uncorrected for their number): the random heads cost more (a math strict at 0.3: sink "\
           "minus random +11.0" in s


def test_plain_finding_reads_the_matched_control_below_dose_one_where_it_is_tested():
    verdicts = pd.DataFrame([{"model": "a", "control": "sink", "format_dose": 0.5, "knowledge_dose": None}])
    untested = R.plain_finding(verdicts, _spec(), pd.DataFrame(), pd.DataFrame(), ["a"])
    assert "outside its tolerance at every dose below 1, so it tests nothing there" in untested
    assert untested.endswith("not specific to the sink heads.")
    spec = _spec(matched_tested=True)
    spec.loc[(spec.against == "matched") & (spec.dose == 0.3) & (spec.model == "a"), ["lo", "hi"]] = [1.0, 9.0]
    s = R.plain_finding(verdicts, spec, pd.DataFrame(), pd.DataFrame(), ["a"])
    assert ("within its tolerance in 6 of 6 strict-format contrasts below dose 1): the sink heads cost more outside "
            "the noise in 0 and less in 1 (a math strict at 0.3: ") in s
    assert s.endswith("nor to the sink as such: the same attention mass taken from other keys cost as much or more, "
                      "though that control works on more heads and takes all the content of sink-dominated heads "
                      "(section 8.1).")
    spec.loc[(spec.against == "matched") & (spec.dose == 0.5), ["lo", "hi"]] = [-9.0, -1.0]
    assert "Together" not in R.plain_finding(verdicts, spec, pd.DataFrame(), pd.DataFrame(), ["a"])


def test_tiny_sentence_says_when_no_sink_formed():
    rows = [{"variant": v, "S at init": 0.1, "S": s, "sink formed": f}
            for v, s, f in (("none", -0.3, False), ("per_head", -0.1, False))]
    words = R.tiny_sentence(rows)
    assert words.startswith("None of chapter 7's tiny models formed a sink") and "no QK-norm +0.10 to -0.30" in words
    rows[1]["sink formed"] = True
    assert "formed in the tiny model with per-head QK-norm" in R.tiny_sentence(rows)
    assert "but not in the one with no QK-norm" in R.tiny_sentence(rows)
    assert R.tiny_sentence([]) == ""


def test_plain_finding_adds_the_pooled_random_sets_where_they_ran():
    from sinklib.causal.specific import POOLED

    spec = pd.DataFrame([{"model": "m", "dose": 0.5, "against": a, "metric": "math strict", "sink minus control": v,
                          "lo": lo, "hi": hi, "tested": True, "draws": d}
                         for a, v, lo, hi, d in (("random", -2.0, -6.0, 2.0, None), (POOLED, -5.0, -9.0, -1.0, 3))])
    verdicts = pd.DataFrame([{"model": "m", "control": "sink", "format_dose": 0.5, "knowledge_dose": None}])
    text = R.plain_finding(verdicts, spec, pd.DataFrame(), pd.DataFrame(), ["m"])
    assert "Pooled over 3 random head sets per dose (added after the previous run, which drew one)" in text
    assert "(the first random set of each dose, the pre-registered control)" in text
    assert "Together" not in text  # the pooled sets show the sink heads costing more
    assert "cost more strict format outside the noise in 1 of 1 contrasts." in text
    assert "Pooled" not in R.plain_finding(verdicts, spec[spec.against == "random"], pd.DataFrame(), pd.DataFrame(),
                                           ["m"])


def test_dose1_sentence_tells_a_missing_dose_from_an_untested_one():
    empty = pd.DataFrame(columns=["model", "metric", "sink minus matched", "lo", "hi", "p"])
    no_dose1 = pd.DataFrame([{"dose": 0.5, "control": "matched"}])
    assert R.dose1_sentence(empty, no_dose1).startswith("this run has no matched control at dose 1")
    assert R.dose1_sentence(empty, pd.DataFrame([{"dose": 1.0, "control": "matched"}])).startswith(
        "at dose 1 the matched control is outside its tolerance")


def test_prediction_3_says_which_way_it_failed():
    import pandas as pd

    spec = pd.DataFrame({"model": ["a", "a"], "dose": [0.5, 0.7], "against": ["matched"] * 2,
                         "metric": ["math strict"] * 2, "sink minus control": [12.0, 8.0], "lo": [4.0, 2.0],
                         "hi": [20.0, 14.0], "tested": [True, True]})
    s = R.prediction_3(spec, pd.DataFrame())
    assert s == ("(3) did not hold: 0 of 2 tested strict-format contrasts inside the noise; the matched control cost "
                 "more in 2 (sink minus matched from +8.0 to +12.0 points)")


def test_dose1_sentence_in_brief_groups_models_with_the_same_answer():
    full = pd.DataFrame([{"model": m, "metric": "math strict", "sink minus matched": 10.0, "lo": 2.0, "hi": 18.0,
                          "p": 0.01} for m in ("a", "b")])
    assert R.dose1_sentence(full, brief=True) == ("in a and b, removing the sink cost less than taking the same mass "
                                                  "from other keys")
    assert "(sink minus matched: math strict +10.0 [+2.0, +18.0])" in R.dose1_sentence(full)


def test_twin_sentence_counts_conditions_where_strict_and_lenient_agree():
    rows = [{"model": "a", "metric": f"math {g}", "base": 40.0, "other": o, "dose": d}
            for d, (s, le) in ((0.3, (30.0, 30.0)), (0.5, (20.0, 25.0))) for g, o in (("strict", s), ("lenient", le))]
    rows += [{"model": "b", "metric": f"math {g}", "base": b, "other": 10.0, "dose": 0.3}
             for g, b in (("strict", 20.0), ("lenient", 25.0))]
    s = R.twin_sentence(pd.DataFrame(rows), ["a", "b"])
    assert s.startswith("math strict and math lenient give the same score in a: 1 of 2 conditions (unablated both "
                        "40.0 %")
    assert s.endswith("; b: 0 of 1 conditions")
    assert R.twin_sentence(pd.DataFrame(rows), ["c"]) == ""
