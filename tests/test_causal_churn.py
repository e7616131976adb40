"""Chapter 8's power at the churn its ablations cause (sinklib.causal.churn)."""
import pandas as pd

from sinklib.causal import churn
from sinklib.evals.power import min_detectable_drop


def _t(rows):
    return pd.DataFrame([{"model": "m", "metric": mt, "dose": d, "base": 40.0, "gained": g, "lost": 20}
                         for mt, d, g in rows])


def test_churn_is_the_median_gained_share_below_dose_one():
    r = churn.observed(_t([("math strict", 0.3, 10), ("math strict", 0.5, 14), ("math strict", 1.0, 3),
                           ("perplexity ppl", 0.5, 0)]), {"math": 100})
    assert list(r.metric) == ["math strict"]            # dose 1 and non pass/fail metrics left out
    row = r.iloc[0]
    assert row["churn each way (%)"] == 12.0 and row["conditions"] == 2
    assert row["smallest fall at that churn (pt)"] == min_detectable_drop(100, 0.4, flip=0.12)
    assert row["smallest fall at that churn (pt)"] > min_detectable_drop(100, 0.4, flip=0.05)  # more churn, less power
    assert "m math strict: 12.0 % of items flip each way (median of 2 conditions)" in churn.sentence(r)


def test_no_condition_below_dose_one_says_so():
    r = churn.observed(_t([("math strict", 1.0, 3)]), {"math": 100})
    assert r.empty and churn.sentence(r).startswith("no condition below dose 1")


def test_display_says_none_where_no_fall_is_detectable():
    r = churn.observed(_t([("math strict", 0.5, 0)]).assign(base=0.0), {"math": 2})
    assert churn.display(r).loc[("m", "math strict"), "smallest fall at that churn (pt)"] == "none"


def test_churn_from_a_stored_document_needs_rows_and_suite_sizes():
    from sinklib.causal import churn

    rows = [{"model": "m", "metric": "math strict", "dose": 0.5, "control": "sink", "base": 40.0, "gained": 5,
             "lo": -1.0, "hi": 1.0}]
    doc = {"results": {"dose_response": rows},
           "parameters": {"eval_instructions": 72, "eval_math": 100, "eval_knowledge": 100}}
    got = churn.from_document(doc)
    assert list(got.metric) == ["math strict"] and got["churn each way (%)"].iloc[0] == 5.0
    assert churn.from_document({"results": {"dose_response": rows}, "parameters": {}}) is None
    assert churn.from_document({"results": {}, "parameters": doc["parameters"]}) is None
