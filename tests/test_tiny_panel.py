"""Chapter 7's panel driver (sinklib.tiny.panel): the plan, the quick profile end to end (cached), the
statistics reused from sinklib.panel on a tiny panel."""
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
    from sinklib.panel_schema import validate_panel
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
