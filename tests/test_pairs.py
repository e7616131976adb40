"""Adapted pairs are trained once and then loaded from the cache; evaluations are cached too."""
from pathlib import Path

import pytest
import torch

from sinklib.core import cache as sk_cache
from sinklib.adapt import pairs
from sinklib import vl
from sinklib.errors import ParameterError, ResultsMissing
from sinklib.core.models import tiny_model
from tests.test_vl import TOK


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SINKBOOK_CACHE", str(tmp_path))
    return tmp_path


def _params():
    return pairs.pair_params("tiny-llama", seed=1, stage1_steps=2, stage2_steps=2, batch_size=2, weights="random")


def test_build_then_load_from_cache(cache):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    base = vl.clone_state_dict(lm.model)
    p = pairs.build_pair(lm, _params(), progress=False)
    assert p.trained_now == {"vl": True, "text_only": True}
    assert set(p.states) == set(pairs.CONDITIONS)
    for k, v in base.items():  # the model holds the base weights again
        assert torch.equal(lm.model.state_dict()[k], v)
    assert not torch.equal(p.states["vl"]["model.layers.0.self_attn.q_proj.weight"], base["model.layers.0.self_attn.q_proj.weight"])
    # per-tensor norm of the random change equals that of the VL change
    k = "model.layers.1.mlp.up_proj.weight"
    dv = float((p.states["vl"][k] - base[k]).norm())
    dr = float((p.states["random"][k] - base[k]).norm())
    assert dr == pytest.approx(dv, rel=1e-4)
    again = pairs.load_pair(lm, _params())
    assert again.trained_now == {"vl": False, "text_only": False}
    for cond in ("vl", "text_only"):
        for key in p.states[cond]:
            assert torch.equal(p.states[cond][key], again.states[cond][key])
    assert again.logs["vl"]["budget"] == p.logs["vl"]["budget"]


def test_load_pair_names_the_notebook_when_missing(cache):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    with pytest.raises(ResultsMissing, match="04_vl_adaptation"):
        pairs.load_pair(lm, _params())


def test_one_recipe_for_pairs_trainings_and_chapter_4():
    """sinklib.vl.RECIPE is the one definition: pair defaults, training defaults, chapter 4's parameters."""
    import ast
    import inspect

    import nbformat

    p = pairs.pair_params("m")
    assert {k: p[k] for k in vl.RECIPE} == vl.RECIPE
    sig = inspect.signature(vl.train_vl).parameters
    assert {k: sig[k].default for k in vl.RECIPE} == vl.RECIPE
    sig = inspect.signature(vl.train_text_only).parameters
    assert (sig["steps"].default, sig["lr"].default) == (vl.RECIPE["stage2_steps"], vl.RECIPE["lr_lm"])
    nb = nbformat.read(Path(__file__).parent.parent / "notebooks" / "04_vl_adaptation.ipynb", as_version=4)
    cell = next(c for c in nb.cells if "parameters" in c.metadata.get("tags", []))
    values = {t.targets[0].id: ast.literal_eval(t.value) for t in ast.parse(cell.source).body
              if isinstance(t, ast.Assign)}
    # every recipe value of chapter 4 is the recipe's, or "recipe" (each model's, `vl.recipe_for`)
    assert {k: vl.RECIPE[k] if values[k] == vl.FROM_RECIPE else values[k] for k in vl.RECIPE} == vl.RECIPE
    assert all(values[k] == vl.FROM_RECIPE for k in ("lr_lm", "lr_projector_stage2"))


def test_per_model_rates_resolve_in_the_pair_parameters():
    nb = {**{k: vl.RECIPE[k] for k in vl.RECIPE}, "seed": 0, "image_size": 48, "lr_lm": vl.FROM_RECIPE,
          "lr_projector_stage2": vl.FROM_RECIPE}
    g = pairs.pair_params_of("gemma3-270m", nb, weights="w")
    assert (g["lr_lm"], g["lr_projector_stage2"]) == (vl.MODEL_RATES["gemma3-270m"]["lr_lm"],
                                                     vl.MODEL_RATES["gemma3-270m"]["lr_projector_stage2"])
    s = pairs.pair_params_of("smollm2-135m", nb, weights="w")
    assert s == pairs.pair_params("smollm2-135m", weights="w")  # the shared recipe: the same cache keys as before
    assert pairs.pair_params_of("Qwen/Qwen3-0.6B", nb, weights="w")["lr_lm"] == vl.RECIPE["lr_lm"]
    assert pairs.pair_params_of("gemma3-270m", {**nb, "lr_lm": 2e-5}, weights="w")["lr_lm"] == 2e-5  # a number wins
    check = pairs.CHAPTER4_PARAMS["lr_lm"]
    assert check("lr_lm", "recipe") == "recipe" and check("lr_lm", 1e-5) == 1e-5
    with pytest.raises(ParameterError, match="lr_lm"):
        check("lr_lm", "fast")
    assert pairs.CHAPTER4_PARAMS["lr_projector_stage2"]("lr_projector_stage2", None) is None


def test_vqa_items_are_held_out_and_fixed():
    a, b = vl.heldout_items(20, seed=0), vl.heldout_items(20, seed=0)
    assert [(x.question, x.answer) for x in a] == [(x.question, x.answer) for x in b]
    train = vl.batch_items(0, 20, seed=0, tag="lm")
    assert [x.question for x in a] != [x.question for x in train]


def test_bad_pair_parameters():
    with pytest.raises(ParameterError, match="stage2_steps"):
        pairs.pair_params("m", stage2_steps=0)
    with pytest.raises(ParameterError, match="lr_lm"):
        pairs.pair_params("m", lr_lm="fast")
    with pytest.raises(ParameterError, match="schedule"):
        pairs.pair_params("m", schedule="linear")
    # the schedule is part of the checkpoint key: a cosine pair never loads a constant one
    a, b = pairs.pair_params("m"), pairs.pair_params("m", schedule="cosine")
    assert pairs.condition_dir(a, "vl") != pairs.condition_dir(b, "vl")
    # stage 2's projector rate is explicit in the key: None means "keep stage 1's rate"
    assert pairs.pair_params("m", lr_projector=0.02, lr_projector_stage2=None)["lr_projector_stage2"] == 0.02
    assert pairs.pair_params("m", lr_projector=0.02, lr_lm=1e-5, lr_projector_stage2=1e-5)["lr_projector_stage2"] == 1e-5
    with pytest.raises(ParameterError, match="lr_projector_stage2"):
        pairs.pair_params("m", lr_projector_stage2=-1.0)
    with pytest.raises(ParameterError, match="kind"):
        pairs.condition_dir(_params(), "random")


def test_cached_json_computes_once(cache):
    calls = []

    def compute():
        calls.append(1)
        return {"x": 1.5}

    assert sk_cache.cached_json({"a": 1}, compute) == {"x": 1.5}
    assert sk_cache.cached_json({"a": 1}, compute) == {"x": 1.5}
    assert sk_cache.cached_json({"a": 2}, compute) == {"x": 1.5}
    assert len(calls) == 2


# --------------------------------------------------------------------------- display tables (chapters 4, 6)

TWO_MODELS = ("smollm2-135m", "gemma3-270m")


def _budget_rows():
    rows = []
    for m in TWO_MODELS:
        for cond, stages in (("vl", ("stage1", "stage2")), ("text_only", ("stage2",))):
            for st in stages:
                rows.append({"model": m, "condition": cond, "stage": st, "steps": 200, "examples": 6400,
                             "answer_tokens": 14575, "input_positions": 168175, "visual_positions": 57600,
                             "text_positions": 110575, "padded_positions": 172800})
    return rows


def test_budget_table_fits_the_column_with_two_models():
    import pandas as pd

    from sinklib import plots

    t = pairs.budget_table(_budget_rows())
    wide = pd.DataFrame(_budget_rows())
    assert plots.table_width_px(wide) > plots.COLUMN_PX  # the old one-row-per-stage table did not fit
    assert t.width_px() <= plots.COLUMN_PX
    assert list(t.frame.columns) == ["VL stage 1", "VL stage 2", "text-only stage 2"]
    assert t.frame.loc[("gemma3-270m", "input positions"), "VL stage 1"] == "168,175"
    assert "answer tokens" in t._repr_html_() and "matched to VL stage 2" in t._repr_html_()


def _merged_rows():
    import numpy as np

    rows = []
    for m in TWO_MODELS:
        for cond in ["base", "vl"] + [f"merge:{x}" for x in ("task_arithmetic", "uniform", "mix_95_5", "tsv", "star",
                                                             "ties", "dare")]:
            rows.append({"model": m, "condition": cond, "S": 0.123456, "VQA (%)": np.nan if cond == "base" else 63.25,
                         "instructions strict": 12.5, "instructions lenient": 33.333, "math strict": 36.667,
                         "math lenient": 36.667, "knowledge acc": 75.0, "perplexity ppl": 1234.56,
                         "instructions inst_strict": 1.0})
    import pandas as pd

    return pd.DataFrame(rows)


def test_condition_tables_fit_and_keep_every_score():
    from sinklib import plots

    tables = pairs.condition_tables(_merged_rows())
    assert all(t.width_px() <= plots.COLUMN_PX for t in tables)
    shown = [c for t in tables for c in t.frame.columns]
    assert shown == ["S", "VQA", "instr. strict", "math strict", "instr. lenient", "math lenient", "knowl.", "ppl"]
    first = tables[0].frame
    assert first.index.nlevels == 2 and ("gemma3-270m", "task_arithmetic") in first.index
    assert first.loc[("smollm2-135m", "vl"), "S"] == "0.123" and first.loc[("smollm2-135m", "base"), "VQA"] == ""
    assert tables[-1].legend == pairs.SCORE_LEGEND


def test_merge_verdict_and_by_model_tables():
    import pandas as pd

    from sinklib import plots

    v = pd.DataFrame([{"model": m, "method": x, "strict format change vs VL (pt)": -14.2, "worse than VL": True,
                       "recovers to base level": False, "VQA kept (% of VL)": 104.0, "S": 0.7491,
                       "paper's verdict (reported)": "no recovery"} for m in TWO_MODELS
                      for x in ("task_arithmetic", "uniform", "mix_95_5", "tsv", "star", "ties", "dare")])
    t = pairs.merge_verdict_table(v)
    assert t.width_px() <= plots.COLUMN_PX and "paper's verdict" not in t.frame.columns
    assert "no recovery" in t.legend and t.frame.iloc[0]["worse than VL"] == "yes"
    tp = pairs.merge_verdict_table(v.assign(lo=-20.0, hi=-3.25))  # with the paired interval
    assert tp.frame.iloc[0]["strict change vs VL (pt)"] == "-14.2 [-20.0, -3.2]" and "paired bootstrap" in tp.legend
    assert tp.width_px() <= plots.COLUMN_PX
    verdict = pd.DataFrame([{"model": m, "VL: format-sensitive (strict) mean change": -2.14,
                             "format hurt more than knowledge": True, "S fell under VL": False} for m in TWO_MODELS])
    b = pairs.by_model_table(verdict)
    assert list(b.frame.columns) == list(TWO_MODELS) and b.width_px() <= plots.COLUMN_PX
    assert b.frame.loc["VL: format-sensitive (strict) mean change", "gemma3-270m"] == "-2.1"
    assert b.frame.loc["S fell under VL", "smollm2-135m"] == "no"


def test_findings_sentences_come_from_the_tables():
    import pandas as pd

    from sinklib.adapt import pairs

    class _B:
        logs = {"vl": {"callbacks": [{"step": 0, "value": {"vqa": 0.2}}, {"step": 10, "value": {"vqa": 0.6}},
                                     {"step": 20, "value": {"vqa": 0.4}}]}}

    S = pd.DataFrame({"base": [0.5], "vl": [0.7], "text_only": [0.4], "random": [0.5]}, index=["m"])
    d = pd.DataFrame([{"model": "m", "condition": c, "metric": mt, "change": v}
                      for c, v in (("vl", -5.0), ("text_only", -30.0), ("random", 1.0))
                      for mt in ("instructions strict", "math strict", "math lenient", "knowledge acc")])
    v = {"vqa": 55.0, "vqa_lo": 48.0, "vqa_hi": 62.0, "majority": 38.0, "learned": True}
    f = pairs.findings({"m": _B()}, {"m": v}, S, d, stage1_steps=10)
    assert f["S"] == "m 0.500 -> 0.700 (rose)"
    assert f["vqa"].startswith("m: tracking items 20 % at step 0, 60 % at the end of stage 1, 40 % at the end of stage 2")
    assert "(learned)" in f["vqa"] and "VL math strict -5.0" in f["text"] and "text-only math strict -30.0" in f["text"]
    assert "S rose under VL" in f["lines"][0] and "-5.0 / -30.0 / +1.0" in f["lines"][1]


def test_interval_cell_writes_p_and_zero_plainly():
    assert pairs.interval_cell(-0.01, -5.5, 5.4, 1.0) == "0.0 [-5.5, +5.4] p=1.000"
    assert pairs.interval_cell(-19.6, -25.7, -13.6, 1e-5) == "-19.6 [-25.7, -13.6] p<0.001"
    assert pairs.interval_cell(0.04, -0.04, 0.01) == "0.0 [-0.04, +0.01]"  # no p where it is NaN; the bounds' signs kept


def test_paired_table_and_display():
    from sinklib.evals.paired import pack

    def ev(instr, math, know, nll):
        return {"outcomes": pack({"instructions strict": instr, "math strict": math, "knowledge acc": know,
                                  "perplexity": {"nll": nll, "n_tokens": [2, 2]}})}
    base = ev([True] * 20, [True] * 10 + [False] * 10, [True] * 5, [2.0, 2.0])
    vl_ = ev([False] * 8 + [True] * 12, [True] * 10 + [False] * 10, [True] * 5, [3.0, 3.0])
    t = pairs.paired_table({("m", "base"): base, ("m", "vl"): vl_}, conditions=("vl", "text_only"))
    r = t.set_index("metric")
    assert set(t.condition) == {"vl"}  # missing conditions are skipped
    assert r.loc["instructions strict", "change"] == -40 and r.loc["instructions strict", "lost"] == 8
    assert r.loc["instructions strict", "p"] == pytest.approx(2 * 0.5 ** 8)
    assert r.loc["math strict", "change"] == 0 and r.loc["math strict", "p"] == 1
    m = r.loc["strict-format mean"]
    assert m["change"] == pytest.approx(-20) and m["hi"] < 0 and m["test"] == "bootstrap"
    assert r.loc["perplexity ppl", "change"] > 0 and r.loc["perplexity ppl", "p"] != r.loc["perplexity ppl", "p"]
    shown = pairs.paired_display(t, ("vl",))
    cells = shown[0].frame.loc[("m", "instr. strict"), "VL"] if len(shown) == 1 else None
    assert cells is not None and cells.startswith("-40.0 [") and "p=0.008" in cells


def test_build_pair_adds_the_format_preserving_control(cache):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    p = pairs.build_pair(lm, _params(), progress=False, extra=("text_sentence",))
    assert p.trained_now == {"vl": True, "text_only": True, "text_sentence": True}
    assert p.logs["text_sentence"]["params"]["answer_style"] == "sentence"
    assert p.logs["text_sentence"]["budget"]["stage2"]["answer_tokens"] > p.logs["text_only"]["budget"]["stage2"]["answer_tokens"]
    again = pairs.build_pair(lm, _params(), progress=False)  # the one-word pair's cache is untouched by the extra one
    assert again.trained_now == {"vl": False, "text_only": False} and "text_sentence" not in again.states
    assert pairs.condition_dir(_params(), "text_sentence") != pairs.condition_dir(_params(), "text_only")
    with pytest.raises(ParameterError, match="extra"):
        pairs.build_pair(lm, _params(), progress=False, extra=("poetry",))


def test_seed_summary():
    import pandas as pd

    def t(change, lo, hi):
        return pd.DataFrame([{"model": "m", "condition": "vl", "metric": "math strict", "change": change, "lo": lo, "hi": hi}])
    s = pairs.seed_summary({0: t(-10, -15, -5), 1: t(-8, -12, -3), 2: t(-12, -18, -6)}).iloc[0]
    assert s["seeds"] == 3 and s["mean change"] == pytest.approx(-10) and (s["min"], s["max"]) == (-12, -8)
    assert s["seeds below zero"] == 3 and not s["seed spread exceeds effect"]  # range 4 < |mean| 10
    s = pairs.seed_summary({0: t(-10, -15, -5), 1: t(6, 1, 11), 2: t(-2, -6, 2)}).iloc[0]
    assert s["seed spread exceeds effect"] and s["seeds below zero"] == 1 and s["seeds above zero"] == 1
    with pytest.raises(ParameterError, match="at least one seed"):
        pairs.seed_summary({})


def test_metric_grid_orders_columns_and_labels_metrics():
    import pandas as pd

    t = pd.DataFrame({"model": ["m", "m", "m"], "metric": ["math strict", "math strict", "knowledge acc"],
                      "condition": ["b", "a", "a"]})
    wide = pairs.metric_grid(t, ["x", "y", "z"], "condition", order=["a", "b", "absent"])
    assert list(wide.columns) == ["a", "b"] and wide.columns.name is None
    assert wide.loc[("m", "math strict"), "a"] == "y" and wide.loc[("m", "knowl."), "a"] == "z"
    assert list(pairs.metric_grid(t, ["x", "y", "z"], "condition").columns) == ["b", "a"]  # first appearance


def test_per_model_kwargs_sets_each_models_sink_settings():
    lm = tiny_model("llama", seed=0)
    kw = {"eval_n": {"math": 2}, "last_k_layers": 99, "max_tokens": 16, "seed": 3}
    out = pairs.per_model_kwargs(lm, kw)
    assert out == {"eval_n": {"math": 2}, "seed": 3,
                   "sink_kwargs": {"max_tokens": 16, "last_k_layers": lm.model.config.num_hidden_layers}}
    assert "last_k_layers" in kw  # the chapter's keywords are not consumed
    with pytest.raises(ParameterError, match="max_tokens"):
        pairs.per_model_kwargs(lm, {"last_k_layers": 2})


def test_pair_records_are_relative_to_the_cache(cache):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    b = pairs.build_pair(lm, _params(), progress=False)
    rec = pairs.pair_records({"m": b})
    assert rec["pair_params"] == {"m": b.params} and set(rec["train_seconds"]["m"]) == {"vl", "text_only"}
    assert rec["checkpoints"]["m"]["vl"] == pairs.condition_dir(b.params, "vl").relative_to(cache).as_posix()
    assert not rec["checkpoints"]["m"]["vl"].startswith("/")


def test_panel_rows_take_each_models_base_S_and_vl_changes():
    import pandas as pd

    S = pd.DataFrame({"base": [0.5]}, index=["m"])
    deltas = pd.DataFrame([{"model": "m", "condition": c, "metric": mt, "change": v}
                           for c, v in (("vl", -2.0), ("text_only", -9.0))
                           for mt in ("instructions strict", "math strict", "knowledge acc")])
    lm = type("LM", (), {"qk_norm": "none"})()
    rows = pairs.panel_rows({"m": lm}, S, deltas)
    assert rows == [pairs.panel_row("m", 0.5, "none", deltas[deltas.condition == "vl"].set_index("metric").change)]


def test_a_cached_pair_reads_its_weights_only_when_used(cache, monkeypatch):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    base = vl.clone_state_dict(lm.model)
    first = pairs.build_pair(lm, _params(), progress=False)
    assert first.states.ready("vl") and not first.states.ready("random")  # trained now: held; random drawn on use
    _ = first.states["random"]
    reads, draws = [], []
    real_read, real_draw = sk_cache.load_state, vl.random_direction_like
    monkeypatch.setattr(sk_cache, "load_state", lambda path, model: reads.append(path) or real_read(path, model))
    monkeypatch.setattr(vl, "random_direction_like", lambda *a, **k: draws.append(1) or real_draw(*a, **k))
    again = pairs.build_pair(lm, _params(), progress=False)
    assert reads == [] and draws == [] and again.projector is not None and again.encoder is not None
    assert not again.states.ready("vl") and again.states.ready("base") and "not read yet" in repr(again.states)
    for cond in ("vl", "text_only", "random"):  # read (or drawn) on first use: equal to the trained pair's
        assert set(again.states[cond]) == set(first.states[cond])
        assert all(torch.equal(again.states[cond][k], v) for k, v in first.states[cond].items())
    assert len(reads) == 2 and draws == [1]
    _ = again.states["vl"]
    assert len(reads) == 2  # read once
    for k, v in base.items():  # reading never changes the model
        assert torch.equal(lm.model.state_dict()[k], v)
    emb, head = "model.embed_tokens.weight", "lm_head.weight"
    if lm.model.config.tie_word_embeddings:  # tied keys share one tensor, as in clone_state_dict
        assert again.states["vl"][emb] is again.states["vl"][head]
    again.states["extra"] = base
    del again.states["extra"]
    assert list(again.states) == ["base", "vl", "text_only", "random"]


def test_load_state_checks_the_architecture(cache):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    pairs.build_pair(lm, _params(), progress=False)
    other = tiny_model("qwen3", seed=0)
    with pytest.raises(ParameterError, match="base model it was trained from"):
        sk_cache.load_state(pairs.condition_dir(_params(), "vl"), other.model)
    with pytest.raises(Exception, match="no complete checkpoint"):
        sk_cache.load_state(cache / "nothing", lm.model)
    stamp = sk_cache.checkpoint_stamp(pairs.condition_dir(_params(), "vl"))
    assert len(stamp) == 16 and stamp != sk_cache.checkpoint_stamp(pairs.condition_dir(_params(), "text_only"))


def test_relative_change_is_cached_under_the_checkpoints(cache, monkeypatch):
    lm = tiny_model("llama", seed=0)
    lm.tokenizer = TOK
    p = pairs.build_pair(lm, _params(), progress=False)
    table = pairs.weight_change({"tiny": p})
    assert set(table.condition) == {"vl", "text_only", "random"}
    exact = vl.relative_change_by_group(p.states["base"], p.states["text_only"])
    got = table[table.condition == "text_only"].drop(columns=["model", "condition"]).to_dict("records")
    assert [r["group"] for r in got] == [r["group"] for r in exact]
    assert [r["relative change"] for r in got] == pytest.approx([r["relative change"] for r in exact])
    whole = pairs.relative_change(p, "vl", whole=True)
    assert len(whole) == 1 and whole[0]["group"] == "whole model"
    monkeypatch.setattr(vl, "relative_change_by_group", lambda *a, **k: pytest.fail("recomputed"))
    again = pairs.build_pair(lm, _params(), progress=False)
    assert pairs.weight_change({"tiny": again}).equals(table)  # from the cache: no weights read
    assert not again.states.ready("vl") and not again.states.ready("random")
    with pytest.raises(ParameterError, match="condition"):
        pairs.relative_change(again, "base")
