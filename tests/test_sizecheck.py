"""sinklib.adapt.sizecheck: chapter 4's four predictions for the random sizes, each judged by its rule on
made-up runs where the outcome is known (as predicted, not as predicted, not tested)."""
import pandas as pd
import pytest

from sinklib.adapt.sizecheck import judge, kl_slope, sentence
from sinklib.errors import ParameterError

SCALES = [0.5, 2, 4, 8, 16, 32, 64]


def _kls(vl_kl: float, power: float = 2.0, c: float = 1e-4) -> dict:
    out = {"vl": {"kl": vl_kl}, "random": {"kl": c}}
    out.update({f"random x{k:g}": {"kl": c * k ** power} for k in SCALES})
    return out


def _curve(first_hurt: float, matched: float = 10.0, at_matched: float = 1.0) -> pd.DataFrame:
    rows = []
    for k in [*SCALES, 1.0, matched]:
        hurt = k >= first_hurt
        for metric in ("strict-format mean", "knowledge acc", "math strict"):
            change = -20.0 if hurt else (at_matched if (k == matched and metric == "strict-format mean") else 0.0)
            rows.append({"model": "m", "scale": float(k), "metric": metric, "change": change,
                         "lo": change - 3, "hi": change + 3 if not hurt else -1.0})
    return pd.DataFrame(rows)


VL = pd.DataFrame([{"model": "m", "change": 0.0, "lo": -5.0, "hi": 5.0}])


def test_slope_recovers_the_power_and_needs_two_sizes():
    assert kl_slope(_kls(0.01, power=2.0), SCALES) == pytest.approx(2.0)
    assert kl_slope(_kls(0.01, power=1.0), SCALES) == pytest.approx(1.0)
    assert kl_slope({"vl": {"kl": 1.0}, "random": {"kl": 1e-4}}, SCALES) is None


def test_all_four_as_predicted():
    f = judge({"m": _kls(0.01)}, _curve(first_hurt=32.0), VL, SCALES, {"m": 10.0})
    assert list(f.outcome) == ["as predicted"] * 4
    assert "slope 2.00" in f.measured.iloc[1] and "10x" in f.measured.iloc[1]
    assert sentence(f) == "m: 4 of 4 as predicted (1, 2, 3, 4)"


def test_each_prediction_can_fail():
    # (1) VL only 5 times the 1x random KL; (2) a linear KL reaches VL's late; (3) +8 outside VL's [-5, +5];
    # (4) harm already at 16x
    f = judge({"m": _kls(5e-4, power=1.0)}, _curve(first_hurt=16.0, at_matched=8.0), VL, SCALES, {"m": 10.0})
    assert list(f.outcome) == ["not as predicted"] * 4
    assert "first at 16x" in f.measured.iloc[3]
    assert sentence(f).startswith("m: 0 of 4 as predicted; not as predicted: 1 (5 times)")


def test_untested_when_the_quantity_was_not_measured():
    kls = {"vl": {"kl": 10.0}, **{k: v for k, v in _kls(0.01).items() if k != "vl"}}   # no size reaches VL
    f = judge({"m": kls}, _curve(first_hurt=1000.0), VL, SCALES, {"m": None})
    assert f.outcome.tolist() == ["as predicted", "not as predicted", "not tested", "not as predicted"]
    assert f.measured.iloc[3] == "at no size measured"


def test_missing_columns_are_a_clear_error():
    with pytest.raises(ParameterError, match="lacks the columns"):
        judge({"m": _kls(0.01)}, _curve(32.0), VL.drop(columns="lo"), SCALES, {"m": 10.0})


def test_no_model_with_the_sizes_is_said_in_words():
    f = judge({}, None, VL, SCALES, {})
    assert f.empty and list(f.columns) == ["model", "prediction", "said", "measured", "outcome"]
    assert "none of the four predictions was tested" in sentence(f)


def test_display_keeps_every_word_and_no_negative_zero():
    from sinklib.adapt.sizecheck import display

    vl = pd.DataFrame([{"model": "m", "change": -0.01, "lo": -5.0, "hi": 5.0}])
    f = judge({"m": _kls(0.01)}, _curve(first_hurt=32.0), vl, SCALES, {"m": 10.0})
    assert "against VL's 0.0 [-5.0, +5.0]" in f.measured.iloc[2]
    html = display(f)._repr_html_()
    assert "between 4x and 64x" in html and "..." not in html
    assert "rule applied (tolerances of 2 and 3 set after the run)" in html and "the prediction said" not in html
    assert "not distinguishable from VL" in f.said.iloc[2] and "training seed 0" in f.said.iloc[2]


def test_caveat_sentence_gives_the_paired_difference_and_the_size_below_the_first_harm():
    from sinklib.adapt.sizecheck import caveat_sentence
    from tests.test_isolate import _ev

    c = _curve(first_hurt=32.0).assign(p=0.5)
    ev = {("m", "base"): _ev(0, 0.6, 0.6, 0.5), ("m", "vl"): _ev(1, 0.6, 0.6, 0.5),
          ("m", "random x10"): _ev(2, 0.6, 0.6, 0.5)}
    s = caveat_sentence(ev, c, {"m": 10.0}, seed=0)
    assert s.startswith("m: (3) random at 10x minus VL, paired on the same items (training seed 0): ")
    assert "(4) first harm at 32x; one size below it, at 16x, the strict-format mean changed 0.0 [-3.0, +3.0] (p 0.500)" in s
    assert caveat_sentence({}, _curve(first_hurt=1000.0).assign(p=0.5), {"m": None}) == ""
