"""Chapter 4's VL adaptation of a tiny LM (sinklib.tiny.adapt): trained, evaluated, cached, changes with
intervals, a panel row that the panel schema accepts."""
import math

import numpy as np
import pandas as pd
import pytest
import torch

from sinklib.errors import ParameterError

TRAIN = dict(size=dict(d_model=32, n_layers=2, n_heads=2, ffn=64, context=64), tokenizer={"vocab_size": 300, "n_docs": 800},
             steps=20, batch_size=8, seq_len=48, lr=5e-3, n_docs=600, checkpoints=[0, 20],
             sink={"n_prompts": 4, "max_tokens": 48})
RECIPE = dict(stage1_steps=3, stage2_steps=3, batch_size=4)
EVAL = dict(n_format=10, n_knowledge=8, n_prose=4, max_new_tokens=4, vqa_n=12)


@pytest.fixture
def tmp_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


def test_adapt_end_to_end_cached_and_panel_row(tmp_cache):
    from sinklib.stats import schema as panel_schema
    from sinklib.core.cache import tensor_sha
    from sinklib.tiny.adapt import PANEL_METRICS, TINY_STRICT_TASK, adapt, change_table
    from sinklib.tiny.train import train_tiny

    torch.set_num_threads(1)
    run = train_tiny("layerwise", **TRAIN)
    sha = tensor_sha(run.model)
    r = adapt(run, recipe=RECIPE, eval_kwargs=EVAL, conditions=("base", "vl", "text_only", "random"))
    assert tensor_sha(run.model) == sha  # the base weights are back
    assert r["trained_now"] == {"vl": True, "text_only": True}
    assert r["pair_params"]["stage1_steps"] == 3 and r["pair_params"]["model"] == r["name"]
    assert r["pair_params"]["weights"] == sha
    assert r["S"]["base"] == pytest.approx(run.S_final, abs=1e-9)  # the base's S is the trained model's S
    assert r["S"]["vl"] != r["S"]["base"]  # the VL stage changed the LM
    for cond in ("vl", "text_only", "random"):
        for _, _, m in PANEL_METRICS:
            c = r["changes"][cond][m]
            assert c["lo"] <= c["change"] <= c["hi"], (cond, m, c)
            assert c["paired_lo"] <= c["paired_hi"]
    base, vl_ = r["evals"]["base"], r["evals"]["vl"]
    d = vl_["scores"]["format"]["strict"] - base["scores"]["format"]["strict"]
    assert r["changes"]["vl"]["format strict"]["change"] == pytest.approx(d)
    assert base["vqa"] is None and vl_["vqa"][1] == 12 and r["evals"]["text_only"]["vqa"] is None
    assert 0 <= r["vqa"]["majority"] <= 100 and r["vqa"]["vqa_lo"] <= r["vqa"]["vqa"] <= r["vqa"]["vqa_hi"]
    row = r["panel_row"]
    assert row["qk_norm"] == "layerwise" and row["S"] == r["S"]["base"]
    assert row[TINY_STRICT_TASK] == pytest.approx(d)
    df = panel_schema.validate_panel(pd.DataFrame([row]))
    assert TINY_STRICT_TASK in panel_schema.task_columns(df)
    assert not any(c.startswith("delta_") and "text_only" in c for c in df.columns)
    assert len(change_table(r)) == 3 * len(PANEL_METRICS)
    # cached: a second call trains and evaluates nothing and returns the same numbers
    again = adapt(run, recipe=RECIPE, eval_kwargs=EVAL, conditions=("base", "vl", "text_only", "random"))
    assert again["trained_now"] == {"vl": False, "text_only": False}
    assert again["changes"] == r["changes"] and again["S"] == r["S"]


def test_paired_ci_and_errors():
    from sinklib.tiny.adapt import adapt_params, paired_ci, tiny_loaded
    from sinklib.tiny.model import build

    a = [1, 1, 0, 0, 1, 0, 1, 0] * 5
    lo, hi = paired_ci(a, a)
    assert lo == hi == 0.0  # identical outcomes: no uncertainty about a zero change
    b = [1] * len(a)
    lo, hi = paired_ci(a, b)
    assert 0 < lo <= 50 <= hi  # every miss fixed: +50 points, interval above zero
    with pytest.raises(ParameterError, match="paired_ci"):
        paired_ci([1, 0], [1])

    class FakeRun:  # only what tiny_loaded reads
        model = build("none", dict(d_model=16, n_layers=1, n_heads=2, ffn=16, context=16, vocab_size=300))
        tokenizer = None
        key = "0123456789abcdef"
        params = {"variant": "none"}

    lm = tiny_loaded(FakeRun())
    assert lm.qk_norm == "none" and lm.name == "tiny-none-01234567"
    with pytest.raises(ParameterError, match="stage3_steps"):
        adapt_params(lm, stage3_steps=1)
    with pytest.raises(ParameterError, match="lr_lm"):
        adapt_params(lm, lr_lm=-1.0)
    assert adapt_params(lm)["lr_lm"] == 1e-3 and not math.isnan(adapt_params(lm)["lr_projector"])
    assert np.isfinite(adapt_params(lm, stage2_steps=5)["stage2_steps"])
    from sinklib.tiny.adapt import _eval_params

    with pytest.raises(ParameterError, match="vqa_max_new_tokens"):
        _eval_params({"vqa_max_new_tokens": 0})
    with pytest.raises(ParameterError, match="n_questions"):
        _eval_params({"n_questions": 3})
