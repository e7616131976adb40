"""The VL recipe sweep: stage 1 once, stage 2 at several learning rates from the same projector (sinklib.adapt.sweep)."""
import pandas as pd
import pytest
import torch

from sinklib.core import cache as sk_cache
from sinklib.adapt import pairs, sweep
from sinklib import vl
from sinklib.core.numbers import signed
from sinklib.errors import ParameterError
from tests.test_dose import _lm, _params  # the same tiny pair
from tests.test_isolate import _ev
from tests.test_pairs import cache  # noqa: F401 (the fixture: an empty cache folder)


def test_point_params_and_names():
    p = sweep.point_params(_params(), 1e-5)
    assert p["lr_lm"] == 1e-5 and p["lr_projector_stage2"] == 1e-5 and p["lr_projector"] == _params()["lr_projector"]
    assert sweep.point_params(_params(), 1e-5, 3e-5)["lr_projector_stage2"] == 3e-5
    assert sweep.point_name(5e-5) == "lr_lm 5e-05"
    with pytest.raises(ParameterError, match="lr_lm"):
        sweep.point_params(_params(), 2.0)
    # stage 1 does not depend on the stage-2 rates; the points do
    assert sweep.stage1_dir(p) == sweep.stage1_dir(_params())
    assert sweep.point_dir(p) != sweep.point_dir(_params())
    assert sweep.point_dir(_params()) != pairs.condition_dir(_params(), "vl")  # never a chapter 4 checkpoint


def test_point_at_the_recipe_rates_is_the_pairs_vl_model(cache):
    lm = _lm()
    base = vl.clone_state_dict(lm.model)
    pair = pairs.build_pair(lm, _params(), progress=False)
    d1 = sweep.train_stage1(lm, _params())
    d = sweep.train_point(lm, _params())
    assert sk_cache.checkpoint_exists(d1) and sk_cache.checkpoint_exists(d)
    for k, v in base.items():  # the model holds the base weights again
        assert torch.equal(lm.model.state_dict()[k], v)
    assert sweep.point_matches(lm, _params(), pair.states["vl"]) == 0.0
    slow = sweep.point_params(_params(), _params()["lr_lm"] / 10)
    sweep.train_point(lm, slow)
    assert sweep.point_matches(lm, slow, pair.states["vl"]) > 0.0
    vl_dir = pairs.condition_dir(_params(), "vl")  # with the checkpoint's folder the gap is cached
    assert sweep.point_matches(lm, _params(), lambda: pair.states["vl"], vl_dir) == 0.0
    gap = sweep.point_matches(lm, slow, pair.states["vl"], vl_dir)
    assert sweep.point_matches(lm, slow, lambda: pytest.fail("read again"), vl_dir) == gap > 0.0
    mtime = (d1 / "meta.json").stat().st_mtime_ns
    sweep.train_point(lm, sweep.point_params(_params(), 1e-3))  # stage 1 is reused
    assert (d1 / "meta.json").stat().st_mtime_ns == mtime


def test_run_table_and_sentence(cache, monkeypatch):
    lm = _lm()
    calls = []

    def fake(lm_, pair, condition, **kw):  # the tiny character tokenizer cannot run the suites
        calls.append((condition, pair.params["lr_lm"], kw.get("vqa_n", 0), kw["key_extra"], kw["eval_n"]))
        k = "model.layers.0.self_attn.q_proj.weight"
        assert condition == "base" or not torch.equal(pair.states["vl"][k], pair.states["base"][k])
        return {**_ev(len(calls), 0.5, 0.5, 0.6 - 0.1 * len(calls)), "S": 0.1 * len(calls),
                "vqa": [0.5, 4] if condition == "vl" else None}
    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    res = sweep.run(lm, _params(), [1e-3, 1e-5], eval_n={"instructions": 3, "knowledge": 4, "perplexity": 2}, seed=0,
                    prompts=["The cat sat on the mat."], sink_kwargs={"max_tokens": 16, "last_k_layers": 1}, vqa_n=4)
    assert list(res) == ["base", "lr_lm 0.001", "lr_lm 1e-05"]
    assert [c[:3] for c in calls] == [("base", _params()["lr_lm"], 0), ("vl", 1e-3, 4), ("vl", 1e-5, 4)]
    assert all(c[3] == sweep.KEY_EXTRA and c[4] == {"knowledge": 4, "perplexity": 2} for c in calls)
    t = sweep.table({"m": res}, seed=0, image_size=48, recipe={"m": 1e-5})
    assert list(t.lr_lm) == [1e-5, 1e-3] and list(t.recipe) == [True, False]
    assert {"VQA vqa", "VQA majority", "learned", "knowledge change", "knowledge lo", "perplexity change", "S"} <= set(t)
    forced = t.assign(learned=[True, False])
    assert sweep.sentence(forced).startswith(
        "m: learned the task at 1 of the 2 rates swept (1e-05; not at 0.001); the least knowledge lost at 1e-05")
    assert "recipe's rate" not in sweep.sentence(forced)  # the best point is the recipe's
    assert "the smallest rate swept (the edge of the grid), so a smaller rate, not tried, might lose less" in \
        sweep.sentence(forced)
    other = t.assign(learned=[True, True], recipe=[False, True])
    other.loc[1, "knowledge change"] = -50.0
    r = other.iloc[1]
    assert sweep.sentence(other).endswith(
        f", where the recipe's rate 0.001 reaches VQA 50.0 % with knowledge -50.0 [{signed(r['knowledge lo'])}, "
        f"{signed(r['knowledge hi'])}] pt and perplexity {r['perplexity change']:+.2f}")
    assert "no swept rate learned" in sweep.sentence(t.assign(learned=False))
    shown = sweep.display(t).frame
    assert list(shown.index.get_level_values("stage-2 lr")) == ["1e-05 (recipe)", "0.001"]
    assert shown["learned"].tolist() == ["no", "no"] and "majority %" in shown
    with pytest.raises(ParameterError, match="lrs"):
        sweep.run(lm, _params(), [], eval_n={}, seed=0, prompts=[], sink_kwargs={}, vqa_n=1)
    assert isinstance(t, pd.DataFrame)


def test_learned_at_says_which_rates_taught_the_task():
    assert sweep.learned_at([1e-5, 5e-5], [1e-5, 5e-5, 1e-4]) == \
        "learned the task at 2 of the 3 rates swept (1e-05, 5e-05; not at 0.0001)"
    assert sweep.learned_at([1e-5], [1e-5, 5e-5, 1e-4]) == \
        "learned the task at 1 of the 3 rates swept (1e-05; not at 5e-05 or 0.0001)"
    assert sweep.learned_at([1e-5, 5e-5], [1e-5, 5e-5]) == "learned the task at all 2 rates swept (1e-05, 5e-05)"
    assert sweep.learned_at([5e-5], [5e-5]) == "learned the task at the only rate swept (5e-05)"


def test_chapter_sweeps_each_model_and_checks_the_recipe_point(cache, monkeypatch):
    lm = _lm()
    pair = pairs.build_pair(lm, _params(), progress=False)
    seen = []

    def fake(lm_, p, condition, **kw):
        seen.append((condition, p.params["lr_lm"], kw["sink_kwargs"]))
        return {**_ev(len(seen), 0.5, 0.5, 0.5), "S": 0.0, "vqa": [0.75, 4] if condition == "vl" else None}
    monkeypatch.setattr(pairs, "evaluate_condition", fake)
    monkeypatch.setattr(pairs, "sink_settings", lambda model, k, t: {"last_k_layers": k, "max_tokens": t})
    lr = _params()["lr_lm"]
    t, gaps = sweep.chapter({"m": lm}, {"m": pair}, [lr, lr * 4], seed=0, image_size=48, eval_n={"knowledge": 4},
                            prompts=["a b"], vqa_n=4, last_k_layers=2, max_tokens=16)
    assert gaps == {"m": 0.0}  # the point at the recipe's rates is the pair's VL model, exactly
    assert list(t.recipe) == [True, False] and all(s[2] == {"last_k_layers": 2, "max_tokens": 16} for s in seen)
    _, gaps = sweep.chapter({"m": lm}, {"m": pair}, [lr * 4], seed=0, image_size=48, eval_n={"knowledge": 4},
                            prompts=["a b"], vqa_n=4, last_k_layers=2, max_tokens=16)
    assert gaps == {}  # no point at the recipe's rate: nothing to compare
