"""Chapter 7's panel driver (sinklib.tiny.panel): the plan, the quick profile end to end (cached), the
statistics reused from sinklib.stats.panel on a tiny panel."""
import numpy as np
import pandas as pd
import pytest
import torch

from sinklib.errors import ParameterError


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


def test_full_plan_has_at_least_four_settings_per_variant():
    from sinklib.tiny.panel import panel_plan

    plan = panel_plan("full")
    assert len(plan) >= 12
    for v in ("none", "per_head", "layerwise"):
        mine = [p for p in plan if p["variant"] == v]
        assert len(mine) >= 4
        assert len({json_key(p["train"]) for p in mine}) == len(mine)  # the settings differ
    assert [p["variant"] for p in panel_plan("quick")] == ["none", "per_head"]
    with pytest.raises(ParameterError, match="profile"):
        panel_plan("huge")
    with pytest.raises(ParameterError, match="variant"):
        panel_plan("full", variants=["sigmoid"])
    with pytest.raises(ParameterError, match="settings"):
        panel_plan("full", settings={})


def json_key(d):
    import json

    return json.dumps(d, sort_keys=True, default=str)


def test_quick_panel_end_to_end_and_statistics(tmp_cache):
    from sinklib.tiny.panel import TASKS, panel_statistics, run_panel

    torch.set_num_threads(1)
    res = run_panel("quick", log=None)
    df = res["rows"]
    assert len(df) == 2 and list(df.qk_norm) == ["none", "per_head"]
    assert set(TASKS) <= set(df.columns) and df["S"].notna().all()
    assert (df["S"] != df["S_init"]).all()
    st = panel_statistics(df)
    assert set(st) >= {"rho", "lopo", "architecture", "availability"}
    assert st["rho"]["rho"].isna().all() and "needs" in st["availability"]["spearman"].iloc[0]  # n = 2: said, not raised
    again = run_panel("quick", log=None)
    pd.testing.assert_frame_equal(again["rows"].drop(columns=["train_seconds"]), df.drop(columns=["train_seconds"]))


def test_statistics_on_a_synthetic_tiny_panel():
    """Six rows in the tiny panel's schema: S explains the strict change within each variant."""
    from sinklib.stats.schema import validate_panel
    from sinklib.tiny.panel import panel_statistics

    S = [-2.0, -1.0, -1.5, 0.0, -0.5, 0.5]
    rows = [{"pair": f"m{i}", "vlm": "", "llm": f"m{i}", "S": s, "qk_norm": q, "source": "synthetic",
             "delta_format_strict": -3.0 * s + (1.0 if q == "none" else 0.0) + 0.1 * i,
             "delta_knowledge_acc": float(np.sin(i))}
            for i, (s, q) in enumerate(zip(S, ["none", "none", "per_head", "per_head", "layerwise", "layerwise"]))]
    st = panel_statistics(validate_panel(pd.DataFrame(rows)))
    rho = st["rho"].set_index("task")
    assert rho.loc["delta_format_strict", "rho"] < -0.9
    lo = st["lopo"].set_index("task").loc["delta_format_strict"]
    assert lo.mae_model < lo.mae_constant
    ar = st["architecture"].set_index("task").loc["delta_format_strict"]
    assert ar.r2_arch_plus_S > ar.r2_arch and np.isfinite(ar.F_p)


def _synthetic_rows(strict, S, q):
    return pd.DataFrame([{"pair": f"m{i}", "vlm": "", "llm": f"m{i}", "S": s, "qk_norm": v, "source": "synthetic",
                          "delta_format_strict": d, "delta_format_lenient": float(np.sin(3 * i)),
                          "delta_knowledge_acc": float(np.cos(5 * i)), "sink_formed": i % 2 == 0, "in_band": True,
                          "knowledge_above_chance": i < 3, "strict_paired_lo": d - 5, "strict_paired_hi": d + 5,
                          "lenient_paired_lo": -1.0, "lenient_paired_hi": 1.0, "knowledge_paired_lo": -2.0,
                          "knowledge_paired_hi": 2.0, "S_vl": s - 0.1, "setting": "pilot", "vqa": 30.0,
                          "vqa_majority": 38.0, "text_only_format_strict": d / 2, "text_only_strict_paired_lo": d / 2 - 4,
                          "text_only_strict_paired_hi": d / 2 + 4, "vqa_learned": False}
                         for i, (d, s, v) in enumerate(zip(strict, S, q))])


def test_hypotheses_and_preconditions_follow_the_intervals():
    """H1 reproduced when strict change rises with S, not reproduced when it falls; H4 from the per-variant means;
    preconditions counted."""
    from sinklib.stats.schema import validate_panel
    from sinklib.tiny.panel import hypotheses, panel_statistics, preconditions
    from sinklib.stats.verdicts import INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED

    q = ["none", "per_head", "layerwise"] * 4
    S = [0.1 * i for i in range(12)]
    up = validate_panel(_synthetic_rows([-20 + 1.5 * i + (3 if v == "per_head" else 0) for i, v in enumerate(q)], S, q))
    h = hypotheses(up, panel_statistics(up, n_boot=499, n_perm=999)).set_index("hypothesis")["verdict"]
    assert h["H1 S predicts the strict-format change"] == REPRODUCED
    assert h["H4 per-head QK-norm models lose less"] in (REPRODUCED, INCONCLUSIVE)
    assert h["H5 S predicts held-out models better than a constant"] == REPRODUCED
    down = validate_panel(_synthetic_rows([-1.5 * i + (3 if v == "per_head" else 0) for i, v in enumerate(q)], S, q))
    h = hypotheses(down, panel_statistics(down, n_boot=499, n_perm=999)).set_index("hypothesis")
    assert h.loc["H1 S predicts the strict-format change", "verdict"] == NOT_REPRODUCED
    h3 = h[h.index.str.startswith("H3")]
    assert len(h3) == 2 and REPRODUCED not in set(h3.verdict)  # "no relation" is never reproduced by an interval
    # the synthetic text-only change is half the VL change: VL loses more, as the paper says (H6)
    assert h.loc["H6 the loss is VL-specific: text-only training to the same end loses less", "verdict"] == REPRODUCED
    assert "0.971" in h.loc["H1 S predicts the strict-format change", "paper"]  # from the reported-numbers page
    pre = preconditions(down).set_index("precondition")
    assert pre.loc["a sink formed in training", "models"] == "6 of 12"
    assert pre.loc["the VL model learned the visual task", "models"] == "0 of 12"
    assert pre.loc["knowledge above chance", "models"] == "3 of 12"
    tiny = validate_panel(_synthetic_rows([-1.0, -2.0], [0.1, 0.2], ["none", "per_head"]))
    h = hypotheses(tiny, panel_statistics(tiny)).set_index("hypothesis")["verdict"]
    assert (h == INCONCLUSIVE).all()  # n = 2: nothing computed, nothing claimed


def test_prepare_fills_the_cache_in_worker_processes(tmp_cache):
    """Two one-thread workers make the quick panel's models; run_panel then only reads the cache."""
    from sinklib.tiny.panel import panel_plan, prepare, run_panel

    done = prepare(panel_plan("quick"), "quick", jobs=2, log=None)
    assert sorted(d["variant"] for d in done) == ["none", "per_head"]
    res = run_panel("quick", log=None)
    assert len(res["rows"]) == 2 and res["seconds"] < min(d["seconds"] for d in done) + 30
    with pytest.raises(ParameterError, match="jobs"):
        prepare(panel_plan("quick"), "quick", jobs=0)


def test_change_table_and_knowledge_chance():
    from sinklib.stats.schema import validate_panel
    from sinklib.tiny.panel import change_table, knowledge_above_chance

    rows = validate_panel(_synthetic_rows([-20.0, -10.0], [0.1, 0.2], ["none", "per_head"]))
    t = change_table(rows)
    assert list(t["strict: VL"]) == ["-20 [-25, -15]", "-10 [-15, -5]"]
    assert list(t["strict: text-only"]) == ["-10 [-14, -6]", "-5 [-9, -1]"]
    assert t["VQA / majority"].iloc[0] == "30 / 38"
    from sinklib.stats.verdicts import wilson_pct

    # the rule reads the Wilson lower end the evaluation stores: 45 % of 72 items is above chance, 30.6 % is not
    assert knowledge_above_chance(wilson_pct(45.0, 72).lo) and not knowledge_above_chance(wilson_pct(30.6, 72).lo)


def test_sink03_counts_heads_above_threshold_and_the_sentence_says_both():
    import pandas as pd

    from sinklib.tiny.pilot import sink03, sink03_sentence

    assert sink03({"mass": [[0.1, 0.31], [0.29, 0.9]]}) == 0.5
    assert sink03({"mass": [[0.3, 0.3]]}) == 0.0          # strictly above 0.3, as Gu et al.
    rows = pd.DataFrame({"sink03": [0.0, 0.125, 0.0], "max_mass": [0.2, 0.35, 0.1]})
    s = sink03_sentence(rows)
    assert "at most 0.12" in s and "1 of 3 models have any head above 0.3" in s and "0.35" in s
    assert "not computed" in sink03_sentence(pd.DataFrame({"max_mass": [0.1]}))
