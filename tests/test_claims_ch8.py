"""Claim rows 9c-9e (chapter 8's H2 and H3): each decided by the one rule (`decide` with counts) from chapter 8's
stored contrasts, so the verdict follows the data; a control outside its tolerance is not tested, not a verdict."""
import pytest

from sinklib import claims
from sinklib.book import runner as book
from sinklib.errors import ResultsMissing
from sinklib.stats.verdicts import CONTRADICTED, INCONCLUSIVE, NOT_TESTED, REPRODUCED

BY_ID = {c.id: c for c in claims.CLAIMS}
C8 = "08_causal_tests"


def _fake(monkeypatch, doc):
    def load(notebook, key=None):
        if notebook != C8:
            raise ResultsMissing(notebook)
        return doc
    monkeypatch.setattr(book, "load_results", load)


def _doc(results):
    return {"results": results, "parameters": {"profile": "quick"},
            "provenance": {"profile": "quick", "models": [{"name": "m"}]}}


def _spec(against, v, tested=True, doses=(0.5, 0.7), pooled=False):
    name = f"{against}, pooled" if pooled else against
    return [{"model": "m", "dose": d, "against": name, "metric": mt, "sink minus control": v, "lo": v - 4,
             "hi": v + 4, "tested": tested, **({"draws": 3} if pooled else {})}
            for d in doses for mt in ("instructions strict", "math strict", "knowledge acc")]


#: (claim id, chapter 8's results, verdict): `tests.test_claims` counts these in its three-cases check
CASES = [
    ("9c", {"specificity": _spec("random", -10.0)}, REPRODUCED),            # every strict contrast below zero
    ("9c", {"specificity": _spec("random", 0.0)}, INCONCLUSIVE),            # inside the noise
    ("9c", {"specificity": _spec("random", 10.0)}, CONTRADICTED),           # the random heads cost more
    ("9c", {"specificity": _spec("random", -10.0, doses=(0.3,))}, NOT_TESTED),  # only unpredicted doses
    ("9c", {"specificity": _spec("random", 0.0) + _spec("random", -10.0, pooled=True)}, REPRODUCED),  # pooled decides
    ("9d", {"specificity": _spec("matched", -10.0)}, REPRODUCED),
    ("9d", {"specificity": _spec("matched", 0.0)}, INCONCLUSIVE),
    ("9d", {"specificity": _spec("matched", 10.0)}, CONTRADICTED),
    ("9d", {"specificity": _spec("matched", -10.0, tested=False)}, NOT_TESTED),  # outside tolerance: no verdict
]


@pytest.mark.parametrize("cid,results,expected", CASES[:9])
def test_specificity_rows_follow_the_contrasts(monkeypatch, cid, results, expected):
    _fake(monkeypatch, _doc(results))
    e = claims.evaluate(BY_ID[cid])
    assert e.row.verdict == expected, e.row
    assert e.row.tests == (0 if expected == NOT_TESTED else 1)


def test_specificity_row_names_its_pooling_and_the_contrasts(monkeypatch):
    _fake(monkeypatch, _doc({"specificity": _spec("random", 0.0) + _spec("random", -10.0, pooled=True)}))
    ours = claims.evaluate(BY_ID["9c"]).row.ours[0]
    assert "math strict at dose 0.7: −10.0 [−14.0, −6.0]" in ours and "pooled over 3 draws" in ours
    assert "the pre-registered first draw of random heads alone: inconclusive" in claims.evaluate(BY_ID["9c"]).row.ours[0]
    _fake(monkeypatch, _doc({"specificity": _spec("matched", 10.0)}))
    assert "intervenes on more heads" in claims.evaluate(BY_ID["9d"]).row.ours[0]
    _fake(monkeypatch, _doc({"specificity": _spec("matched", 10.0, tested=False)}))
    assert "not within its mass tolerance" in claims.evaluate(BY_ID["9d"]).row.ours[0]


def _first(knowledge, fmt, unchanged=False, S=-3.0):
    return [{"model": "m", "first token": t, "metric": k, "change": c, "lo": c - 5, "hi": c + 5, "S": S,
             "inputs unchanged": unchanged and k == "knowledge acc"}
            for t in ("none", "eos") for k, c in (("knowledge acc", knowledge), ("instructions strict", fmt),
                                                  ("math strict", fmt))]


CASES += [
    ("9e", {"first_token": _first(0.0, -20.0)}, REPRODUCED),          # format falls, knowledge holds
    ("9e", {"first_token": _first(-20.0, 0.0)}, CONTRADICTED),        # knowledge falls, format holds (Gemma-3's run)
    ("9e", {"first_token": _first(-20.0, -10.0)}, CONTRADICTED),      # knowledge falls further than format
    ("9e", {"first_token": _first(0.0, 0.0)}, INCONCLUSIVE),          # nothing moves
    ("9e", {"first_token": _first(0.0, -20.0, unchanged=True)}, INCONCLUSIVE),  # knowledge unmeasured
    ("9e", {"first_token": _first(0.0, -20.0), "first_token_S": {"m": 0.0}}, REPRODUCED),   # the sink weakened
    ("9e", {"first_token": _first(0.0, -20.0, S=0.8), "first_token_S": {"m": 0.8}}, NOT_TESTED),  # it did not
]


@pytest.mark.parametrize("cid,results,expected", CASES[9:])
def test_first_token_row_follows_the_falls(monkeypatch, cid, results, expected):
    _fake(monkeypatch, _doc(results))
    row = claims.evaluate(BY_ID[cid]).row
    assert row.verdict == expected, row
    assert ("knowledge not measured" in row.ours[0]) == any(r["inputs unchanged"] for r in results["first_token"])
    assert ("S 0.80 as tokenised, 0.80 without BOS" in row.ours[0]) == (expected == NOT_TESTED)
