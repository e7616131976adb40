"""Claim rows 9c-9e (chapter 8's H2 and H3): each decided by the one rule (`decide` with counts) from chapter 8's
stored contrasts, so the verdict follows the data; a control outside its tolerance is not tested, not a verdict."""
import pytest

from sinklib import claims
from sinklib.book import runner as book
from sinklib.claims.ch8 import detectable_contrast
from sinklib.errors import ResultsMissing
from sinklib.stats.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_TESTED, REPRODUCED

BY_ID = {c.id: c for c in claims.CLAIMS}
C8 = "08_causal_tests"
STRICT = ("instructions strict", "math strict")


def _fake(monkeypatch, doc):
    def load(notebook, key=None):
        if notebook != C8:
            raise ResultsMissing(notebook)
        return doc
    monkeypatch.setattr(book, "load_results", load)


def _doc(results):
    return {"results": results, "parameters": {"profile": "quick"},
            "provenance": {"profile": "quick", "models": [{"name": "m"}]}}


def _spec(against, v, tested=True, doses=(0.5, 0.7), pooled=False, odd=None):
    """Contrasts sink minus `against` of value `v` (interval v +- 4) on the strict metrics at `doses`; `odd`: one
    value for the last strict contrast instead; knowledge and doses 0.3 and 1 carry the opposite sign (ignored)."""
    name = f"{against}, pooled" if pooled else against
    cells = [(d, mt) for d in doses for mt in STRICT]
    vals = {c: (odd if odd is not None and c == cells[-1] else v) for c in cells}
    vals.update({(d, "knowledge acc"): -v for d in doses})
    vals.update({(d, mt): -v for d in (0.3, 1.0) for mt in STRICT if d not in doses})
    return [{"model": "m", "dose": d, "against": name, "metric": mt, "sink minus control": x, "lo": x - 4,
             "hi": x + 4, "tested": tested, "mass removed, sink": 0.7, "mass removed, control": 0.6,
             **({"draws": 3} if pooled else {})} for (d, mt), x in vals.items()]


#: (claim id, chapter 8's results, verdict): `tests.test_claims` counts these in its three-cases check
CASES = [
    ("9c", {"specificity": _spec("random", -10.0)}, REPRODUCED),            # every strict contrast below zero
    ("9c", {"specificity": _spec("random", 0.0)}, INCONCLUSIVE),            # inside the noise
    ("9c", {"specificity": _spec("random", 10.0)}, CONTRADICTED),           # the random heads cost more
    ("9c", {"specificity": _spec("random", -10.0, odd=10.0)}, CONTRADICTED),    # one against is enough
    ("9c", {"specificity": _spec("random", -10.0, odd=0.0)}, INCONCLUSIVE),     # three of four is not every
    ("9c", {"specificity": _spec("random", -10.0, doses=(0.3,))}, NOT_TESTED),  # only unpredicted doses
    ("9c", {"specificity": _spec("random", 0.0) + _spec("random", -10.0, pooled=True)}, REPRODUCED),  # pooled decides
    ("9d", {"specificity": _spec("matched", -10.0)}, REPRODUCED),
    ("9d", {"specificity": _spec("matched", 0.0)}, INCONCLUSIVE),
    ("9d", {"specificity": _spec("matched", 10.0)}, CONTRADICTED),
    ("9d", {"specificity": _spec("matched", -10.0, tested=False)}, NOT_TESTED),  # outside tolerance: no verdict
]


@pytest.mark.parametrize("cid,results,expected", CASES)
def test_specificity_rows_follow_the_contrasts(monkeypatch, cid, results, expected):
    _fake(monkeypatch, _doc(results))
    e = claims.evaluate(BY_ID[cid])
    assert e.row.verdict == expected, e.row
    assert e.row.tests == (0 if expected == NOT_TESTED else 1)


def test_detectable_contrast_reads_the_intervals():
    rows = [{"metric": "math strict", "lo": -4.0, "hi": 4.0}, {"metric": "math strict", "lo": 0.0, "hi": 12.0}]
    assert detectable_contrast(rows) == {"math strict": pytest.approx(2.8 / 1.96 * 5.0)}


def test_specificity_row_names_its_pooling_and_the_first_draw(monkeypatch):
    _fake(monkeypatch, _doc({"specificity": _spec("random", 0.0) + _spec("random", -10.0, pooled=True)}))
    ours = claims.evaluate(BY_ID["9c"]).row.ours[0]
    assert "math strict at dose 0.7: −10.0 [−14.0, −6.0]" in ours and "pooled over 3 draws" in ours
    assert "first draw of random heads alone: inconclusive" in ours and "at most 0.60 against at least 0.70" in ours
    assert "knowledge" not in ours and "dose 0.3" not in ours     # only the strict contrasts at the predicted doses
    _fake(monkeypatch, _doc({"specificity": _spec("random", -10.0, pooled=True)}))   # no first draw stored
    assert "first draw" not in claims.evaluate(BY_ID["9c"]).row.ours[0]


def test_random_row_counts_the_sink_heads_the_random_sets_share(monkeypatch):
    import numpy as np

    from sinklib import causal

    mass = np.random.default_rng(3).random((6, 4))
    doc = _doc({"specificity": _spec("random", 0.0), "sink_mass": {"m": mass.tolist()}})
    doc["parameters"].update(last_k_layers=4, fractions=[0.0, 0.5, 0.7, 1.0], seed=2, random_draws=3)
    _fake(monkeypatch, doc)
    ours = claims.evaluate(BY_ID["9c"]).row.ours[0]
    plans = causal.dose_plans(mass, [2, 3, 4, 5], [0.0, 0.5, 0.7, 1.0], seed=2, random_draws=3)
    want = causal.shared_sentence({"m": causal.shared_with_sink(plans)}).split(": ", 1)[1]
    assert f"last 4 layers, the sink heads among them, so they share some of the sink heads ({want})" in ours
    assert " of 8 at dose 0.5" in want and "dose 1" not in want   # k: half of the 16 heads; dose 1 draws nothing
    _fake(monkeypatch, _doc({"specificity": _spec("random", 0.0)}))        # no sink mass stored: no clause
    assert "share some" not in claims.evaluate(BY_ID["9c"]).row.ours[0]


def test_random_row_says_where_prediction_2_and_the_row_part(monkeypatch):
    _fake(monkeypatch, _doc({"specificity": _spec("random", -10.0, odd=0.0)}))   # three of four below zero
    ours = claims.evaluate(BY_ID["9c"]).row.ours[0]
    assert "3 of 4 contrasts lie below zero: chapter 8's prediction (2)" in ours
    _fake(monkeypatch, _doc({"specificity": _spec("random", -10.0)}))           # all four: they agree
    assert "prediction (2)" not in claims.evaluate(BY_ID["9c"]).row.ours[0]


def _dose(sink_heads, matched_heads):
    return [{"model": "m", "dose": d, "control": c, "metric": mt, "n_heads": n, "base": 40.0, "other": 0.0}
            for d in (0.5, 0.7) for mt in STRICT for c, n in (("sink", sink_heads), ("matched", matched_heads))]


def test_matched_row_says_what_the_control_did(monkeypatch):
    _fake(monkeypatch, _doc({"specificity": _spec("matched", 10.0), "dose_response": _dose(45, 62)}))
    ours = claims.evaluate(BY_ID["9d"]).row.ours[0]
    assert "math strict at 0.5: 40.0 → 0.0 %" in ours and "on more heads (62 against 45 at 0.5" in ours
    _fake(monkeypatch, _doc({"specificity": _spec("matched", 10.0), "dose_response": _dose(20, 20)}))
    assert "on the same number of heads" in claims.evaluate(BY_ID["9d"]).row.ours[0]
    _fake(monkeypatch, _doc({"specificity": _spec("matched", 10.0, tested=False)}))
    assert "not within its mass tolerance" in claims.evaluate(BY_ID["9d"]).row.ours[0]


def _first(knowledge, fmt, unchanged=False, S=-3.0, math=None):
    vals = {"knowledge acc": knowledge, "instructions strict": fmt, "math strict": fmt if math is None else math}
    return [{"model": "m", "first token": t, "metric": k, "change": c, "lo": c - 5, "hi": c + 5, "S": S,
             "base": 50.0, "other": 50.0 + c, "inputs unchanged": unchanged and k == "knowledge acc"}
            for t in ("none", "eos") for k, c in vals.items()]


CASES += [
    ("9e", {"first_token": _first(0.0, -20.0)}, REPRODUCED),          # format falls, knowledge holds
    ("9e", {"first_token": _first(-20.0, 0.0)}, CONTRADICTED),        # knowledge falls, format holds
    ("9e", {"first_token": _first(-21.0, 2.8, math=-14.0)}, CONTRADICTED),  # Gemma-3's pattern
    ("9e", {"first_token": _first(-10.0, -20.0)}, CONTRADICTED),      # format falls further, but knowledge falls
    ("9e", {"first_token": _first(0.0, 0.0, math=-20.0)}, INCONCLUSIVE),    # one strict metric of two falls
    ("9e", {"first_token": _first(0.0, 0.0)}, INCONCLUSIVE),          # nothing moves
    ("9e", {"first_token": _first(0.0, -20.0, unchanged=True)}, INCONCLUSIVE),  # knowledge unmeasured
    ("9e", {"first_token": _first(0.0, -20.0), "first_token_S": {"m": 0.0}}, REPRODUCED),   # the sink weakened
    ("9e", {"first_token": _first(0.0, -20.0, S=0.8), "first_token_S": {"m": 0.8}}, NOT_TESTED),  # prompts unchanged
    ("9e", {"first_token": _first(0.0, -20.0, S=0.9), "first_token_S": {"m": 0.8}}, NOT_TESTED),  # no weaker
]


@pytest.mark.parametrize("cid,results,expected", [c for c in CASES if c[0] == "9e"])
def test_first_token_row_follows_the_falls(monkeypatch, cid, results, expected):
    _fake(monkeypatch, _doc(results))
    row = claims.evaluate(BY_ID[cid]).row
    assert row.verdict == expected, row
    assert ("knowledge not measured" in row.ours[0]) == any(r["inputs unchanged"] for r in results["first_token"])


def test_first_token_row_shows_s_and_the_eos_condition(monkeypatch):
    _fake(monkeypatch, _doc({"first_token": _first(0.0, -20.0, S=0.8), "first_token_S": {"m": 0.8}}))
    ours = claims.evaluate(BY_ID["9e"]).row.ours[0]
    assert "S 0.80 as tokenised, 0.80 without BOS" in ours and "have no BOS to remove, so S cannot show" in ours
    _fake(monkeypatch, _doc({"first_token": _first(0.0, -20.0, S=0.9), "first_token_S": {"m": 0.8}}))
    assert "did not weaken the sink (S 0.80 as tokenised, 0.90 without BOS)" in claims.evaluate(BY_ID["9e"]).row.ours[0]
    _fake(monkeypatch, _doc({"first_token": _first(-21.0, 2.8, math=-14.0)}))
    ours = claims.evaluate(BY_ID["9e"]).row.ours[0]
    assert "as tokenised" not in ours      # a run that stored no S as tokenised
    assert "(with EOS in BOS's place: math strict −14.0 [−19.0, −9.0]; knowledge acc −21.0 [−26.0, −16.0])" in ours
    _fake(monkeypatch, _doc({"first_token": _first(0.0, 0.0)}))
    assert "EOS in BOS's place" not in claims.evaluate(BY_ID["9e"]).row.ours[0]   # nothing fell there
