"""Chapter 7's sentences (`sinklib.tiny.panelwords`): each follows its table, so a rerun cannot leave prose that
contradicts the numbers."""
import pandas as pd

from sinklib.tiny import panelwords


def _remark(lw_rho=0.8, lw_p=0.001):
    return pd.DataFrame([
        {"variant": "none", "rho_share_query_norm": 0.6, "p_share_query_norm": 0.001, "rho_share_logit_range": 0.4,
         "p_share_logit_range": 0.01, "raw_share_spread": 2.0, "query_norm_spread": 8.4},
        {"variant": "per_head", "rho_share_query_norm": 0.06, "p_share_query_norm": 0.7,
         "rho_share_logit_range": float("nan"), "p_share_logit_range": float("nan"), "raw_share_spread": 1.7,
         "query_norm_spread": 1.15},
        {"variant": "layerwise", "rho_share_query_norm": lw_rho, "p_share_query_norm": lw_p,
         "rho_share_logit_range": 0.7, "p_share_logit_range": 0.001, "raw_share_spread": 3.1,
         "query_norm_spread": 3.7}])


def test_remark_sentence_does_not_call_an_unnormalised_query_normalised():
    s = panelwords.remark_sentence(_remark())
    assert "none: raw shares vary 2.00-fold, query norms 8.40-fold" in s
    assert "layerwise: raw shares vary 3.10-fold, normalised query norms 3.70-fold" in s
    assert "per_head" in s and "rho(share, logit range)" in s.split("per_head")[0]


def test_remark_reading_follows_the_layerwise_test():
    assert "compressed, as Remark 1 predicts (rho(share, query norm) +0.80" in panelwords.remark_reading(_remark())
    weak = panelwords.remark_reading(_remark(lw_rho=0.2, lw_p=0.3))
    assert "not compressed outside the noise" in weak and "within 1.15-fold against 3.70-fold" in weak
    assert "vary 8.40-fold" in weak


def test_lenient_sentence_counts_equal_base_scores_and_the_largest_gap():
    rows = pd.DataFrame({"base_strict": [61.0, 50.0, 40.0], "base_lenient": [61.0, 50.0, 45.0],
                         "delta_format_strict": [-28.0, -22.0, -5.0], "delta_format_lenient": [-28.0, -16.0, -5.0]})
    assert panelwords.lenient_sentence(rows) == ("the base model's strict and lenient scores are equal in 2 of 3 "
                                                 "models, and their VL changes differ by at most 6 points")
    assert "not computed" in panelwords.lenient_sentence(rows.drop(columns="base_lenient"))


def test_findings_count_the_models_where_text_only_lost_more():
    pilot = pd.DataFrame([{"variant": "none", "S trained": -2.5, "S at init": -2.4, "sink formed": False,
                           "scores in band": True, "steps": 10, "max head mass": 0.5}])
    pre = pd.DataFrame({"precondition": ["a sink formed in training", "base scores inside the band",
                                         "VL lost strict-format score", "the VL model learned the visual task",
                                         "knowledge above chance"], "models": ["0 of 3"] * 5})
    rows = pd.DataFrame({"delta_format_strict": [-10.0, -20.0, -5.0], "text_only_format_strict": [-30.0, -10.0, -9.0],
                         "qk_norm": ["none"] * 3, "S": [0.1, 0.2, 0.3], "max_mass": [0.2, 0.3, 0.5]})
    hyp = pd.DataFrame([{"hypothesis": "H1 x", "this panel": "rho", "verdict": "inconclusive"},
                        {"hypothesis": "H6 y", "this panel": "VL minus text-only +6.0", "verdict": "contradicted"}])
    f = panelwords.findings(pilot, rows, pre, hyp)
    assert f["h6"].endswith("the text-only control lost more than VL in 2 of 3 models")
    assert "not computed" in f["lenient"] and f["sinks"] == "a sink formed in 0 of 3 models"
